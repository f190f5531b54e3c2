"""The linear recurrent unit (Orvieto et al. 2023, "Resurrecting Recurrent Neural Networks for Long Sequences") and
its closed-form exact RTRL traces (Zucchet et al. 2023, "Online learning of long-range dependencies").

The recurrence is complex and diagonal, so the influence of every parameter on the state stays on the unit it
enters: :class:`~lightning_ortho.online.diagonal_rtrl.DiagonalRTRL` keeps it exactly with ``O(H I)`` memory per
stream, here in closed form (:class:`LRUTraces`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lightning_ortho.online.diagonal_rtrl import DiagonalTraces, complex_dtype, real_part_of_product
from lightning_ortho.online.linearization import ParameterLayout, steps_as

#: The parameters in the order of ``named_parameters()``; the names of the code in Orvieto et al.'s appendix.
LRU_PARAMETERS = ("nu_log", "theta_log", "gamma_log", "B_re", "B_im", "C_re", "C_im", "D")


class LinearRecurrentUnit(nn.Module):
    """The linear recurrent unit of Orvieto et al. 2023, one layer:

    ``lambda = exp(-exp(nu_log) + i exp(theta_log))`` (complex, diagonal, ``|lambda| < 1`` for any finite ``nu_log`` short of underflow),
    ``h' = lambda * h + exp(gamma_log) * (B x)`` with ``B = B_re + i B_im``, and the output
    ``y = Re(C h) + D * x`` (:meth:`output`, ``C = C_re + i C_im``, ``D`` element-wise as in the paper).

    Initialisation (Orvieto et al.'s ring lemma and their appendix A code): ``|lambda|`` uniform on the ring
    ``r_min <= |lambda| <= r_max`` of the complex plane (``|lambda|^2 = u (r_max^2 - r_min^2) + r_min^2``,
    ``u ~ U(0, 1)``), the phase ``arg(lambda) ~ U(0, max_phase)``, the normalisation
    ``gamma = exp(gamma_log) = sqrt(1 - |lambda|^2)`` (a parameter of its own, trained), ``B_re, B_im ~
    N(0, 1 / (2 I))``, ``C_re, C_im ~ N(0, 1 / H)``, ``D ~ N(0, 1)``.

    The state is complex: ``forward(x, h)`` takes ``x`` ``(B, input_size)`` real and ``h`` ``(B, hidden_size)`` in
    the complex dtype of the parameters (``complex128`` for ``float64`` parameters, :meth:`state_dtype`) and returns
    ``h'`` like ``h``. All parameters are real tensors (``B`` and ``C`` as real and imaginary parts), so
    ``cell.double()`` and the optimisers treat them as any other. ``C`` and ``D`` do not enter the state: their
    gradients come from ordinary backprop through :meth:`output` at each step.

    Args:
        input_size: ``I``, features of ``x``.
        hidden_size: ``H``, complex units of ``h``.
        r_min: inner radius of the ring of initial eigenvalues.
        r_max: outer radius of that ring.
        max_phase: largest initial phase ``arg(lambda)``.

    Raises:
        ValueError: a size is not a positive integer, not ``0 <= r_min <= r_max <= 1`` with ``r_min < 1``, or
            ``max_phase`` is not positive and finite.
    """

    #: The state ``h`` is complex (the estimators that support it read this).
    complex_state = True
    #: ``dh'/dh = diag(lambda)`` for every value of the parameters, so DiagonalRTRL stays exact through training.
    diagonal_recurrence = True

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        *,
        r_min: float = 0.0,
        r_max: float = 1.0,
        max_phase: float = 2 * math.pi,
    ) -> None:
        super().__init__()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"LinearRecurrentUnit: {name} must be a positive integer, got {value!r}.")
        if not (0.0 <= r_min <= r_max <= 1.0 and r_min < 1.0):
            raise ValueError(
                f"LinearRecurrentUnit: the ring of eigenvalues needs 0 <= r_min <= r_max <= 1 and r_min < 1 (|lambda|"
                f" < 1), got r_min={r_min!r}, r_max={r_max!r}; e.g. r_min=0.9, r_max=0.999."
            )
        if not (math.isfinite(max_phase) and max_phase > 0):
            raise ValueError(f"LinearRecurrentUnit: max_phase must be positive and finite, got {max_phase!r}.")
        self.input_size, self.hidden_size = input_size, hidden_size
        self.r_min, self.r_max, self.max_phase = float(r_min), float(r_max), float(max_phase)
        nu_log, theta_log, gamma_log = ring_initialisation(hidden_size, self.r_min, self.r_max, self.max_phase)
        dtype = torch.get_default_dtype()
        self.nu_log = nn.Parameter(nu_log.to(dtype))
        self.theta_log = nn.Parameter(theta_log.to(dtype))
        self.gamma_log = nn.Parameter(gamma_log.to(dtype))
        self.B_re = nn.Parameter(torch.randn(hidden_size, input_size) / math.sqrt(2 * input_size))
        self.B_im = nn.Parameter(torch.randn(hidden_size, input_size) / math.sqrt(2 * input_size))
        self.C_re = nn.Parameter(torch.randn(input_size, hidden_size) / math.sqrt(hidden_size))
        self.C_im = nn.Parameter(torch.randn(input_size, hidden_size) / math.sqrt(hidden_size))
        self.D = nn.Parameter(torch.randn(input_size))

    def state_dtype(self) -> torch.dtype:
        """The complex dtype of ``h``: ``complex128`` for ``float64`` parameters, ``complex64`` for ``float32``."""
        return complex_dtype(self.nu_log.dtype)

    def eigenvalues(self) -> torch.Tensor:
        """``lambda = exp(-exp(nu_log) + i exp(theta_log))``, ``(H,)`` complex."""
        return torch.exp(torch.complex(-torch.exp(self.nu_log), torch.exp(self.theta_log)))

    def input_projection(self, x: torch.Tensor) -> torch.Tensor:
        """``B x`` ``(B, H)`` complex for ``x`` ``(B, I)`` real."""
        return torch.complex(x @ self.B_re.T, x @ self.B_im.T)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """``h' = lambda * h + exp(gamma_log) * (B x)``: ``x`` ``(B, I)`` real, ``h`` ``(B, H)`` complex."""
        return torch.addcmul(torch.exp(self.gamma_log) * self.input_projection(x), self.eigenvalues(), h)

    def output(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``y = Re(C h) + D * x`` ``(B, I)`` for ``h`` ``(B, H)`` complex and ``x`` ``(B, I)`` (the step's input)."""
        return h.real @ self.C_re.T - h.imag @ self.C_im.T + self.D * x

    def diagonal_traces(self, layout: ParameterLayout) -> DiagonalTraces | None:
        """The closed-form traces (:class:`LRUTraces`), or ``None`` for a subclass that changes the step or the
        parameters (it takes :class:`~lightning_ortho.online.diagonal_rtrl.DiagonalRTRL`'s ``torch.func`` path)."""
        step = ("forward", "eigenvalues", "input_projection")
        if not steps_as(self, LinearRecurrentUnit, layout, LRU_PARAMETERS, step):
            return None
        return LRUTraces(self, layout)

    def extra_repr(self) -> str:
        return (
            f"input_size={self.input_size}, hidden_size={self.hidden_size}, r_min={self.r_min}, r_max={self.r_max},"
            f" max_phase={self.max_phase:.4g}"
        )


def ring_initialisation(
    hidden_size: int, r_min: float, r_max: float, max_phase: float, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(nu_log, theta_log, gamma_log)`` ``(H,)`` float64 of Orvieto et al.'s ring initialisation:
    ``|lambda|^2 = u1 (r_max^2 - r_min^2) + r_min^2``, ``arg(lambda) = max_phase u2`` with ``u1, u2 ~ U(0, 1)``,
    ``nu_log = log(-log|lambda|)``, ``theta_log = log(arg(lambda))``, ``gamma_log = log sqrt(1 - |lambda|^2)``.

    The draws are kept inside ``(0, 1)`` so that every logarithm is finite (``|lambda| = 1`` or a zero phase
    would make ``nu_log`` or ``theta_log`` ``-inf``)."""
    tiny = torch.finfo(torch.float64).tiny
    u1 = torch.rand(hidden_size, dtype=torch.float64, generator=generator).clamp_(min=tiny)
    u2 = torch.rand(hidden_size, dtype=torch.float64, generator=generator).clamp_(min=tiny)
    squared = u1 * (r_max**2 - r_min**2) + r_min**2  # |lambda|^2 in [r_min^2, r_max^2)
    nu = (-0.5 * torch.log(squared)).clamp_(min=tiny)  # -log|lambda| > 0
    nu_log = torch.log(nu)
    theta_log = torch.log(max_phase * u2)
    gamma_log = 0.5 * torch.log(-torch.expm1(-2 * nu))  # log sqrt(1 - |lambda|^2), exact near |lambda| = 1
    return nu_log, theta_log, gamma_log


class LRUTraces(DiagonalTraces):
    """Exact RTRL traces of :class:`LinearRecurrentUnit` in closed form (Zucchet et al. 2023).

    With ``mu = exp(nu_log)``, ``phi = exp(theta_log)``, ``gamma = exp(gamma_log)``, ``u_t = B x_t``, the state
    Jacobian is ``diag(lambda)`` and the immediate derivatives are ``dh'/dnu_log = -mu lambda h``,
    ``dh'/dtheta_log = i phi lambda h``, ``dh'/dgamma_log = gamma u``, ``dh'_k/dB_re[k, j] = gamma_k x_j`` and
    ``dh'_k/dB_im[k, j] = i gamma_k x_j``. The traces (per stream, complex) follow ``e' = lambda e + immediate``:

        e_nu    = e_units[:, 0] (B, H):  e_nu'    = lambda e_nu    - mu lambda h_{t-1}
        e_theta = e_units[:, 1] (B, H):  e_theta' = lambda e_theta + i phi lambda h_{t-1}
        e_gamma = e_units[:, 2] (B, H):  e_gamma' = lambda e_gamma + gamma u_t
        e_B                  (B, H, I):  e_B'     = lambda e_B     + gamma x_t^T    (dh_k/dB_re[k, j]; dh_k/dB_im = i e_B)

    and ``dL_t/dp = Re(conj(g) e_p)`` with ``g = dL_t/dRe h_t + i dL_t/dIm h_t`` (PyTorch's gradient of a real
    loss with respect to a complex tensor); ``dL/dB_im = Re(conj(g) i e_B) = -Im(conj(g) e_B)``. ``C`` and ``D``
    do not enter ``h``: their entries are zero (their gradients come from backprop through the output). The
    three per-unit traces are one ``(B, 3, H)`` tensor so that a step updates them with one operation.
    """

    complex_state = True

    def lru_kernels(self) -> bool:
        """This class's step and estimate are the C kernels' (:mod:`lightning_ortho._native.lru`); a subclass that
        changes them is not (it gets the PyTorch path)."""
        return type(self) is LRUTraces

    def __init__(self, cell: LinearRecurrentUnit, layout: ParameterLayout) -> None:
        self.cell, self.layout = cell, layout
        self.recurrent = 3 * cell.hidden_size + 2 * cell.hidden_size * cell.input_size  # entries before C_re

    def initial(self, h0: torch.Tensor) -> dict[str, torch.Tensor]:
        batch, hidden = h0.shape
        return {
            "e_units": h0.new_zeros(batch, 3, hidden),
            "e_B": h0.new_zeros(batch, hidden, self.cell.input_size),
        }

    def advance(
        self, x: torch.Tensor, h: torch.Tensor, traces: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        cell = self.cell
        mu, phi, gamma = torch.exp(cell.nu_log), torch.exp(cell.theta_log), torch.exp(cell.gamma_log)
        lam = torch.exp(torch.complex(-mu, phi))
        driven = gamma * cell.input_projection(x)
        slopes = torch.stack([lam * -mu, lam * (phi * 1j)])  # dlambda/dnu_log, dlambda/dtheta_log (2, H)
        immediate = torch.cat([slopes * h[:, None, :], driven[:, None, :]], dim=1)
        new = {
            "e_units": torch.addcmul(immediate, lam, traces["e_units"]),
            "e_B": lam[:, None] * traces["e_B"] + gamma[:, None] * x[:, None, :],
        }
        return torch.addcmul(driven, lam, h), new

    def gradient(self, traces: dict[str, torch.Tensor], grad_h: torch.Tensor, per_stream: bool) -> torch.Tensor:
        conj = grad_h.conj()
        units = real_part_of_product(conj[:, None, :], traces["e_units"])  # (B, 3, H)
        weights = conj[:, :, None] * traces["e_B"]  # (B, H, I): conj(g) e_B
        if not per_stream:
            units, weights = units.sum(0), weights.sum(0)
        lead = units.shape[:-2]
        tail = units.new_zeros(*lead, self.layout.size - self.recurrent)  # C_re, C_im, D: outside the recurrence
        parts = [units, weights.real, -weights.imag]
        return torch.cat([*(part.reshape(*lead, -1) for part in parts), tail], dim=-1)
