"""What every map built by :func:`~lightning_ortho.nn.orthogonal_map` declares, so callers never probe attributes."""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch
from torch import nn
from torch.nn.utils import parametrize


class OrthogonalMap(nn.Module):
    """Base class of the orthogonal(-like) maps ``(..., d) -> (..., d)``: auxiliary reflections, Householder
    products and PyTorch's orthogonal parametrisations.

    Subclasses set ``self.d`` and override what they support:

    * :attr:`represents_every_orthogonal`: whether :meth:`reset_orthogonal_` can make the map equal *any*
      ``(d, d)`` orthogonal matrix (``d`` reflections can, fewer cannot; a Theorem-2 auxiliary reflection, whose
      ``W`` is symmetric positive definite, cannot). The recurrent cell uses it to start every map from the same
      transition (Appendix B.2).
    * :meth:`cached`: a context in which a map that builds a ``d x d`` matrix builds it once (an RNN applies the
      same map at every time step).
    """

    d: int

    @property
    def represents_every_orthogonal(self) -> bool:
        """Whether :meth:`reset_orthogonal_` can set the map to any ``(d, d)`` orthogonal matrix. ``False`` here;
        a subclass that can says so."""
        return False

    def reset_orthogonal_(self, orthogonal: torch.Tensor) -> OrthogonalMap:
        """Make the map equal the orthogonal ``(d, d)`` matrix ``U``, in place. Returns ``self``.

        Raises:
            ValueError: this map cannot represent an arbitrary orthogonal matrix (see
                :attr:`represents_every_orthogonal`), or ``U`` is not orthogonal.
        """
        raise ValueError(
            f"{type(self).__name__} cannot be set to an arbitrary orthogonal matrix; check "
            "`represents_every_orthogonal` first."
        )

    def cached(self) -> AbstractContextManager:
        """Inside the block, matrices built from parameters are built once (``torch.nn.utils.parametrize.cached``)."""
        return parametrize.cached()
