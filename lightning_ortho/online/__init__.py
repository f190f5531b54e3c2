"""Online gradient estimators for recurrent cells (no Lightning): UORO (Tallec & Ollivier 2017) and its variance
reductions (Cooijmans & Martens 2019), exact RTRL, truncated BPTT, all behind one interface
(:class:`OnlineGradientEstimator`)."""

from lightning_ortho.online.cells import GRUCell, InfluenceBalancingCell, TanhRNNCell
from lightning_ortho.online.estimator import OnlineGradientEstimator

# Imported for their closed forms, which they register with linearize() (OrthogonalRNNCell, GRUCell).
from lightning_ortho.online import gru_linearization, orthogonal_linearization  # noqa: F401  isort: skip
from lightning_ortho.online.linearization import ParameterLayout, StepLinearization, linearize
from lightning_ortho.online.modrelu_cell import ModReLURNNCell
from lightning_ortho.online.oracle import (
    OracleTerms,
    optimal_alpha,
    optimal_q0,
    oracle_terms,
    preactivation_b_matrix,
    preactivation_variance,
    total_variance,
)
from lightning_ortho.online.rtrl import RTRL
from lightning_ortho.online.state import OnlineState
from lightning_ortho.online.tbptt import TruncatedBPTT
from lightning_ortho.online.uoro import PROJECTIONS, UORO

__all__ = [
    "GRUCell",
    "InfluenceBalancingCell",
    "ModReLURNNCell",
    "OnlineGradientEstimator",
    "OnlineState",
    "OracleTerms",
    "ParameterLayout",
    "RTRL",
    "StepLinearization",
    "TanhRNNCell",
    "TruncatedBPTT",
    "UORO",
    "PROJECTIONS",
    "linearize",
    "optimal_alpha",
    "optimal_q0",
    "oracle_terms",
    "preactivation_b_matrix",
    "preactivation_variance",
    "total_variance",
]
