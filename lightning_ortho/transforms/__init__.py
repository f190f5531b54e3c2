"""Multiplication-free fast linear transforms (Rusu, arXiv 1812.03412): SOPOT coefficients, the 16 binary 2x2
cores, products of 2x2 blocks on coordinate pairs (B-, M-, shear- and O-transforms) and of 4x4 blocks (B⊗), and
learned transforms refined from a multiplierless DCT or WHT (:func:`learn_fast_transform`).

Pure PyTorch; nothing here imports Lightning.
"""

from lightning_ortho._deprecation import moved_attributes
from lightning_ortho.transforms.b4_dla import B4x4TransformLearner, B4x4TransformResult, learn_b4x4_transform
from lightning_ortho.transforms.b_dla import BTransformLearner, BTransformResult, learn_b_transform
from lightning_ortho.transforms.binary_cores import binary_cores
from lightning_ortho.transforms.blocks import BinaryBlockProduct, BlockProduct, SingularBlockError
from lightning_ortho.transforms.compression import (
    CompressionReport,
    NotAffineError,
    compress_linear,
    default_hyperparameters,
    restore_factorized,
)
from lightning_ortho.transforms.conv_compression import compress_conv
from lightning_ortho.transforms.costs import OpCount, block_cost, multiplier_cost, row_cost
from lightning_ortho.transforms.factorized_conv import FactorizedConv
from lightning_ortho.transforms.factorized_linear import FactorizedLinear
from lightning_ortho.transforms.families import FAMILIES, FAMILY_TABLE, TransformFamilySpec
from lightning_ortho.transforms.learn_fast_transform import FastTransformResult, learn_fast_transform
from lightning_ortho.transforms.m_dla import MTransformLearner, MTransformResult, learn_m_transform
from lightning_ortho.transforms.model_compression import ModelCompression, compress_model
from lightning_ortho.transforms.patches import image_patches
from lightning_ortho.transforms.quad_cores import QuadBlockProduct
from lightning_ortho.transforms.s_dla import ShearTransformLearner, ShearTransformResult, learn_shear_transform
from lightning_ortho.transforms.sopot import SOPOTResult, sopot, sopot_with_cost
from lightning_ortho.transforms.sparse_codes import omp_codes, representation_error
from lightning_ortho.transforms.statistics import TransformLearner, TransformStatistics, fit_in_memory
from lightning_ortho.transforms.unnormalised import o_transform

# What users need: the learners and their results, the block products, the compression API, operation counts and the
# family table. Internals (the binary-core tables, the learners' steps, SOPOT tolerances, ...) stay importable from
# their modules (``lightning_ortho.transforms.binary_cores``, ``.m_dla``, ``.s_dla``, ...).
__all__ = [
    "FAMILIES",
    "FAMILY_TABLE",
    "B4x4TransformLearner",
    "B4x4TransformResult",
    "BTransformLearner",
    "BTransformResult",
    "BinaryBlockProduct",
    "BlockProduct",
    "CompressionReport",
    "FactorizedConv",
    "FactorizedLinear",
    "ModelCompression",
    "FastTransformResult",
    "MTransformLearner",
    "MTransformResult",
    "NotAffineError",
    "OpCount",
    "QuadBlockProduct",
    "SOPOTResult",
    "ShearTransformLearner",
    "ShearTransformResult",
    "SingularBlockError",
    "TransformFamilySpec",
    "TransformLearner",
    "TransformStatistics",
    "binary_cores",
    "block_cost",
    "compress_conv",
    "compress_linear",
    "compress_model",
    "default_hyperparameters",
    "fit_in_memory",
    "image_patches",
    "learn_b4x4_transform",
    "learn_b_transform",
    "learn_fast_transform",
    "learn_m_transform",
    "learn_shear_transform",
    "multiplier_cost",
    "o_transform",
    "omp_codes",
    "representation_error",
    "restore_factorized",
    "row_cost",
    "sopot",
    "sopot_with_cost",
]

#: Names exported here before and internal now: still resolved (with a LightningOrthoDeprecationWarning) for one release.
__getattr__ = moved_attributes(
    __name__,
    {
        "BINARY_CORE_COSTS": "lightning_ortho.transforms.binary_cores",
        "CORE_INVERSE": "lightning_ortho.transforms.binary_cores",
        "CORE_PRODUCT_TABLE": "lightning_ortho.transforms.binary_cores",
        "G1_INDICES": "lightning_ortho.transforms.binary_cores",
        "G2_INDICES": "lightning_ortho.transforms.binary_cores",
        "IDENTITY_INDEX": "lightning_ortho.transforms.binary_cores",
        "NUM_BINARY_CORES": "lightning_ortho.transforms.binary_cores",
        "SELF_INVERSE_INDICES": "lightning_ortho.transforms.binary_cores",
        "SOPOT_TOLERANCE": "lightning_ortho.transforms.sopot",
        "SWAP_INDEX": "lightning_ortho.transforms.binary_cores",
        "affine_parts": "lightning_ortho.transforms.compression",
        "binary_core_cost": "lightning_ortho.transforms.binary_cores",
        "embed_block": "lightning_ortho.transforms.blocks",
        "keep_largest": "lightning_ortho.transforms.sparse_codes",
        "learn_m_stage": "lightning_ortho.transforms.m_dla",
        "m_pair_costs": "lightning_ortho.transforms.m_dla",
        "o_block_change": "lightning_ortho.transforms.unnormalised",
        "o_cores": "lightning_ortho.transforms.unnormalised",
        "principal_basis": "lightning_ortho.transforms.statistics",
        "schedule_layers": "lightning_ortho.transforms.blocks",
        "shear_error": "lightning_ortho.transforms.s_dla",
        "shear_greedy_init": "lightning_ortho.transforms.s_dla",
        "shear_sweep": "lightning_ortho.transforms.s_dla",
        "sopot_terms_needed": "lightning_ortho.transforms.sopot",
    },
)
