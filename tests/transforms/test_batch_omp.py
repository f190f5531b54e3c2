"""Batch-OMP selects the atoms scikit-learn's orthogonal_mp_gram selects (ties and early stops included) and its
coefficients agree to rounding; omp_codes, built on it, warns when samples stop before s atoms."""

import warnings

import numpy as np
import pytest
import torch
from sklearn.linear_model import orthogonal_mp_gram

from lightning_ortho.transforms.batch_omp import batch_omp
from lightning_ortho.transforms.sparse_codes import omp_codes


def _sklearn(gram: np.ndarray, correlations: np.ndarray, s: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # it warns once per sample that stops early
        return orthogonal_mp_gram(gram, correlations.T, n_nonzero_coefs=s).reshape(gram.shape[0], -1).T


def _problem(kind: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Unit-norm atoms (columns) and samples (rows)."""
    rng = np.random.default_rng(seed)
    atoms = rng.standard_normal((n, n))
    samples = rng.standard_normal((30, n))
    if kind == "two atoms":  # every sample is exactly a combination of two atoms: OMP stops after them
        atoms /= np.linalg.norm(atoms, axis=0)
        samples = rng.standard_normal((30, 2)) @ atoms[:, :2].T
    elif kind == "ties":  # the identity with one atom repeated, small integer samples: many equal |alpha|
        atoms = np.eye(n)
        atoms[:, 1] = atoms[:, 0]
        samples = rng.integers(-2, 3, (30, n)).astype(float)
    atoms /= np.linalg.norm(atoms, axis=0)
    return atoms, samples


@pytest.mark.parametrize("kind", ["generic", "two atoms", "ties"])
@pytest.mark.parametrize("s", [1, 3, 8, 12])
def test_batch_omp_selects_what_scikit_learn_selects(kind: str, s: int) -> None:
    atoms, samples = _problem(kind, 12, s)
    gram, correlations = atoms.T @ atoms, (atoms.T @ samples.T).T
    reference = _sklearn(gram, correlations, s)
    found, ended_early = batch_omp(torch.from_numpy(gram), torch.from_numpy(correlations), s)
    found = found.numpy()
    np.testing.assert_array_equal(found != 0, reference != 0)
    np.testing.assert_allclose(found, reference, rtol=1e-10, atol=1e-12 * np.abs(reference).max())
    assert ended_early == int(((reference != 0).sum(axis=1) < s).sum())
    if kind != "generic" and s > 3:  # exact after two atoms / dependent atoms: some samples stop early
        assert ended_early > 0


def test_batch_omp_splits_many_samples_into_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_ortho.transforms import batch_omp as module

    atoms, samples = _problem("generic", 12, 0)
    gram, correlations = torch.from_numpy(atoms.T @ atoms), torch.from_numpy((atoms.T @ samples.T).T)
    whole, _ = batch_omp(gram, correlations, 4)
    monkeypatch.setattr(module, "_BATCH_BYTES", 8 * 4 * 12 * 7)  # 7 samples a batch: 5 batches, the last short
    assert torch.equal(batch_omp(gram, correlations, 4)[0], whole)


def test_omp_codes_warn_when_samples_stop_early() -> None:
    atoms, _ = _problem("generic", 6, 1)
    d = torch.from_numpy(atoms)
    y = torch.randn(10, 2, dtype=torch.float64) @ d[:, :2].T  # two atoms represent every row exactly
    with pytest.warns(RuntimeWarning, match=r"stopped before s = 5 atoms for 10 of 10 samples"):
        codes = omp_codes(y, d, 5)
    assert bool(((codes != 0).sum(1) < 5).all())
    torch.testing.assert_close(codes @ d.T, y, rtol=1e-10, atol=1e-12)
