"""Online gradient estimators for recurrent cells (no Lightning), all behind one interface
(:class:`OnlineGradientEstimator`): UORO (Tallec & Ollivier 2017) and its variance reductions (Cooijmans & Martens
2019), exact RTRL, truncated BPTT, KF-RTRL (Mujika, Meier & Steger 2018), SnAp (Menick et al. 2021), RFLO (Murray
2019), and exact RTRL for diagonal recurrences such as the linear recurrent unit (Orvieto et al. 2023; Zucchet et
al. 2023)."""

from lightning_ortho.online.cells import GRUCell, InfluenceBalancingCell, TanhRNNCell
from lightning_ortho.online.estimator import OnlineGradientEstimator

# Imported for their closed forms, which they register with linearize() (OrthogonalRNNCell, GRUCell).
from lightning_ortho.online import gru_linearization, orthogonal_linearization  # noqa: F401  isort: skip
from lightning_ortho.online.diagonal_rtrl import DiagonalRTRL
from lightning_ortho.online.kf_rtrl import KFRTRL
from lightning_ortho.online.linearization import ParameterLayout, StepLinearization, linearize
from lightning_ortho.online.lru import LinearRecurrentUnit
from lightning_ortho.online.lru_stack import LRUStack, OnlineLRUStack
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
from lightning_ortho.online.rflo import RFLO
from lightning_ortho.online.rtrl import RTRL
from lightning_ortho.online.snap import SnAp
from lightning_ortho.online.state import OnlineState
from lightning_ortho.online.tbptt import TruncatedBPTT
from lightning_ortho.online.uoro import PROJECTIONS, UORO

__all__ = [
    "DiagonalRTRL",
    "GRUCell",
    "InfluenceBalancingCell",
    "KFRTRL",
    "LRUStack",
    "LinearRecurrentUnit",
    "ModReLURNNCell",
    "OnlineGradientEstimator",
    "OnlineLRUStack",
    "OnlineState",
    "OracleTerms",
    "ParameterLayout",
    "RFLO",
    "RTRL",
    "SnAp",
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
