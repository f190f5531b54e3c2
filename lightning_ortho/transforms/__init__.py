"""Multiplication-free fast linear transforms (Rusu, arXiv 1812.03412): SOPOT coefficients, the 16 binary 2x2
cores, products of 2x2 blocks on coordinate pairs (B-, M-, shear- and O-transforms) and of 4x4 blocks (B⊗), and
learned transforms refined from a multiplierless DCT or WHT (:func:`learn_fast_transform`).

Pure PyTorch; nothing here imports Lightning.
"""

from lightning_ortho.transforms.b4_dla import B4x4TransformLearner, B4x4TransformResult, learn_b4x4_transform
from lightning_ortho.transforms.b_dla import BTransformLearner, BTransformResult, learn_b_transform
from lightning_ortho.transforms.binary_cores import (
    BINARY_CORE_COSTS,
    CORE_INVERSE,
    CORE_PRODUCT_TABLE,
    G1_INDICES,
    G2_INDICES,
    IDENTITY_INDEX,
    NUM_BINARY_CORES,
    SELF_INVERSE_INDICES,
    SWAP_INDEX,
    binary_core_cost,
    binary_cores,
)
from lightning_ortho.transforms.blocks import (
    BinaryBlockProduct,
    BlockProduct,
    SingularBlockError,
    embed_block,
    schedule_layers,
)
from lightning_ortho.transforms.compression import (
    CompressionReport,
    NotAffineError,
    affine_parts,
    compress_linear,
    default_hyperparameters,
    restore_factorized,
)
from lightning_ortho.transforms.costs import OpCount, block_cost, multiplier_cost, row_cost
from lightning_ortho.transforms.factorized_linear import FactorizedLinear
from lightning_ortho.transforms.learn_fast_transform import FastTransformResult, learn_fast_transform
from lightning_ortho.transforms.m_dla import (
    MTransformLearner,
    MTransformResult,
    learn_m_stage,
    learn_m_transform,
    m_pair_costs,
)
from lightning_ortho.transforms.patches import image_patches
from lightning_ortho.transforms.quad_cores import QuadBlockProduct
from lightning_ortho.transforms.s_dla import (
    ShearTransformLearner,
    ShearTransformResult,
    learn_shear_transform,
    shear_error,
    shear_greedy_init,
    shear_sweep,
)
from lightning_ortho.transforms.sopot import SOPOT_TOLERANCE, SOPOTResult, sopot, sopot_terms_needed, sopot_with_cost
from lightning_ortho.transforms.sparse_codes import keep_largest, omp_codes, representation_error
from lightning_ortho.transforms.statistics import (
    TransformLearner,
    TransformStatistics,
    fit_in_memory,
    principal_basis,
)
from lightning_ortho.transforms.unnormalised import o_block_change, o_cores, o_transform

__all__ = [
    "affine_parts",
    "B4x4TransformLearner",
    "B4x4TransformResult",
    "binary_core_cost",
    "BINARY_CORE_COSTS",
    "binary_cores",
    "BinaryBlockProduct",
    "block_cost",
    "BlockProduct",
    "BTransformLearner",
    "BTransformResult",
    "compress_linear",
    "CompressionReport",
    "CORE_INVERSE",
    "CORE_PRODUCT_TABLE",
    "default_hyperparameters",
    "embed_block",
    "FactorizedLinear",
    "FastTransformResult",
    "fit_in_memory",
    "G1_INDICES",
    "G2_INDICES",
    "IDENTITY_INDEX",
    "image_patches",
    "keep_largest",
    "learn_b4x4_transform",
    "learn_b_transform",
    "learn_fast_transform",
    "learn_m_stage",
    "learn_m_transform",
    "learn_shear_transform",
    "m_pair_costs",
    "MTransformLearner",
    "MTransformResult",
    "multiplier_cost",
    "NotAffineError",
    "NUM_BINARY_CORES",
    "o_block_change",
    "o_cores",
    "o_transform",
    "omp_codes",
    "OpCount",
    "principal_basis",
    "QuadBlockProduct",
    "representation_error",
    "restore_factorized",
    "row_cost",
    "schedule_layers",
    "SELF_INVERSE_INDICES",
    "shear_error",
    "shear_greedy_init",
    "shear_sweep",
    "ShearTransformLearner",
    "ShearTransformResult",
    "SingularBlockError",
    "sopot",
    "sopot_terms_needed",
    "SOPOT_TOLERANCE",
    "sopot_with_cost",
    "SOPOTResult",
    "SWAP_INDEX",
    "TransformLearner",
    "TransformStatistics",
]
