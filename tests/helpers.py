"""Independent references for the tests: plain matrix algebra, no code under test."""

import torch


def random_orthogonal(d: int, dtype=torch.float64) -> torch.Tensor:
    """Haar-distributed orthogonal matrix (QR of a Gaussian with the sign fix)."""
    q, r = torch.linalg.qr(torch.randn(d, d, dtype=dtype))
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


def dense_householder(v: torch.Tensor) -> torch.Tensor:
    """H(v) = I - 2 v v^T / v^T v as a dense matrix."""
    v = v.reshape(-1, 1)
    return torch.eye(v.shape[0], dtype=v.dtype) - 2 * (v @ v.T) / (v.T @ v)


def auxiliary_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """f(x) = H(W x) x for one vector x, written from the paper's definition."""
    return dense_householder(weight @ x) @ x


def theorem2_weight(v: torch.Tensor) -> torch.Tensor:
    """W = I + V V^T / (2 sigma_max(V V^T)) (Appendix A.2.1), sigma_max from an SVD."""
    gram = v @ v.T
    return torch.eye(v.shape[0], dtype=v.dtype) + gram / (2 * torch.linalg.svdvals(gram)[0])
