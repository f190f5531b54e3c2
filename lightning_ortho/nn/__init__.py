"""Pure-PyTorch orthogonal(-like) layers: auxiliary reflections, Householder products, SVD layers, orthogonal RNNs,
and orthogonal weights on any module (``orthogonal(module, "weight")``).

Nothing here imports Lightning.
"""

from lightning_ortho._deprecation import moved_attributes
from lightning_ortho.nn._checks import finite_checks
from lightning_ortho.nn.auxiliary import AuxiliaryReflection
from lightning_ortho.nn.base import OrthogonalMap
from lightning_ortho.nn.capabilities import (
    HasDenseJacobian,
    HasInverse,
    HasInverseWithResult,
    HasInvertibilityMargin,
    HasJacobianSigns,
    HasLogAbsDetJacobian,
    HasMatrix,
    HasNewtonInverse,
    Reconstructs,
)
from lightning_ortho.nn.householder import HouseholderProduct
from lightning_ortho.nn.invertible_weight import InvertibleAuxiliaryWeight
from lightning_ortho.nn.newton import NewtonInverseError, NewtonResult, NotInvertibleError
from lightning_ortho.nn.orthogonal_maps import ORTHOGONAL_METHODS, OrthogonalMethod, orthogonal_map
from lightning_ortho.nn.orthogonal_weight import WEIGHT_MAPS, OrthogonalWeight, orthogonal, sample_haar_, update_base_
from lightning_ortho.nn.parametrized import ParametrizedOrthogonal
from lightning_ortho.nn.reflection import householder_matrix, reflect
from lightning_ortho.nn.rnn import OrthogonalRNN, OrthogonalRNNCell, modrelu
from lightning_ortho.nn.svd_linear import SVDLinear

__all__ = [
    "ORTHOGONAL_METHODS",
    "WEIGHT_MAPS",
    "AuxiliaryReflection",
    "HasDenseJacobian",
    "HasInverse",
    "HasInverseWithResult",
    "HasInvertibilityMargin",
    "HasJacobianSigns",
    "HasLogAbsDetJacobian",
    "HasMatrix",
    "HasNewtonInverse",
    "HouseholderProduct",
    "InvertibleAuxiliaryWeight",
    "NewtonInverseError",
    "NewtonResult",
    "NotInvertibleError",
    "OrthogonalMap",
    "OrthogonalMethod",
    "OrthogonalRNN",
    "OrthogonalRNNCell",
    "OrthogonalWeight",
    "ParametrizedOrthogonal",
    "Reconstructs",
    "SVDLinear",
    "finite_checks",
    "householder_matrix",
    "modrelu",
    "orthogonal",
    "orthogonal_map",
    "reflect",
    "sample_haar_",
    "update_base_",
]

#: Names exported here before and internal now: still resolved (with a LightningOrthoDeprecationWarning) for one release.
__getattr__ = moved_attributes(
    __name__,
    {
        "householder_vectors": "lightning_ortho.nn.householder",
    },
)
