import warnings

import pytest
import torch

from lightning_ortho.transforms.patches import image_patches


def loop_patches(images: torch.Tensor, size: int, step: int, remove_mean: bool) -> torch.Tensor:
    """Reference from the documented layout, one scalar at a time: images (B, C, H, W); rows in the order image,
    patch row, patch column; entries channel, then row, then column; each row's mean over all its entries."""
    rows = []
    batch, channels, height, width = images.shape
    for b in range(batch):
        for top in range(0, height - size + 1, step):
            for left in range(0, width - size + 1, step):
                row = [
                    float(images[b, c, top + i, left + j])
                    for c in range(channels)
                    for i in range(size)
                    for j in range(size)
                ]
                if remove_mean:
                    mean = sum(row) / len(row)
                    row = [value - mean for value in row]
                rows.append(row)
    return torch.tensor(rows, dtype=torch.float64).reshape(len(rows), channels * size * size)


@pytest.mark.parametrize("stride", [None, 1, 3, 5])
@pytest.mark.parametrize("remove_mean", [True, False])
def test_matches_loop_reference_in_float64(stride, remove_mean):
    images = torch.rand(2, 3, 11, 13, dtype=torch.float64)
    got = image_patches(images, 4, stride=stride, remove_mean=remove_mean)
    expected = loop_patches(images, 4, stride or 4, remove_mean)
    assert got.dtype == torch.float64 and got.is_contiguous()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-14)


def test_paper_setting_512_image_gives_4096_patches_of_64_with_zero_mean():
    image = torch.rand(512, 512)
    patches = image_patches(image, 8)
    assert patches.shape == (4096, 64) and patches.dtype == torch.float32
    torch.testing.assert_close(patches.mean(dim=1), torch.zeros(4096), rtol=0, atol=1e-6)
    first = image[:8, :8].flatten()  # row-major inside the patch
    torch.testing.assert_close(patches[0], first - first.mean())
    second = image[:8, 8:16].flatten()  # next patch to the right, not below
    torch.testing.assert_close(patches[1], second - second.mean())
    below = image[8:16, :8].flatten()  # patch row 1 starts after the 64 patches of row 0
    torch.testing.assert_close(patches[64], below - below.mean())


def test_entry_index_is_channel_then_row_then_column():
    b, c, y, x = torch.meshgrid(torch.arange(2), torch.arange(2), torch.arange(6), torch.arange(9), indexing="ij")
    code = (1000 * b + 100 * c + 10 * y + x).double()  # every pixel names its own coordinates
    patches = image_patches(code, 3, remove_mean=False)
    assert patches.shape == (2 * 2 * 3, 2 * 9)
    # image 1, patch row 1, patch column 2: top = 3, left = 6; entry c*9 + i*3 + j is pixel (c, 3 + i, 6 + j)
    row = patches[1 * 6 + 1 * 3 + 2]
    for ch in range(2):
        for i in range(3):
            for j in range(3):
                assert row[ch * 9 + i * 3 + j] == 1000 + 100 * ch + 10 * (3 + i) + (6 + j)


def test_ragged_border_is_dropped():
    image = torch.rand(1, 10, 11)
    patches = image_patches(image, 4, remove_mean=False)
    assert patches.shape == (4, 16)
    changed = image.clone()
    changed[:, 8:, :] = 5.0  # the last 10 % 4 = 2 rows
    changed[:, :, 8:] = -5.0  # the last 11 % 4 = 3 columns
    torch.testing.assert_close(image_patches(changed, 4, remove_mean=False), patches, rtol=0, atol=0)


def test_patch_count_formula_with_stride():
    for height, width, size, stride in [(9, 9, 3, 2), (10, 7, 4, 3), (8, 8, 8, 1), (5, 12, 1, 4)]:
        count = ((height - size) // stride + 1) * ((width - size) // stride + 1)
        assert image_patches(torch.rand(height, width), size, stride=stride).shape == (count, size * size)


def test_mean_is_removed_over_all_channels_together():
    image = torch.stack([torch.ones(4, 4), torch.zeros(4, 4)]).double()  # channel 0 all 1, channel 1 all 0
    patches = image_patches(image, 2)
    # per-channel removal would give zeros; one mean over both channels leaves +-1/2
    expected = torch.tensor([0.5] * 4 + [-0.5] * 4, dtype=torch.float64).expand(4, 8)
    torch.testing.assert_close(patches, expected, rtol=0, atol=0)


def test_batch_dims_are_equivalent_and_dtype_is_kept():
    image = torch.rand(7, 9, dtype=torch.float64)
    plain = image_patches(image, 3)
    torch.testing.assert_close(image_patches(image[None], 3), plain, rtol=0, atol=0)
    torch.testing.assert_close(image_patches(image[None, None], 3), plain, rtol=0, atol=0)
    assert image_patches(image.to(torch.bfloat16), 3).dtype == torch.bfloat16


def test_gradient_counts_how_many_patches_cover_each_pixel():
    image = torch.rand(5, 6, requires_grad=True)
    image_patches(image, 3, stride=1, remove_mean=False).sum().backward()
    rows = torch.tensor([1, 2, 3, 2, 1]).reshape(5, 1).float()  # windows start at rows 0, 1, 2
    cols = torch.tensor([1, 2, 3, 3, 2, 1]).reshape(1, 6).float()  # at columns 0..3
    torch.testing.assert_close(image.grad, rows * cols)


@pytest.mark.parametrize(
    "images,size,stride,error,match",
    [
        (torch.zeros(8, 8, dtype=torch.uint8), 4, None, TypeError, "floating-point"),
        (torch.zeros(8, 8, dtype=torch.long), 4, None, TypeError, "floating-point"),
        ([[0.0] * 8] * 8, 4, None, TypeError, "floating-point"),
        (torch.zeros(8), 4, None, ValueError, r"\(B, C, H, W\)"),
        (torch.zeros(1, 1, 1, 8, 8), 4, None, ValueError, r"\(B, C, H, W\)"),
        (torch.zeros(8, 8), 0, None, ValueError, "size must be at least 1"),
        (torch.zeros(8, 8), 2.0, None, TypeError, "size must be an int"),
        (torch.zeros(8, 8), True, None, TypeError, "size must be an int"),
        (torch.zeros(8, 8), 4, 0, ValueError, "stride must be at least 1"),
        (torch.zeros(8, 8), 4, 1.5, TypeError, "stride must be an int"),
        (torch.zeros(8, 6), 7, None, ValueError, "larger than the 8x6 images"),
        (torch.tensor([[0.0, float("nan")], [0.0, 0.0]]), 1, None, ValueError, "NaN"),
        (torch.tensor([[0.0, float("inf")], [0.0, 0.0]]), 1, None, ValueError, "inf"),
    ],
)
def test_errors(images, size, stride, error, match):
    with pytest.raises(error, match=match):
        image_patches(images, size, stride=stride)


def test_a_stack_of_single_channel_images_given_as_one_image_is_warned_about():
    images = torch.rand(9, 8, 8)  # 9 digits, (B, H, W): read as one 9-channel image
    with pytest.warns(UserWarning, match=r"ONE image with 9 channels.*images\.unsqueeze\(1\)"):
        rows = image_patches(images, 4)
    assert rows.shape == (4, 9 * 16)
    assert image_patches(images.unsqueeze(1), 4).shape == (36, 16)  # what the user meant
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        image_patches(torch.rand(3, 8, 8), 4)  # an RGB image: no warning
