"""Orthogonal weights on any module: ``orthogonal(module, "weight")`` registers a ``torch.nn.utils.parametrize``
parametrisation that keeps the weight's rows or columns orthonormal while the optimiser works on free coordinates."""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import nn
from torch.nn.utils import parametrize

from lightning_ortho.nn.stiefel import (
    cayley_coordinates,
    cayley_stiefel,
    exp_coordinates,
    exp_stiefel,
    householder_stiefel,
    orthonormality_error,
    orthonormalize_,
    project_to_stiefel,
    sample_haar_stiefel,
    stiefel_coordinates,
)

WeightMap = Literal["householder", "cayley", "matrix_exp"]
Initialisation = Literal["keep", "haar", "identity", "torus_henaff", "torus_cayley"]
View = Literal["matrix", "kernel", "gates"]

#: The maps :func:`orthogonal` builds (read from :data:`WeightMap`).
WEIGHT_MAPS: tuple[str, ...] = get_args(WeightMap)
#: The initialisations :func:`orthogonal` accepts.
INITIALISATIONS: tuple[str, ...] = get_args(Initialisation)
#: The torus initialisations of expRNN: the 2 x 2 rotation angles they draw
TORUS_INITIALISATIONS: tuple[str, ...] = ("torus_henaff", "torus_cayley")


