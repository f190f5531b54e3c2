"""Plain NumPy implementations of the online gradient estimators on one stream: the floor that
``benchmarks.bench_online_steps`` times lightning_ortho's estimators against.

Written as a researcher writes them (arrays, ``@``, ``np.outer``, ``np.tanh``; one stream, so vectors, not batches):
no torch, no tricks, nothing deliberately slow. Each computes the numbers of the estimator it stands for (the
benchmark checks it step by step, and its tests at float64 to 1e-10), in the dtype of its arrays (float32 or
float64; complex64/complex128 for the linear recurrent unit's state):

* :class:`TanhRNN`: ``h' = tanh(W_h h + W_x x + b)``, the step of ``TanhRNNCell`` (parameters ``weight_hh``
  ``(H, H)``, ``weight_ih`` ``(H, I)``, ``bias`` ``(H,)``), and the layout of a flat parameter vector
  ``[vec(W_h), vec(W_x), b]`` (row-major, the order of ``named_parameters``);
* :class:`RTRL` (Williams & Zipser 1989), :class:`UORO` (Tallec & Ollivier 2017, greedy iterative rescaling of
  Cooijmans & Martens 2019, noise at the state), :class:`KFRTRL` (Mujika et al. 2018), :class:`RFLO` (Murray 2019,
  its factored trace), :class:`SnAp1` (Menick et al. 2021, order 1), :class:`TruncatedBPTT` on that cell;
* :class:`DiagonalRTRL`: the exact traces of the linear recurrent unit (Orvieto et al. 2023; Zucchet et al. 2023).

Every estimator has ``initial(h0)``, ``step(x) -> h`` (``x`` ``(I,)``) and ``gradient(g) -> {name: array}``
(``g = dL_t/dh_t`` ``(H,)``; the estimate of ``dL_t/dtheta`` at the current step, shaped like the parameters).
UORO and KF-RTRL draw their noise from ``noise`` (:class:`Noise`: NumPy's generator by default; the benchmark
passes one that replays what the torch estimator draws, so the two estimates are the same numbers).
"""

from __future__ import annotations

from collections import deque

import numpy as np


class Noise:
    """Standard normal vectors and fair signs from ``np.random.default_rng(seed)`` in ``dtype``."""

    def __init__(self, seed: int, dtype: np.dtype) -> None:
        self.rng, self.dtype = np.random.default_rng(seed), np.dtype(dtype)

    def normal(self, n: int) -> np.ndarray:
        """``(n,)`` draws of ``N(0, 1)``."""
        return self.rng.standard_normal(n, dtype=self.dtype)

    def signs(self, n: int) -> np.ndarray:
        """``(n,)`` independent signs, ``+1`` or ``-1`` with probability 1/2."""
        return (2 * self.rng.integers(0, 2, n) - 1).astype(self.dtype)


