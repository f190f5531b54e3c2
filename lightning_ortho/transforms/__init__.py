"""Multiplication-free fast linear transforms (Rusu, arXiv 1812.03412): SOPOT coefficients, the 16 binary 2x2
cores, and products of 2x2 blocks on coordinate pairs (B-, M-, shear- and O-transforms).

Pure PyTorch; nothing here imports Lightning.
"""

from lightning_ortho.transforms.b_dla import BTransformResult, learn_b_transform
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
from lightning_ortho.transforms.costs import OpCount, block_cost, multiplier_cost, row_cost
from lightning_ortho.transforms.m_dla import MTransformResult, learn_m_stage, learn_m_transform, m_pair_costs
from lightning_ortho.transforms.sopot import SOPOT_TOLERANCE, SOPOTResult, sopot, sopot_terms_needed, sopot_with_cost

__all__ = [
    "BINARY_CORE_COSTS",
    "CORE_INVERSE",
    "CORE_PRODUCT_TABLE",
    "G1_INDICES",
    "G2_INDICES",
    "IDENTITY_INDEX",
    "NUM_BINARY_CORES",
    "SELF_INVERSE_INDICES",
    "SOPOT_TOLERANCE",
    "SWAP_INDEX",
    "BinaryBlockProduct",
    "BTransformResult",
    "BlockProduct",
    "MTransformResult",
    "OpCount",
    "SOPOTResult",
    "SingularBlockError",
    "binary_core_cost",
    "binary_cores",
    "block_cost",
    "embed_block",
    "learn_b_transform",
    "learn_m_stage",
    "learn_m_transform",
    "m_pair_costs",
    "multiplier_cost",
    "row_cost",
    "schedule_layers",
    "sopot",
    "sopot_terms_needed",
    "sopot_with_cost",
]