class OrthogonalWeight(nn.Module):
    """The parametrisation :func:`orthogonal` registers: ``weight = Q(X)``, with ``X`` the free coordinates that the
    optimiser updates (``parametrizations.<name>.original``).

    The weight is read as matrices ``(..., rows, columns)`` (``view``):

    * ``"matrix"``: its last two dims (a ``Linear`` weight ``(out, in)``; any tensor ``(..., n, k)``, the leading
      dims a batch of matrices);
    * ``"kernel"``: a convolution's kernel ``(out, in / groups, *kernel_size)`` as the matrix
      ``(out, in / groups * prod(kernel_size))``, the map of a filter over its whole receptive field;
    * ``"gates"``: a recurrent layer's ``(gates * hidden, columns)`` weight as ``gates`` blocks ``(hidden, columns)``
      (one orthogonal matrix per gate of an LSTM or GRU).

    Each matrix gets orthonormal columns where it has at least as many rows as columns (``Q^H Q = I``), else
    orthonormal rows (``Q Q^H = I``), as ``torch.nn.utils.parametrizations.orthogonal`` does; complex weights get
    unitary ones. ``X`` is stored as the tall matrices ``(..., n, k)`` (the transpose of a wide weight's). The maps
    (:mod:`lightning_ortho.nn.stiefel`), each ``O(n k^2 + k^3)`` for a tall ``(n, k)`` matrix, never an ``n x n``
    one:

    * ``"householder"``: ``Q = H_1 ... H_k E_k D``, ``k`` Householder reflections and a diagonal of signs (phases);
      it reaches every matrix with orthonormal columns.
    * ``"cayley"``, ``"matrix_exp"``: ``Q = (I - W/2)^{-1} (I + W/2) B`` or ``exp(W) B`` with ``W`` the rank-``2k``
      skew(-Hermitian) matrix of the tangent vector ``X`` at the base ``B`` (a buffer with orthonormal columns;
      ``X = 0`` is ``B``). Assigning a weight makes it the base (``X = 0``); :func:`update_base_` moves the base to
      the current weight (dynamic trivialisation, as expRNN's ``dtriv``). After a change of dtype and after
      ``load_state_dict`` a base that is not orthonormal to ``10 n eps`` of its dtype is replaced by its nearest
      orthonormal matrix (the polar factor), so ``.double()`` gives a weight orthogonal to float64 precision.

    With ``use_trivialization=False`` the Cayley and exponential maps have no base: ``X`` is read in the fixed
    identity frame ``E_k`` (static trivialisation, PyTorch's ``use_trivialization=False``; nothing but ``X`` in the
    ``state_dict``). Assigning a weight then stores its coordinates in that frame
    (:func:`~lightning_ortho.nn.stiefel.cayley_coordinates`, :func:`~lightning_ortho.nn.stiefel.exp_coordinates`),
    which exist where ``-1`` is not an eigenvalue of the weight's top ``k x k`` block: a real square weight must have
    determinant ``+1`` (the maps from the identity reach ``SO(n)`` only). The exponential's inverse is known for
    square weights and for tall ones ``[R; 0]`` (the identity and torus initialisations) only.

    Args:
        shape: the weight's shape.
        view: how the weight is read as matrices (above).
        gates: the number of gates of a ``"gates"`` view (3 for a GRU, 4 for an LSTM).
        map: the map from coordinates to orthonormal matrices: ``"householder"``, ``"cayley"`` or ``"matrix_exp"``.
        project: what assigning a weight that is not orthogonal does (``module.weight = W``, or ``right_inverse``):
            ``False`` refuses with a ``ValueError``, ``True`` takes its orthonormal factor (QR, the signs of ``R``'s
            diagonal moved into ``Q``), as PyTorch and geotorch do without asking.
        use_trivialization: ``True``: a base point (dynamic trivialisation); ``False``: the identity frame (above).
            Householder coordinates need no base either way.

    Raises:
        ValueError: an unknown ``map`` or ``view``, or a shape the view cannot read (``"gates"`` whose rows are not a
            multiple of the gates).
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        *,
        view: View = "matrix",
        gates: int = 1,
        map: WeightMap = "householder",
        project: bool = False,
        use_trivialization: bool = True,
    ) -> None:
        super().__init__()
        if map not in WEIGHT_MAPS:
            raise ValueError(f"OrthogonalWeight: unknown map {map!r}; choose one of {', '.join(WEIGHT_MAPS)}.")
        if view not in get_args(View):
            raise ValueError(f"OrthogonalWeight: unknown view {view!r}; choose one of {', '.join(get_args(View))}.")
        shape = tuple(int(size) for size in shape)
        if len(shape) < 2:
            raise ValueError(f"OrthogonalWeight: a weight of at least two dims is needed, got shape {shape}.")
        if view == "gates" and (gates < 1 or shape[0] % gates):
            raise ValueError(f"OrthogonalWeight: {shape[0]} rows are not {gates} gates of equal size.")
        self.shape, self.view, self.gates, self.map, self.project = shape, view, gates, map, bool(project)
        self.use_trivialization = bool(use_trivialization)
        rows, columns = self._matrix_shape()[-2:]
        self.transposed = rows < columns
        self.register_buffer("base", None)  # the base point of "cayley" and "matrix_exp", set by right_inverse
        self.register_load_state_dict_post_hook(_orthonormalize_base_after_loading)  # (a function: picklable)

    @property
    def has_base(self) -> bool:
        """Whether the map has a base point (``"cayley"``, ``"matrix_exp"`` with ``use_trivialization``)."""
        return self.map != "householder" and self.use_trivialization

    @property
    def frame_only(self) -> bool:
        """Whether the map reads its coordinates in the fixed identity frame (``"cayley"``, ``"matrix_exp"``
        without ``use_trivialization``), where it reaches only matrices without ``-1`` as an eigenvalue of their top
        block."""
        return self.map != "householder" and not self.use_trivialization

    def _matrix_shape(self) -> tuple[int, ...]:
        """The weight as matrices ``(..., rows, columns)``, before any transpose."""
        shape = self.shape
        if self.view == "kernel":
            return (shape[0], math.prod(shape[1:]))
        if self.view == "gates":
            return (self.gates, shape[0] // self.gates, *shape[1:])
        return shape

    def as_matrices(self, weight: torch.Tensor) -> torch.Tensor:
        """The weight ``(*shape)`` as the matrices this parametrisation keeps orthogonal, ``(..., rows, columns)``
        (a kernel's ``(out, in * k)``, a gate's block; not transposed)."""
        return weight.reshape(self._matrix_shape())

    def _tall(self, weight: torch.Tensor) -> torch.Tensor:
        """The weight as tall matrices ``(..., n, k)``, ``n >= k``."""
        matrices = self.as_matrices(weight)
        return matrices.mT if self.transposed else matrices

    def _weight(self, tall: torch.Tensor) -> torch.Tensor:
        """Tall matrices back to the weight's shape."""
        return (tall.mT if self.transposed else tall).reshape(self.shape)

    def forward(self, coordinates: torch.Tensor) -> torch.Tensor:
        """The weight ``(*shape)`` with orthonormal rows or columns, from the coordinates ``(..., n, k)``."""
        return self._weight(self.forward_tall(coordinates))

    @torch.no_grad()
    def right_inverse(self, weight: torch.Tensor) -> torch.Tensor:
        """The coordinates of ``weight`` (what ``module.<name> = weight`` stores).

        Raises:
            TypeError: ``weight`` is not floating point or complex.
            ValueError: ``weight`` has another shape, or is not orthogonal (its rows or columns not orthonormal to
                ``100 n eps`` of its dtype) and ``project`` is false: the message says how far off it is; or, with
                ``use_trivialization=False``, a weight the identity frame's map does not reach.
        """
        if not isinstance(weight, torch.Tensor) or not (weight.is_floating_point() or weight.is_complex()):
            kind = weight.dtype if isinstance(weight, torch.Tensor) else type(weight).__name__
            raise TypeError(f"OrthogonalWeight: the weight must be a floating-point or complex tensor, got {kind}.")
        if tuple(weight.shape) != self.shape:
            raise ValueError(f"OrthogonalWeight: expected a weight of shape {self.shape}, got {tuple(weight.shape)}.")
        tall = self._tall(weight)
        if weight.device.type == "meta":  # deferred initialisation: shapes only
            if self.has_base:
                self.base = torch.empty_like(tall)
            return torch.zeros_like(tall) if self.map != "householder" else torch.empty_like(tall)
        n = tall.shape[-2]
        tolerance = 100 * n * torch.finfo(weight.dtype).eps
        error = float(orthonormality_error(tall))
        if not error <= tolerance:
            if not self.project:
                side = "rows" if self.transposed else "columns"
                raise ValueError(
                    f"OrthogonalWeight: the weight's {side} are not orthonormal (max |Q^H Q - I| = {error:.2e} >"
                    f" {tolerance:.1e}). Pass project=True to orthogonal() to take its orthonormal factor (QR), or"
                    " assign an orthogonal matrix."
                )
            tall = project_to_stiefel(tall)
        if self.has_base:  # the weight becomes the base point: the coordinates are zero
            self.base = tall.detach().clone().contiguous()
            return torch.zeros_like(tall)
        if self.frame_only:
            return self._frame_coordinates(tall, tolerance)
        return stiefel_coordinates(tall)

    def _frame_coordinates(self, tall: torch.Tensor, tolerance: float) -> torch.Tensor:
        """The coordinates of ``tall`` in the identity frame, checked by mapping them back."""
        n, k = tall.shape[-2:]
        if self.map == "cayley" or n == k or float(tall[..., k:, :].abs().amax()) <= tolerance:
            try:
                if self.map == "cayley":
                    coordinates = cayley_coordinates(tall)
                else:  # [R; 0] = exp([[A, 0], [0, 0]]) E_k with A = log R (the identity and torus inits are such)
                    top = exp_coordinates(tall[..., :k, :])
                    coordinates = torch.cat((top, torch.zeros_like(tall[..., k:, :])), dim=-2)
            except torch.linalg.LinAlgError:  # I + Q_1 exactly singular: out of reach, said below
                coordinates = torch.full_like(tall, math.nan)
        else:
            raise ValueError(
                f"OrthogonalWeight: map='matrix_exp' with use_trivialization=False cannot take this weight of shape"
                f" {self.shape}:"
                " the exponential's inverse in the identity frame is known only where the rows below the first"
                f" {k} are zero. Use init='identity' or a torus init, use_trivialization=True (the weight becomes the"
                " base point), or map='cayley'."
            )
        error = float((self.forward_tall(coordinates) - tall).abs().amax()) if tall.numel() else 0.0
        # near the edge of the reach (an eigenvalue close to -1) the coordinates grow like 1 / (1 + cos theta) and the
        # round trip loses digits: the weight is still reached, to sqrt(eps), and still orthogonal to eps; only a
        # miss by more (O(1), or NaN where I + Q_1 is singular) is out of reach
        if not error <= max(tolerance, math.sqrt(torch.finfo(tall.dtype).eps)):
            raise ValueError(
                f"OrthogonalWeight: the {self.map!r} map from the identity frame (use_trivialization=False) does not"
                f" reach this weight (mapped back it is {error:.1e} off): -1 is an eigenvalue of its top {k} x {k}"
                " block, as for every real square weight of determinant -1. Use use_trivialization=True (the"
                " default), map='householder', or flip the sign of one of its rows."
            )
        return coordinates

    def forward_tall(self, coordinates: torch.Tensor) -> torch.Tensor:
        """The map on tall matrices: coordinates ``(..., n, k)`` to orthonormal columns ``(..., n, k)``."""
        if self.map == "householder":
            return householder_stiefel(coordinates)
        stiefel = cayley_stiefel if self.map == "cayley" else exp_stiefel
        return stiefel(coordinates, self.base)

    def _apply(self, fn, recurse: bool = True):
        dtype = None if self.base is None else self.base.dtype
        result = super()._apply(fn, recurse)
        if self.base is not None and self.base.dtype != dtype:
            self.orthonormalize_base_()
        return result

    def orthonormalize_base_(self) -> None:
        """Replace the base by its polar factor where it is not orthonormal to its dtype's precision
        (:func:`~lightning_ortho.nn.stiefel.orthonormalize_`)."""
        if self.base is not None:
            orthonormalize_(self.base)

    def extra_repr(self) -> str:
        rows, columns = self._matrix_shape()[-2:]
        side = "rows" if self.transposed else "columns"
        frame = ", use_trivialization=False" if self.frame_only else ""
        return (
            f"shape={self.shape}, view={self.view!r}, map={self.map!r}{frame}, orthonormal {side} of ({rows},"
            f" {columns})"
        )