class TanhRNN:
    """``h' = tanh(W_h h + W_x x + b)`` with ``W_h`` ``(H, H)``, ``W_x`` ``(H, I)``, ``b`` ``(H,)``."""

    def __init__(self, weight_hh: np.ndarray, weight_ih: np.ndarray, bias: np.ndarray) -> None:
        self.weight_hh, self.weight_ih, self.bias = weight_hh, weight_ih, bias
        self.hidden, self.inputs = weight_ih.shape
        self.dtype = weight_hh.dtype
        self.size = self.hidden * (self.hidden + self.inputs + 1)  # P
        self.eye = np.eye(self.hidden, dtype=self.dtype)
        self.one = np.ones(1, dtype=self.dtype)

    def __call__(self, x: np.ndarray, h: np.ndarray) -> np.ndarray:
        return np.tanh(self.weight_hh @ h + self.weight_ih @ x + self.bias)

    def split(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """``[vec(W_h), vec(W_x), b]`` ``(P,)`` -> one array per parameter."""
        hh, ih = self.hidden * self.hidden, self.hidden * self.inputs
        return {
            "weight_hh": flat[:hh].reshape(self.hidden, self.hidden),
            "weight_ih": flat[hh : hh + ih].reshape(self.hidden, self.inputs),
            "bias": flat[hh + ih :],
        }

    def split_columns(self, weight: np.ndarray) -> dict[str, np.ndarray]:
        """``[W_h W_x b]``-shaped ``(H, H + I + 1)`` -> one array per parameter."""
        hidden = self.hidden
        return {"weight_hh": weight[:, :hidden], "weight_ih": weight[:, hidden:-1], "bias": weight[:, -1]}


class Forward:
    """The cell's step alone (no gradient)."""

    def __init__(self, cell: TanhRNN) -> None:
        self.cell = cell

    def initial(self, h0: np.ndarray) -> None:
        self.h = h0.copy()

    def step(self, x: np.ndarray) -> np.ndarray:
        self.h = self.cell(x, self.h)
        return self.h


class RTRL:
    """``M_t = diag(d_t) (W_h M_{t-1} + dz_t/dtheta)``, ``(H, P)``; the estimate is ``g^T M_t``."""

    def __init__(self, cell: TanhRNN) -> None:
        self.cell = cell

    def initial(self, h0: np.ndarray) -> None:
        self.h = h0.copy()
        self.influence = np.zeros((self.cell.hidden, self.cell.size), dtype=self.cell.dtype)

    def step(self, x: np.ndarray) -> np.ndarray:
        cell, h = self.cell, self.h
        h_new = cell(x, h)
        d = 1 - h_new**2
        # dz_i/dW_h[i, j] = h_j, dz_i/dW_x[i, j] = x_j, dz_i/db_i = 1, in the layout [vec(W_h), vec(W_x), b]
        immediate = np.concatenate([np.kron(cell.eye, h), np.kron(cell.eye, x), cell.eye], axis=1)
        self.influence = d[:, None] * (cell.weight_hh @ self.influence + immediate)
        self.h = h_new
        return h_new

    def gradient(self, g: np.ndarray) -> dict[str, np.ndarray]:
        return self.cell.split(g @ self.influence)


class UORO:
    """Rank-one ``h_tilde w_tilde^T`` with greedy iterative rescaling, the noise ``nu`` at the state::

        h_tilde' = gamma J h_tilde + beta tau nu,     w_tilde' = w_tilde / gamma + (tau / beta) vec((nu * d) a^T)

    with ``d = 1 - h'^2``, ``J = diag(d) W_h``, ``a = [h; x; 1]``, ``gamma = sqrt((|w_tilde| + eps) / (|J h_tilde|
    + eps))``, ``beta = sqrt((|nu * d| |a| + eps) / (|nu| + eps))``; the estimate is ``(g . h_tilde) w_tilde``."""

    def __init__(self, cell: TanhRNN, noise: Noise, eps: float = 1e-7) -> None:
        self.cell, self.noise, self.eps = cell, noise, eps

    def initial(self, h0: np.ndarray) -> None:
        self.h = h0.copy()
        self.h_tilde = np.zeros(self.cell.hidden, dtype=self.cell.dtype)
        self.w_tilde = np.zeros(self.cell.size, dtype=self.cell.dtype)

    def step(self, x: np.ndarray) -> np.ndarray:
        cell, h, eps, norm = self.cell, self.h, self.eps, np.linalg.norm
        nu = self.noise.normal(cell.hidden)
        tau = self.noise.signs(1)[0]
        h_new = cell(x, h)
        d = 1 - h_new**2
        propagated = d * (cell.weight_hh @ self.h_tilde)
        g = nu * d  # nu^T dh'/dtheta = (nu * d) a^T
        a = np.concatenate([h, x, cell.one])
        gamma = np.sqrt((norm(self.w_tilde) + eps) / (norm(propagated) + eps))
        beta = np.sqrt((norm(g) * norm(a) + eps) / (norm(nu) + eps))
        self.h_tilde = gamma * propagated + beta * tau * nu
        outer = np.concatenate([np.outer(g, h).ravel(), np.outer(g, x).ravel(), g])
        self.w_tilde = self.w_tilde / gamma + (tau / beta) * outer
        self.h = h_new
        return h_new

    def gradient(self, g: np.ndarray) -> dict[str, np.ndarray]:
        return self.cell.split((g @ self.h_tilde) * self.w_tilde)


class KFRTRL:
    """``dh_t/dW ~ u_t^T (x) A_t`` (``W = [W_h W_x b]``, ``a = [h; x; 1]``), with signs ``c1, c2``::

        u' = c1 p1 u + c2 p2 a,     A' = (c1 / p1) J A + (c2 / p2) diag(d)
        p1 = sqrt((|J A| + eps) / (|u| + eps)),     p2 = sqrt((|diag(d)| + eps) / (|a| + eps))

    and the estimate ``(A^T g) u^T``."""

    def __init__(self, cell: TanhRNN, noise: Noise, eps: float = 1e-7) -> None:
        self.cell, self.noise, self.eps = cell, noise, eps

    def initial(self, h0: np.ndarray) -> None:
        cell = self.cell
        self.h = h0.copy()
        self.u = np.zeros(cell.hidden + cell.inputs + 1, dtype=cell.dtype)
        self.A = np.zeros((cell.hidden, cell.hidden), dtype=cell.dtype)

    def step(self, x: np.ndarray) -> np.ndarray:
        cell, h, eps, norm = self.cell, self.h, self.eps, np.linalg.norm
        h_new = cell(x, h)
        d = 1 - h_new**2
        a = np.concatenate([h, x, cell.one])
        propagated = d[:, None] * (cell.weight_hh @ self.A)
        local = np.diag(d)
        c1, c2 = self.noise.signs(2)
        p1 = np.sqrt((norm(propagated) + eps) / (norm(self.u) + eps))
        p2 = np.sqrt((norm(local) + eps) / (norm(a) + eps))
        self.u = c1 * p1 * self.u + c2 * p2 * a
        self.A = (c1 / p1) * propagated + (c2 / p2) * local
        self.h = h_new
        return h_new

    def gradient(self, g: np.ndarray) -> dict[str, np.ndarray]:
        return self.cell.split_columns(np.outer(self.A.T @ g, self.u))


class RFLO:
    """The factored trace ``E' = (1 - 1/tau) E + (1/tau) d a^T`` ``(H, H + I + 1)``; the estimate is ``diag(g) E``."""

    def __init__(self, cell: TanhRNN, tau: float) -> None:
        self.cell, self.decay, self.rate = cell, 1 - 1 / tau, 1 / tau

    def initial(self, h0: np.ndarray) -> None:
        cell = self.cell
        self.h = h0.copy()
        self.trace = np.zeros((cell.hidden, cell.hidden + cell.inputs + 1), dtype=cell.dtype)

    def step(self, x: np.ndarray) -> np.ndarray:
        cell, h = self.cell, self.h
        h_new = cell(x, h)
        d = 1 - h_new**2
        a = np.concatenate([h, x, cell.one])
        self.trace = self.decay * self.trace + self.rate * np.outer(d, a)
        self.h = h_new
        return h_new

    def gradient(self, g: np.ndarray) -> dict[str, np.ndarray]:
        return self.cell.split_columns(g[:, None] * self.trace)


class SnAp1:
    """RTRL's influence kept where one step puts it: parameter ``W[k, j]`` of ``W = [W_h W_x b]`` on unit ``k`` only,
    ``m' = d * (diag(W_h) * m + a^T)`` row by row, ``(H, H + I + 1)``; the estimate is ``diag(g) m``."""

    def __init__(self, cell: TanhRNN) -> None:
        self.cell = cell

    def initial(self, h0: np.ndarray) -> None:
        cell = self.cell
        self.h = h0.copy()
        self.influence = np.zeros((cell.hidden, cell.hidden + cell.inputs + 1), dtype=cell.dtype)

    def step(self, x: np.ndarray) -> np.ndarray:
        cell, h = self.cell, self.h
        h_new = cell(x, h)
        d = 1 - h_new**2
        a = np.concatenate([h, x, cell.one])
        self_loop = np.diag(cell.weight_hh)  # J[k, k] = d_k W_h[k, k]: the only entry of J the kept pattern reads
        self.influence = d[:, None] * (self_loop[:, None] * self.influence + a[None, :])
        self.h = h_new
        return h_new

    def gradient(self, g: np.ndarray) -> dict[str, np.ndarray]:
        return self.cell.split_columns(g[:, None] * self.influence)


class TruncatedBPTT:
    """The gradient of ``g . h_t`` through the last ``k`` steps: the window keeps ``(x_s, h_{s-1})``, and
    :meth:`gradient` backpropagates through it (no gradient into the state the window starts from)."""

    def __init__(self, cell: TanhRNN, k: int) -> None:
        self.cell, self.k = cell, k

    def initial(self, h0: np.ndarray) -> None:
        self.h = h0.copy()
        self.window: deque = deque(maxlen=self.k)

    def step(self, x: np.ndarray) -> np.ndarray:
        self.window.append((x, self.h))
        self.h = self.cell(x, self.h)
        return self.h

    def gradient(self, g: np.ndarray) -> dict[str, np.ndarray]:
        cell = self.cell
        grad_hh, grad_ih = np.zeros_like(cell.weight_hh), np.zeros_like(cell.weight_ih)
        grad_b = np.zeros_like(cell.bias)
        delta, h_out = g, self.h
        for x, h_in in reversed(self.window):
            dz = delta * (1 - h_out**2)
            grad_hh += np.outer(dz, h_in)
            grad_ih += np.outer(dz, x)
            grad_b += dz
            delta = cell.weight_hh.T @ dz
            h_out = h_in
        return {"weight_hh": grad_hh, "weight_ih": grad_ih, "bias": grad_b}


class DiagonalRTRL:
    """Exact RTRL of the linear recurrent unit ``h' = lambda * h + gamma * (B x)``, ``lambda = exp(-exp(nu_log) + i
    exp(theta_log))``, ``gamma = exp(gamma_log)``, ``B = B_re + i B_im``: one complex trace per parameter entry,
    ``e' = lambda e + dh'/dtheta``; the estimate is ``Re(conj(g) e)`` (``-Im`` for ``B_im``), zero for the readout's
    ``C_re``, ``C_im``, ``D``.

    Args:
        params: the cell's parameters by name (``nu_log``, ``theta_log``, ``gamma_log`` ``(H,)``, ``B_re``,
            ``B_im`` ``(H, I)``, ``C_re``, ``C_im`` ``(I, H)``, ``D`` ``(I,)``).
    """

    def __init__(self, params: dict[str, np.ndarray]) -> None:
        self.params = params
        self.hidden, self.inputs = params["B_re"].shape

    def initial(self, h0: np.ndarray) -> None:
        self.h = h0.copy()
        zeros = np.zeros(self.hidden, dtype=h0.dtype)
        self.e_nu, self.e_theta, self.e_gamma = zeros.copy(), zeros.copy(), zeros.copy()
        self.e_B = np.zeros((self.hidden, self.inputs), dtype=h0.dtype)

    def step(self, x: np.ndarray) -> np.ndarray:
        p, h = self.params, self.h
        mu, phi, gamma = np.exp(p["nu_log"]), np.exp(p["theta_log"]), np.exp(p["gamma_log"])
        lam = np.exp(-mu + 1j * phi)
        driven = gamma * (p["B_re"] @ x + 1j * (p["B_im"] @ x))
        self.e_nu = lam * self.e_nu - mu * lam * h
        self.e_theta = lam * self.e_theta + 1j * phi * lam * h
        self.e_gamma = lam * self.e_gamma + driven
        self.e_B = lam[:, None] * self.e_B + gamma[:, None] * x[None, :]
        self.h = lam * h + driven
        return self.h

    def gradient(self, g: np.ndarray) -> dict[str, np.ndarray]:
        p, c = self.params, np.conj(g)
        weights = c[:, None] * self.e_B
        return {
            "nu_log": (c * self.e_nu).real,
            "theta_log": (c * self.e_theta).real,
            "gamma_log": (c * self.e_gamma).real,
            "B_re": weights.real,
            "B_im": -weights.imag,
            "C_re": np.zeros_like(p["C_re"]),
            "C_im": np.zeros_like(p["C_im"]),
            "D": np.zeros_like(p["D"]),
        }
