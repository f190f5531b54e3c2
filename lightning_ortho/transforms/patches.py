"""Image patches as training data for fast transforms (Rusu's experiments: 8x8 patches, each patch's own mean
removed).

Pure PyTorch; nothing here imports Lightning.
"""

from __future__ import annotations

import warnings

import torch

#: Channels past which a 3-d ``(C, H, W)`` input is more likely a stack of single-channel images ``(B, H, W)``
#: given by mistake (photographs have 1, 3 or 4 channels): :func:`image_patches` then warns.
MOST_CHANNELS = 4


def image_patches(
    images: torch.Tensor, size: int, *, stride: int | None = None, remove_mean: bool = True
) -> torch.Tensor:
    """Square ``size x size`` patches of images as rows ``Y`` ``(N, C*size*size)``, the learners' batch-first data.

    The paper's experiment takes a 512x512 image divided by 255, cuts it into non-overlapping
    8x8 patches (``n = 64``, ``N = 4096``) and removes each patch's own mean; ``image_patches(image, 8)`` of that
    image is its ``Y`` (the paper's ``n x N`` matrix, transposed).

    Layout:

    * ``images`` is ``(B, C, H, W)``, ``(C, H, W)`` (one image) or ``(H, W)`` (one single-channel image).
    * Patches start at rows and columns ``0, stride, 2*stride, ...`` while they fit: ``stride=None`` (= ``size``)
      gives non-overlapping patches; the ragged border (the last ``H % size`` rows and ``W % size`` columns when
      non-overlapping) is dropped. Each image gives ``((H - size) // stride + 1) * ((W - size) // stride + 1)``
      patches.
    * Rows are in row-major patch order: image, then patch row, then patch column.
    * Each patch is flattened channel-major, then row-major within a channel: entry ``c*size*size + i*size + j``
      of a row is pixel ``(c, top + i, left + j)``.
    * ``remove_mean`` subtracts from each row its own mean over all of its ``C*size*size`` entries (all channels
      together), so every row sums to zero.

    The result has the dtype and device of ``images`` (a new contiguous tensor; gradients flow through it).

    Args:
        images: ``(B, C, H, W)``, ``(C, H, W)`` or ``(H, W)`` floating-point images (see Layout).
        size: side of the square patches.
        stride: step between patch starts; ``None``: ``size`` (non-overlapping patches).
        remove_mean: subtract each row's own mean.

    Warns:
        UserWarning: a 3-d ``images`` with more than ``MOST_CHANNELS`` channels (likely ``(B, H, W)`` single-channel
            images, which ``images.unsqueeze(1)`` makes ``(B, 1, H, W)``).

    Raises:
        TypeError: ``images`` is not a floating-point tensor, or ``size``/``stride`` is not an int.
        ValueError: ``images`` is not 2-, 3- or 4-d, holds NaN or inf, ``size`` or ``stride`` is below 1, or
            ``size`` is larger than the images' height or width.
    """
    if not isinstance(images, torch.Tensor) or not images.is_floating_point():
        kind = f"a {images.dtype} tensor" if isinstance(images, torch.Tensor) else type(images).__name__
        raise TypeError(
            f"image_patches: images must be a floating-point tensor (scale integer pixels first, e.g. / 255), "
            f"got {kind}."
        )
    for name, value in (("size", size), ("stride", size if stride is None else stride)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"image_patches: {name} must be an int, got {type(value).__name__} {value!r}.")
        if value < 1:
            raise ValueError(f"image_patches: {name} must be at least 1, got {value}.")
    step = size if stride is None else stride
    if images.dim() not in (2, 3, 4):
        raise ValueError(
            f"image_patches: images must be (B, C, H, W), (C, H, W) or (H, W), got shape {tuple(images.shape)}."
        )
    if images.dim() == 2:
        batch = images.reshape(1, 1, *images.shape)
    elif images.dim() == 3:
        if images.shape[0] > MOST_CHANNELS:
            warnings.warn(
                f"image_patches: images of shape {tuple(images.shape)} are read as ONE image with "
                f"{images.shape[0]} channels (a 3-d tensor is (C, H, W)), so each patch row has "
                f"{images.shape[0] * size * size} entries. For {images.shape[0]} single-channel images pass "
                "images.unsqueeze(1), shape (B, 1, H, W).",
                UserWarning,
                stacklevel=2,
            )
        batch = images.unsqueeze(0)
    else:
        batch = images
    height, width = batch.shape[-2:]
    if size > height or size > width:
        raise ValueError(f"image_patches: patch size {size} is larger than the {height}x{width} images.")
    if not bool(torch.isfinite(batch).all()):
        raise ValueError("image_patches: images hold NaN or inf.")
    # (B, C, rows, cols, size, size) -> (B, rows, cols, C, size, size): image, row, col; then channel, i, j.
    windows = batch.unfold(2, size, step).unfold(3, size, step)
    count, channels, rows, cols = batch.shape[0], batch.shape[1], windows.shape[2], windows.shape[3]
    patches = windows.permute(0, 2, 3, 1, 4, 5).reshape(count * rows * cols, channels * size * size)
    if remove_mean:
        patches = patches - patches.mean(dim=1, keepdim=True)
    return patches.contiguous()