def _orthonormalize_base_after_loading(parametrization: OrthogonalWeight, _incompatible_keys) -> None:
    parametrization.orthonormalize_base_()


def orthogonal(
    module: nn.Module,
    name: str = "weight",
    *,
    map: WeightMap = "householder",
    init: Initialisation = "keep",
    project: bool = False,
    use_trivialization: bool = True,
    generator: torch.Generator | None = None,
) -> nn.Module:
    """Make ``module.<name>`` orthogonal: register an :class:`OrthogonalWeight` parametrisation on it
    (``torch.nn.utils.parametrize``) and return ``module``.

    The weight keeps its shape, dtype and device; its rows or columns are orthonormal (the shorter side), unitary
    for a complex weight. A ``Conv1d/2d/3d`` kernel is read as ``(out, in / groups * prod(kernel_size))``, an
    ``RNN``/``GRU``/``LSTM`` input or recurrent weight as one block per gate, anything else as matrices over its last
    two dims. The optimiser then updates ``module.parametrizations.<name>.original``; ``parametrize.cached()`` builds
    the weight once for many uses, and ``parametrize.remove_parametrizations(module, name)`` leaves the current
    orthogonal weight as a plain parameter.

    Args:
        module: any module with a floating-point or complex parameter ``name`` of at least two dims.
        name: the parameter.
        map: ``"householder"`` (Householder reflections and column signs), ``"cayley"`` or ``"matrix_exp"`` (around
            a base point, see :func:`update_base_`); see :class:`OrthogonalWeight`.
        init: ``"keep"``: the weight's own orthonormal factor (QR; the weight itself where it is orthogonal
            already); ``"haar"``: a uniformly random orthogonal weight (:func:`sample_haar_`); ``"identity"``: the
            first rows or columns of the identity in every matrix; ``"torus_henaff"``, ``"torus_cayley"``: expRNN's
            initialisations, ``E_k exp(A)`` with ``A`` block diagonal of ``2 x 2`` blocks ``[[0, s], [-s, 0]]``
            (rotations by ``s``), ``s`` uniform on ``(-pi, pi)`` (Henaff et al. 2016) or ``s = -tan(t / 2)`` with
            ``t`` uniform on ``(0, pi / 2)`` (Helfrich et al. 2018), and for ``"cayley"`` and ``"matrix_exp"`` the
            base point at the identity frame with ``A`` in the coordinates, as expRNN starts.
        project: whether a non-orthogonal weight assigned later (``module.<name> = W``) is projected (QR) or
            refused with a ``ValueError`` that names this option.
        use_trivialization: ``False`` gives ``"cayley"`` and ``"matrix_exp"`` no base point (PyTorch's option of
            that name; see :class:`OrthogonalWeight`): a real square weight of determinant ``-1`` is then out of
            reach, so ``init="haar"`` samples the determinant ``+1`` half, and ``"keep"`` of such a weight raises.
        generator: the generator of ``init="haar"`` and of the torus initialisations.

    Raises:
        ValueError: ``name`` is not a parameter of ``module`` (or is already parametrised), an unknown ``map`` or
            ``init``, a weight of fewer than two dims, or (``use_trivialization=False``) a weight the map does not
            reach (the message says what to do).
        TypeError: an integer weight.
    """
    if init not in INITIALISATIONS:
        raise ValueError(f"orthogonal: unknown init {init!r}; choose one of {', '.join(INITIALISATIONS)}.")
    if parametrize.is_parametrized(module, name):
        raise ValueError(
            f"orthogonal: {type(module).__name__}.{name} is already parametrised; remove that first"
            f" (torch.nn.utils.parametrize.remove_parametrizations(module, {name!r}))."
        )
    weight = getattr(module, name, None)
    if not isinstance(weight, nn.Parameter):
        raise ValueError(f"orthogonal: {type(module).__name__} has no parameter {name!r}.")
    if not (weight.is_floating_point() or weight.is_complex()):
        raise TypeError(f"orthogonal: {type(module).__name__}.{name} is {weight.dtype}; it must be floating point.")
    view, gates = _view_of(module, name, weight)
    parametrization = OrthogonalWeight(
        tuple(weight.shape), view=view, gates=gates, map=map, project=project, use_trivialization=use_trivialization
    )
    real = weight.device.type != "meta"
    with torch.no_grad():
        if real:
            tall = parametrization._tall(weight)
            if init == "keep":
                start = project_to_stiefel(tall)  # (an orthonormal weight is its own factor, to rounding)
            elif init == "haar":
                start = _haar_sample(parametrization, tall, generator)
            else:  # identity; a torus init starts there and then sets the coordinates
                start = _identity_like(tall)
            weight.copy_(parametrization._weight(start))
    parametrize.register_parametrization(module, name, parametrization)
    if real and init in TORUS_INITIALISATIONS:
        with torch.no_grad():
            original = getattr(module.parametrizations, name).original
            original.copy_(_torus_coordinates(parametrization, original, init, generator))
    return module


