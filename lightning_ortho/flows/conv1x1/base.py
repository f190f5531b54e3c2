"""What every invertible 1x1 convolution does, and the table from kind name to class."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, get_args

import torch

from lightning_ortho._deprecation import warn_deprecated
from lightning_ortho.flows.base import FlowLayer, check_images
from lightning_ortho.nn.newton import NewtonResult

Conv1x1Kind = Literal["plain", "lu", "householder", "aux", "aux_invertible"]

#: Every kind of 1x1 convolution, in the order of :data:`Conv1x1Kind`.
CONV1X1_KINDS: tuple[str, ...] = get_args(Conv1x1Kind)

#: Kind name -> class. A class joins the table where it is defined: ``class LUConv1x1(..., kind="lu")``.
CONV1X1: dict[str, type[Invertible1x1Conv]] = {}


def to_columns(x: torch.Tensor) -> torch.Tensor:
    """``(N, C, H, W) -> (N, C, H W)``: one column per pixel, a view (no copy) of a contiguous image."""
    return x.reshape(x.shape[0], x.shape[1], x.shape[2] * x.shape[3])  # explicit: an empty batch has no -1


def to_rows(x: torch.Tensor) -> torch.Tensor:
    """``(N, C, H, W) -> (N H W, C)``: one row per pixel."""
    return x.permute(0, 2, 3, 1).reshape(-1, x.shape[1])


def random_orthogonal(channels: int) -> torch.Tensor:
    """``(C, C)`` float32: a random orthogonal matrix (QR of a Gaussian, signs fixed), Glow's initialisation."""
    q, r = torch.linalg.qr(torch.randn(channels, channels, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


def conv1x1_class(kind: str) -> type[Invertible1x1Conv]:
    """The class of ``kind`` in :data:`CONV1X1`.

    Raises:
        ValueError: ``kind`` is not one of :data:`CONV1X1_KINDS` (the message names them).
    """
    if kind not in CONV1X1:
        raise ValueError(f"Invertible1x1Conv: kind must be one of {', '.join(CONV1X1_KINDS)}, got {kind!r}.")
    return CONV1X1[kind]


def invertible_1x1_conv(channels: int, kind: Conv1x1Kind = "lu") -> Invertible1x1Conv:
    """A ``kind`` 1x1 convolution of ``channels`` channels: ``CONV1X1[kind](channels)``, a subclass of
    :class:`Invertible1x1Conv` (shapes ``(N, C, H, W) -> ((N, C, H, W), (N,))``).

    Args:
        channels: ``C``, the channels of the images.
        kind: one of :data:`CONV1X1`: ``"plain"``, ``"lu"``, ``"householder"``, ``"aux"``, ``"aux_invertible"``.

    Raises:
        ValueError: unknown ``kind`` (the message names the choices), or ``channels`` not a positive integer.
    """
    return conv1x1_class(kind)(channels)


class _BuildsTheKind(type(FlowLayer)):
    """The metaclass of :class:`Invertible1x1Conv`: calling the base class itself, as ``Invertible1x1Conv(channels,
    kind="lu")`` built a layer before each kind had a class of its own, still builds the kind's layer, with a
    deprecation warning; calling a kind's class is an ordinary construction."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is not Invertible1x1Conv:
            return super().__call__(*args, **kwargs)
        return _deprecated_construction(*args, **kwargs)


def _deprecated_construction(channels: int, kind: Conv1x1Kind = "lu") -> Invertible1x1Conv:
    warn_deprecated(
        f"Invertible1x1Conv(channels, kind) is deprecated and will be removed in the next minor release; build the "
        f"layer with invertible_1x1_conv(channels, {kind!r}) or its class, {conv1x1_class(kind).__name__}(channels).",
        stacklevel=3,
    )
    return invertible_1x1_conv(channels, kind)


class Invertible1x1Conv(FlowLayer, metaclass=_BuildsTheKind):
    """``z_{:, i, j} = g(x_{:, i, j})`` for every pixel: an invertible map ``g`` of the ``C`` channels.

    The base class of the kinds: ``invertible_1x1_conv(channels, kind="lu")`` builds the class of ``kind`` (see
    :data:`CONV1X1`), so ``isinstance(layer, Invertible1x1Conv)`` holds for every kind:

    * ``"plain"``: :class:`PlainConv1x1`, ``W x`` with a dense ``W`` (Kingma & Dhariwal 2018).
    * ``"lu"``: :class:`LUConv1x1`, ``W = P L (U + diag(s))`` (Kingma & Dhariwal 2018).
    * ``"householder"``: :class:`HouseholderConv1x1`, a product of ``C`` reflections (Hoogeboom et al. 2019).
    * ``"aux"``: :class:`AuxConv1x1`, ``H(W x) x`` with an unconstrained ``W`` (One Reflection Suffice).
    * ``"aux_invertible"``: :class:`InvertibleAuxConv1x1`, ``H(W Q x) Q x`` with Theorem 2's ``W``.

    All start from a random orthogonal map, like Glow. Shapes: ``(N, C, H, W) -> (N, C, H, W)``, log-det
    ``(N,)``: ``log|det dz/dx| = sum over pixels of log|det J_g(x_{:, i, j})|``.

    A kind implements :meth:`forward_columns`, :meth:`inverse_columns` and :meth:`pixel_jacobian_signs` on pixels;
    this class does the image bookkeeping.

    Args:
        channels: ``C``, the channels of the images.

    Raises:
        TypeError: from every method taking images, for a non-floating tensor.

    ``Invertible1x1Conv(channels, kind="lu")``, the base class called itself (before each kind had its own class),
    still builds the kind's layer and warns
    :class:`~lightning_ortho.LightningOrthoDeprecationWarning` (removed in the next minor release).
        ValueError: from every method taking images, unless the shape is ``(N, C, H, W)`` with this layer's ``C``.
    """

    kind: ClassVar[str]

    def __init_subclass__(cls, kind: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if kind is None:  # an intermediate base class (linear, auxiliary): not a kind of its own
            return
        if kind not in CONV1X1_KINDS:
            raise TypeError(f"{cls.__name__}: kind {kind!r} is not in Conv1x1Kind; add it to that Literal first.")
        known = CONV1X1.get(kind)
        if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise TypeError(f"{cls.__name__}: kind {kind!r} already belongs to {known.__qualname__}.")
        cls.kind = kind
        CONV1X1[kind] = cls
        ordered = sorted(CONV1X1.items(), key=lambda item: CONV1X1_KINDS.index(item[0]))  # the Literal's order
        CONV1X1.clear()
        CONV1X1.update(ordered)

    def __init__(self, channels: int) -> None:
        super().__init__()
        if not isinstance(channels, int) or isinstance(channels, bool) or channels < 1:
            raise ValueError(f"{type(self).__name__}: channels must be a positive integer, got {channels!r}.")
        self.channels = channels

    # ----------------------------------------------------------------- what a kind implements, on pixels

    def forward_columns(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # pragma: no cover
        """``(N, C, P) -> ((N, C, P), (N,))``: ``g`` on every pixel column and the summed log-determinant."""
        raise NotImplementedError

    def inverse_columns(
        self, y: torch.Tensor, *, tol: float | None = None, max_iter: int = 50
    ) -> tuple[torch.Tensor, NewtonResult | None]:  # pragma: no cover
        """``(N, C, P) -> ((N, C, P), result)``: ``g^{-1}`` on every column, and the per-pixel
        :class:`~lightning_ortho.nn.NewtonResult` where the inverse is iterative (``None`` where it is exact;
        ``tol`` and ``max_iter`` only matter there). Does not raise on non-convergence."""
        raise NotImplementedError

    def pixel_jacobian_signs(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        """``(P, C) -> (P,)``: ``sign det J_g(x_p)`` (-1, 0 or 1) for pixel vectors stored as rows."""
        raise NotImplementedError

    # ----------------------------------------------------------------- FlowLayer on images

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(N, C, H, W) -> ((N, C, H, W), (N,))``: ``z`` and ``log|det dz/dx|`` per sample."""
        check_images(x, self.channels, type(self).__name__)
        y, log_abs_det = self.forward_columns(to_columns(x))
        return y.reshape(x.shape), log_abs_det

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        """``(N, C, H, W) -> (N, C, H, W)``: ``x`` with ``forward(x)[0] == y``.

        Raises:
            NewtonInverseError: an iterative inverse did not converge (see :meth:`inverse_with_result`).
        """
        return self.inverse_with_result(y)[0]

    def inverse_with_result(
        self, y: torch.Tensor, *, tol: float | None = None, max_iter: int = 50, raise_on_failure: bool = True
    ) -> tuple[torch.Tensor, NewtonResult | None]:
        """``(x, result)``: the inverse and, for the auxiliary kinds, the per-pixel :class:`NewtonResult`
        (iterations, residual, converged; shapes ``(N, H W)``); ``None`` for the linear kinds.

        Raises:
            NewtonInverseError: some pixel did not converge and ``raise_on_failure`` (else it is flagged in
                ``result.converged`` and ``x`` holds the last iterate there).
        """
        check_images(y, self.channels, f"{type(self).__name__}.inverse")
        x, result = self.inverse_columns(to_columns(y), tol=tol, max_iter=max_iter)
        if result is not None and raise_on_failure:
            result.raise_if_failed(type(self).__name__)
        return x.reshape(y.shape), result

    @torch.no_grad()
    def jacobian_signs(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, C, H, W) -> (N, H, W)``: ``sign det J_g(x_{:, i, j})`` at every pixel (-1, 0 or 1)."""
        check_images(x, self.channels, f"{type(self).__name__}.jacobian_signs")
        return self.pixel_jacobian_signs(to_rows(x)).reshape(x.shape[0], x.shape[2], x.shape[3])

    @torch.no_grad()
    def jacobian_sign_flips(self, x: torch.Tensor) -> float:
        """Fraction of the pixels of ``x`` ``(N, C, H, W)`` where ``sign det J_g`` differs from the majority.

        ``min(p, 1 - p)`` with ``p`` the fraction of pixels where ``det J_g > 0`` (an exact zero counts as not
        positive). ``det J_g`` is continuous away from ``W x = 0``, so a nonzero fraction means it vanishes
        somewhere: Theorem 4's sufficient condition for invertibility fails, and Newton may return a
        different preimage. ``0.0`` is necessary, not sufficient, for invertibility; always ``0.0`` for a
        linear kind.
        """
        positive = float((self.jacobian_signs(x) > 0).double().mean())
        return min(positive, 1.0 - positive)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, kind={self.kind!r}"
