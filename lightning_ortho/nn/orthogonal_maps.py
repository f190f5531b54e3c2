"""One constructor for every orthogonal(-like) map: ``orthogonal_map(d, method)``."""

from __future__ import annotations

from typing import Any, Literal, get_args

from lightning_ortho.nn.auxiliary import AuxiliaryReflection
from lightning_ortho.nn.base import OrthogonalMap
from lightning_ortho.nn.householder import HouseholderProduct
from lightning_ortho.nn.parametrized import ParametrizedOrthogonal

OrthogonalMethod = Literal["aux", "householder", "cayley", "matrix_exp", "torch_householder"]

#: Every method :func:`orthogonal_map` accepts (read from :data:`OrthogonalMethod`).
ORTHOGONAL_METHODS: tuple[str, ...] = get_args(OrthogonalMethod)


def orthogonal_map(d: int, method: OrthogonalMethod = "aux", **kwargs: Any) -> OrthogonalMap:
    """A module ``(..., d) -> (..., d)`` computing an orthogonal(-like) map of the chosen kind.

    Args:
        d: feature dimension.
        method:
            ``"aux"``: one :class:`AuxiliaryReflection` ``H(W x) x`` (one matmul; norm preserving, not linear).
            ``"householder"``: :class:`HouseholderProduct` of ``k = d`` reflections (ours; ``strategy="wy"``).
            ``"cayley"``, ``"matrix_exp"``, ``"torch_householder"``: ``torch.nn.utils.parametrizations.orthogonal``
            with that map (:class:`ParametrizedOrthogonal`).
        **kwargs: passed to the class (e.g. ``k=``/``strategy=`` for ``"householder"``, ``invertible=`` for ``"aux"``).

    Raises:
        ValueError: unknown ``method``.
    """
    if method == "aux":
        return AuxiliaryReflection(d, **kwargs)
    if method == "householder":
        return HouseholderProduct(d, **kwargs)
    if method in ("cayley", "matrix_exp"):
        return ParametrizedOrthogonal(d, method, **kwargs)
    if method == "torch_householder":
        return ParametrizedOrthogonal(d, "householder", **kwargs)
    raise ValueError(f"orthogonal_map: unknown method {method!r}; choose one of {', '.join(ORTHOGONAL_METHODS)}.")