@torch.no_grad()
def sample_haar_(module: nn.Module, name: str = "weight", generator: torch.Generator | None = None) -> nn.Module:
    """Set the orthogonal ``module.<name>`` (registered by :func:`orthogonal`) to a uniformly random (Haar)
    orthogonal weight, in place; returns ``module``.

    Raises:
        ValueError: ``module.<name>`` is not an orthogonal weight of :func:`orthogonal`.
    """
    parametrization = _orthogonal_weight(module, name, "sample_haar_")
    original = getattr(module.parametrizations, name).original  # the coordinates, (..., n, k)
    # assigned as a weight: the map's own right_inverse stores it (a base point, or coordinates)
    setattr(module, name, parametrization._weight(_haar_sample(parametrization, original, generator)))
    return module


@torch.no_grad()
def update_base_(module: nn.Module, name: str = "weight") -> nn.Module:
    """Move the base point of the orthogonal ``module.<name>`` (``map="cayley"`` or ``"matrix_exp"``) to the
    current weight and set its coordinates to zero, in place: the weight does not change, and the next steps start
    from a map around it (dynamic trivialisation, Lezcano-Casado 2019: call it every ``K`` steps, or when the
    coordinates have grown large). An optimiser's moments of the coordinates are left as they are. Returns
    ``module``.

    Raises:
        ValueError: ``module.<name>`` is not an orthogonal weight of :func:`orthogonal`, or its map has no base
            point (``"householder"``).
    """
    parametrization = _orthogonal_weight(module, name, "update_base_")
    if not parametrization.has_base:
        how = (
            "it was registered with use_trivialization=False; register it with use_trivialization=True"
            if parametrization.frame_only
            else "use map='cayley' or 'matrix_exp'"
        )
        raise ValueError(
            f"update_base_: the {parametrization.map!r} map of {type(module).__name__}.{name} has no base point;"
            f" {how} for dynamic trivialisation."
        )
    original = getattr(module.parametrizations, name).original
    stiefel = cayley_stiefel if parametrization.map == "cayley" else exp_stiefel
    parametrization.base.copy_(stiefel(original, parametrization.base))
    parametrization.orthonormalize_base_()
    original.zero_()
    return module


