"""Pure-PyTorch orthogonal(-like) layers: auxiliary reflections, Householder products, SVD layers.

Nothing here imports Lightning.
"""

from lightning_ortho.nn._checks import finite_checks
from lightning_ortho.nn.auxiliary import AuxiliaryReflection
from lightning_ortho.nn.householder import HouseholderProduct, householder_vectors
from lightning_ortho.nn.newton import NewtonInverseError, NewtonResult
from lightning_ortho.nn.orthogonal import ORTHOGONAL_METHODS, orthogonal_map
from lightning_ortho.nn.parametrized import ParametrizedOrthogonal
from lightning_ortho.nn.reflection import householder_matrix, reflect
from lightning_ortho.nn.resolvent import EigenResolvent
from lightning_ortho.nn.svd_linear import SVDLinear

__all__ = [
    "ORTHOGONAL_METHODS",
    "AuxiliaryReflection",
    "EigenResolvent",
    "HouseholderProduct",
    "NewtonInverseError",
    "NewtonResult",
    "ParametrizedOrthogonal",
    "SVDLinear",
    "finite_checks",
    "householder_matrix",
    "householder_vectors",
    "orthogonal_map",
    "reflect",
]