def _orthogonal_weight(module: nn.Module, name: str, where: str) -> OrthogonalWeight:
    if parametrize.is_parametrized(module, name):
        for parametrization in getattr(module.parametrizations, name):
            if isinstance(parametrization, OrthogonalWeight):
                return parametrization
    raise ValueError(f"{where}: {type(module).__name__}.{name} is not an orthogonal weight; call orthogonal() first.")


def _view_of(module: nn.Module, name: str, weight: torch.Tensor) -> tuple[View, int]:
    """How :func:`orthogonal` reads ``module.<name>`` as matrices, and the gates of a recurrent weight."""
    if weight.dim() < 2:
        raise ValueError(
            f"orthogonal: {type(module).__name__}.{name} has shape {tuple(weight.shape)}; an orthogonal weight needs"
            " at least two dims."
        )
    if isinstance(module, nn.modules.conv._ConvNd) and name == "weight":
        return "kernel", 1
    if isinstance(module, nn.RNNBase) and name.startswith(("weight_ih", "weight_hh")):
        return "gates", weight.shape[0] // module.hidden_size
    return "matrix", 1


def _haar_sample(
    parametrization: OrthogonalWeight, tall: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """A Haar sample in the shape of ``tall`` ``(..., n, k)``; for a map from the identity frame and real square
    matrices, of the half it reaches (``SO(n)``: the first column's sign flipped where the determinant is ``-1``,
    a bijection from the other half, so the sample is Haar on ``SO(n)``)."""
    sample = sample_haar_stiefel(tuple(tall.shape), dtype=tall.dtype, device=tall.device, generator=generator)
    n, k = tall.shape[-2:]
    if parametrization.frame_only and n == k and not sample.is_complex() and sample.numel():
        sign = torch.linalg.det(sample.double()).sign().to(sample.dtype)
        sample[..., :, 0] *= sign.unsqueeze(-1)
    return sample


def _torus_coordinates(
    parametrization: OrthogonalWeight, original: torch.Tensor, init: str, generator: torch.Generator | None
) -> torch.Tensor:
    """The coordinates ``(..., n, k)`` of a torus initialisation (see :func:`orthogonal`): the weight ``E_k exp(A)``
    with ``A`` ``(..., k, k)`` block diagonal, ``[[0, s_j], [-s_j, 0]]`` for ``j < k // 2`` (a last ``1 x 1``
    block of zero where ``k`` is odd); for the Cayley and exponential maps, the base point is the identity frame."""
    n, k = original.shape[-2:]
    angles = torch.rand(
        (*original.shape[:-2], k // 2), dtype=torch.float64, device=original.device, generator=generator
    )
    if init == "torus_henaff":
        angles = math.pi * (2 * angles - 1)  # uniform on (-pi, pi)
    else:  # Helfrich et al.: s = -sqrt((1 - cos t) / (1 + cos t)) = -tan(t / 2), t uniform on (0, pi / 2)
        angles = -torch.tan(math.pi / 4 * angles)
    even = torch.arange(0, 2 * (k // 2), 2, device=original.device)

    def blocks(values: torch.Tensor) -> torch.Tensor:
        """``(..., k, k)`` with ``values`` at (2j, 2j+1) and their negatives at (2j+1, 2j), zero elsewhere."""
        matrix = torch.zeros((*original.shape[:-2], k, k), dtype=torch.float64, device=original.device)
        matrix[..., even, even + 1] = values
        matrix[..., even + 1, even] = -values
        return matrix

    if parametrization.map == "householder":  # the rotation itself, then its Householder coordinates
        rotation = torch.eye(k, dtype=torch.float64, device=original.device).expand(blocks(angles).shape).clone()
        rotation[..., even, even] = rotation[..., even + 1, even + 1] = torch.cos(angles)
        rotation[..., even, even + 1] = torch.sin(angles)
        rotation[..., even + 1, even] = -torch.sin(angles)
        tall = torch.cat((rotation, rotation.new_zeros((*rotation.shape[:-2], n - k, k))), dim=-2)
        return stiefel_coordinates(tall.to(original.dtype))
    # (the base point, where there is one, is the identity frame already: the weight started there)
    # exp([[0, s], [-s, 0]]) is the rotation by s, and so is the Cayley transform of [[0, 2 tan(s/2)], ...]
    log = blocks(angles if parametrization.map == "matrix_exp" else 2 * torch.tan(angles / 2))
    coordinates = torch.zeros_like(original)
    coordinates[..., :k, :] = log.to(original.dtype)
    return coordinates


def _identity_like(tall: torch.Tensor) -> torch.Tensor:
    """The first ``k`` columns of the identity, in every matrix of ``tall`` ``(..., n, k)``."""
    n, k = tall.shape[-2:]
    return torch.eye(n, k, dtype=tall.dtype, device=tall.device).expand(tall.shape).clone()
