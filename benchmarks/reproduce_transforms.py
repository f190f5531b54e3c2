"""Rusu 2018, "Learning multiplication-free linear transformations" (arXiv 1812.03412, its experiments): the
representation error of s-sparse codes of 8x8 image patches under learned fast transforms, against their
operation counts, beside fixed fast transforms, dense bases and FAµST (pyfaust) at equal operation counts.

    python -m benchmarks.reproduce_transforms            # the full experiment (about 10-15 minutes on 2 cores)
    python -m benchmarks.reproduce_transforms --quick    # smoke run on 1,024 patches (seconds)

Data: ``ImagePatchesDataModule(val_fraction=0).all_patches()``, the non-overlapping 8x8 patches of
scikit-learn's two sample photographs in grey levels in [0, 1], each patch's own mean removed (N = 8480,
n = 64; the paper used lena, N = 4096). Every method is fitted to and scored on all the patches (the paper's
setting), with s = 4 nonzeros per code and the error ``100 ||Y - X D^T||_F^2 / ||Y||_F^2`` (percent).

Learned fast transforms (lightning_ortho.transforms): B_m-DLA (m = 32, 64, 128, 256 binary 2x2 blocks), M_q-DLA
(q = 2, 4, 6, 8 perfect-matching stages, one round as in the paper), S-DLA shears/scalings with 1-bit SOPOT
values and with exact values (m as B; 15 sweeps, OMP codes). Codes: ``T_s(Y D)`` for the orthonormal B and M,
OMP for shears. B⊗_m-DLA (m = 32, 64, 128, 256 4x4 Hadamard blocks, one sweep as the paper's K = 1; T_s codes) is
scored on held-out patches instead: it learns on a seeded random 75 % of the same patches and its ``error`` is that
of the other 25 % (its ``train_error`` the error on the patches it learned from).

Baselines, all with T_s codes (orthonormal): the 2-D DCT-II, the 64-point Walsh-Hadamard transform (= the
separable 8x8 one), the 3-level 2-D Haar wavelet (non-standard decomposition), the PCA basis (eigenvectors of
``Y^T Y``) and a learned dense orthonormal dictionary (Q-DLA alternation: ``X = T_s(Y U)``, ``U`` = polar factor
of ``Y^T X``, 20 iterations from PCA). The identity (T_s of the pixels) is the floor every learner starts above.

Peers (FAµST, installed only into benchmarks/.peers by ``_peers.import_peer``, never a dependency):
``pyfaust.fact.eigtj`` approximates the PCA basis by a product of J Givens rotations (truncated Jacobi on
``Y^T Y``; orthonormal, T_s codes) with J chosen so its cost (2 additions + 4 multiplications per rotation) equals
B's at m = 32, 64, 128, 256; ``pyfaust.fact.hierarchical`` factorises the learned dense dictionary into two sparse
factors whose nonzeros are chosen for the same operation counts (OMP codes, as the product is not orthonormal),
and ``pyfaust.fact.butterfly`` into six butterfly factors (one size).

Operation counts (additions, multiplications, shifts of one transform of one patch; ``lightning_ortho.transforms.
costs`` rules: +-1 free, one shared multiplier per row): B ``transform.op_count()`` (2 + 2 per G1 block); M
``op_count(defer_scaling=True)`` (nq additions + n shifts for even q, as the paper counts it); shears
``op_count(bits)``; B⊗ ``op_count()`` (12 additions + 4 shifts per block); FAµST factors by the same row rule on their nonzeros; the fixed transforms by the formulas in
``OP_COUNT_SOURCES``.

Writes benchmarks/results/reproduce_transforms-HARDWARE.json and .png (error against total operations); results
table: reproduce_transforms_render.py.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from itertools import pairwise
from pathlib import Path

import numpy as np
import torch

from benchmarks import _fast_transform_rows as fast_rows
from benchmarks import _transform_rows as shared_rows
from benchmarks._common import (
    benchmark_parser,
    configured,
    parse_args,
    print_claims,
    pyplot,
    reject,
    result_path,
    write_result,
)
from benchmarks._peers import import_peer
from benchmarks._transform_rows import row
from lightning_ortho.datamodules import ImagePatchesDataModule
from lightning_ortho.transforms import (
    BinaryBlockProduct,
    OpCount,
    binary_cores,
    learn_b_transform,
    learn_m_transform,
    learn_shear_transform,
    omp_codes,
    representation_error,
    row_cost,
)
from lightning_ortho.transforms.b4_dla import learn_b4x4_transform
from lightning_ortho.transforms.patches import image_patches
from lightning_ortho.transforms.sparse_codes import keep_largest
from lightning_ortho.transforms.statistics import principal_basis

#: pyfaust 3.42.2 (newest on PyPI) has wheels for CPython >= 3.12 only; 3.41.0 is the newest with a 3.11 wheel.
PYFAUST = "pyfaust==3.42.2" if sys.version_info >= (3, 12) else "pyfaust==3.41.0"

S = 4
B_SIZES = (32, 64, 128, 256)
#: B⊗_m-DLA: blocks, sweeps (the paper's K = 1), and the held-out share of the patches (seeded split).
B4X4_SIZES, B4X4_ITERATIONS, HELD_OUT_FRACTION, SPLIT_SEED = (32, 64, 128, 256), 1, 0.25, 0
M_STAGES = (2, 4, 6, 8)
SHEAR_ITERATIONS = 15
DENSE_ITERATIONS = 20
#: PALM4MSA iterations of each of FAµST's hierarchical stages (local and global).
PALM_ITERATIONS = 200

OP_COUNT_SOURCES = {
    "DCT 2-D": "row-column: 16 8-point DCTs by Loeffler, Ligtenberg & Moschytz (ICASSP 1989, 'Practical fast 1-D "
    "DCT algorithms with 11 multiplications'): 11 multiplications + 29 additions each = 176 + 464; the LLM outputs "
    "are sqrt(8) times the orthonormal DCT, so the 2-D result is 8x and its normalisation is one 3-bit shift per "
    "coefficient (64)",
    "WHT": "64-point fast Walsh-Hadamard transform: n log2 n = 384 additions/subtractions, then 1/8 = one 3-bit "
    "shift per coefficient (64); H_64 = H_8 (x) H_8, so this is also the separable 8x8 transform",
    "Haar 2-D": "3 levels of the non-standard 2-D Haar decomposition: (a +- b) on 8x8, 4x4 and 2x2 blocks, rows then "
    "columns: 2 (64 + 16 + 4) = 168 additions; the 1/sqrt(2) of a row and a column pass make 1/2 per level, "
    "deferred to one shift per coefficient (64)",
    "PCA": "dense 64x64 matrix-vector product: n^2 = 4096 multiplications + n(n-1) = 4032 additions",
    "learned dense": "dense 64x64 matrix-vector product: 4096 multiplications + 4032 additions",
    "identity": "none",
    "B": "BinaryBlockProduct.op_count(): 2 additions + 2 multiplications by 2^-1/2 per G1 block (G2 blocks free)",
    "M": "BinaryBlockProduct.op_count(defer_scaling=True): nq additions, the 2^-q/2 per coordinate deferred "
    "(n shifts for even q), as the paper counts it",
    "B⊗": "QuadBlockProduct.op_count(): 12 additions + 4 shifts per 4x4 block (each output sums four +-x terms and "
    "halves once)",
    "shear": "BlockProduct.op_count(bits): a 1-bit shear 1 addition + 1 shift, a scaling 1 shift; exact: 1 "
    "addition + 1 multiplication per shear, 1 multiplication per scaling",
    "FAµST": "per factor and row, (nonzeros - 1) additions + one multiplication per entry other than +-1 (one shared "
    "one when the row's nonzeros have one magnitude): a Givens rotation 2 additions + 4 multiplications",
}


def load_patches(max_patches: int | None) -> torch.Tensor:
    """``Y`` ``(N, 64)`` float64: the sample photographs' 8x8 patches, each one's mean removed."""
    data = ImagePatchesDataModule(val_fraction=0, max_patches=max_patches, seed=0)
    data.prepare_data()
    data.setup()
    return data.all_patches().double()


def photograph_patches(max_patches: int | None) -> dict[str, torch.Tensor]:
    """``{name: Y}`` per sample photograph: its 8x8 patches, means removed, float64 (at most ``max_patches`` split
    evenly)."""
    data = ImagePatchesDataModule(val_fraction=0, seed=0)
    images = {name: image_patches(image.double(), 8) for name, image in data.load_images()}
    if max_patches is not None:
        images = {name: y[: max(1, max_patches // len(images))] for name, y in images.items()}
    return images


def dct_matrix(size: int = 8) -> torch.Tensor:
    """Orthonormal DCT-II ``C`` ``(size, size)``: ``C @ x`` are the coefficients of ``x``."""
    k = torch.arange(size, dtype=torch.float64)
    c = torch.cos(math.pi * (2 * k[None, :] + 1) * k[:, None] / (2 * size)) * math.sqrt(2 / size)
    c[0] /= math.sqrt(2)
    return c


def hadamard(size: int) -> torch.Tensor:
    """Sylvester's ``H_size`` (+-1 entries, ``size`` a power of two)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < size:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def haar_2d(size: int = 8) -> torch.Tensor:
    """Dictionary ``(size^2, size^2)`` of the orthonormal non-standard 2-D Haar transform (all levels), columns the
    atoms on row-major patches: the transform of every unit patch, transposed."""

    def forward(patch: torch.Tensor) -> torch.Tensor:
        out = patch.clone()
        side = size
        while side > 1:
            block = out[:side, :side]
            rows = torch.cat([block[:, 0::2] + block[:, 1::2], block[:, 0::2] - block[:, 1::2]], 1) / math.sqrt(2)
            out[:side, :side] = torch.cat([rows[0::2] + rows[1::2], rows[0::2] - rows[1::2]], 0) / math.sqrt(2)
            side //= 2
        return out.reshape(-1)

    eye = torch.eye(size * size, dtype=torch.float64)
    transform = torch.stack([forward(eye[k].reshape(size, size)) for k in range(size * size)], 1)  # coeffs = T @ x
    return transform.T


def wht_as_b_transform(n: int = 64) -> BinaryBlockProduct:
    """The normalised WHT ``H_n / sqrt(n)`` as a B-transform: log2(n) stages of n/2 blocks with the G1 core
    ``[1 1; 1 -1] / sqrt(2)`` on the pairs ``(i, i + 2^b)`` (so it lies in B_m-DLA's search space at m = 192)."""
    cores = binary_cores()
    butterfly = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64) / math.sqrt(2)
    core = int((cores - butterfly).abs().amax(dim=(1, 2)).argmin())
    pairs = [(i, i + (1 << b)) for b in range(int(math.log2(n))) for i in range(n) if not i >> b & 1]
    return BinaryBlockProduct(n, pairs, [core] * len(pairs))


def orthonormal_error(y: torch.Tensor, dictionary: torch.Tensor) -> float:
    """Error (%) of the exact s-sparse codes ``T_s(Y D)`` of an orthonormal ``D``, at the paper's ``s``."""
    return shared_rows.orthonormal_error(y, dictionary, S)


def omp_error(y: torch.Tensor, dictionary: torch.Tensor) -> tuple[float, int]:
    """Error (%) of OMP codes under any ``D`` and the number of its zero atoms (left out: ``omp_codes`` needs
    nonzero columns; a zero atom can represent nothing)."""
    keep = dictionary.norm(dim=0) > 0
    if bool(keep.all()):
        return float(representation_error(y, omp_codes(y, dictionary, S), dictionary)), 0
    from sklearn.linear_model import orthogonal_mp_gram

    atoms = dictionary[:, keep] / dictionary[:, keep].norm(dim=0)
    data = y.numpy()
    coefficients = orthogonal_mp_gram((atoms.T @ atoms).numpy(), (atoms.T.numpy() @ data.T), n_nonzero_coefs=S)
    codes = torch.from_numpy(np.ascontiguousarray(coefficients.reshape(int(keep.sum()), -1).T))
    return float(representation_error(y, codes, atoms)), int((~keep).sum())


def learned_dense(y: torch.Tensor, iterations: int) -> tuple[torch.Tensor, list[float]]:
    """Q-DLA-style dense orthonormal dictionary: from the PCA basis, ``X = T_s(Y U)``, ``U = P Q^T`` for
    ``Y^T X = P S Q^T`` (the orthonormal ``U`` minimising ``||Y - X U^T||``), ``iterations`` times."""
    u = principal_basis(y.T @ y)
    errors = []
    for _ in range(iterations):
        codes = keep_largest(y @ u, S)
        left, _, right = torch.linalg.svd(y.T @ codes)
        u = left @ right
        errors.append(orthonormal_error(y, u))
    return u, errors


def held_out_split(count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, held_out)`` row indices: a seeded random ``HELD_OUT_FRACTION`` of ``count`` rows held out."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(SPLIT_SEED))
    held = max(1, round(HELD_OUT_FRACTION * count))
    return order[held:].sort().values, order[:held].sort().values


def b4x4_rows(y: torch.Tensor, sizes: tuple[int, ...]) -> list[dict]:
    """B⊗_m-DLA rows: learned on the training part of ``held_out_split``, scored (``error``) on the held-out part."""
    train, held = held_out_split(y.shape[0])
    rows = []
    for m in sizes:
        start = time.perf_counter()
        result = learn_b4x4_transform(y[train], m, S, iterations=B4X4_ITERATIONS)
        seconds = time.perf_counter() - start
        d = result.transform.matrix().double()
        error = orthonormal_error(y[held], d)
        rows.append(
            row(
                "B⊗",
                f"B⊗ m={m} (held-out)",
                error,
                result.transform.op_count(),
                coding="T_s",
                seconds=seconds,
                param="m",
                value=m,
                blocks=m,
                evaluation="held-out",
                held_out_error=error,
                train_error=orthonormal_error(y[train], d),
                train_patches=int(train.numel()),
                held_out_patches=int(held.numel()),
                errors_per_sweep=result.errors,
                initial_error=result.initial_error,
                op_count_source=OP_COUNT_SOURCES["B⊗"],
            )
        )
        print(
            f"B⊗ m={m}: held-out {error:.2f} % (train {rows[-1]['train_error']:.2f} %) at {rows[-1]['total_ops']} "
            f"ops ({seconds:.1f} s)",
            flush=True,
        )
    return rows


def faust_cost(faust) -> OpCount:
    """Operations of one product with a Faust: every factor's rows by :func:`row_cost` (module docstring)."""
    total = OpCount()
    for k in range(faust.numfactors()):
        factor = faust.factors(k)
        dense = factor.toarray() if hasattr(factor, "toarray") else np.asarray(factor)
        for entries in dense:
            total = total + row_cost([float(v) for v in entries[entries != 0]])
    return total


def faust_rows(
    y: torch.Tensor, dense: torch.Tensor, sizes: tuple[int, ...], *, butterfly: bool, palm_iterations: int
) -> tuple[list, dict]:
    """FAµST rows (eigtj of ``Y^T Y``; hierarchical and butterfly of the learned dense dictionary) and the peer
    record; ``([], {"error": reason})`` when pyfaust cannot be installed or imported."""
    module, reason = import_peer("pyfaust", PYFAUST)
    peer: dict = {"requirement": PYFAUST}
    if PYFAUST.endswith("3.41.0"):
        peer["note"] = "pyfaust 3.42.2, the newest, has wheels for CPython >= 3.12 only; 3.41.0 is the newest for 3.11"
    if module is None:
        peer["error"] = reason
        print(f"pyfaust unavailable: {reason}", flush=True)
        return [], peer
    try:
        peer["version"] = module.version()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pyfaust.fact warns that the optional einops is missing
            from pyfaust.fact import butterfly as faust_butterfly
            from pyfaust.fact import eigtj, hierarchical
            from pyfaust.factparams import ParamsHierarchical, StoppingCriterion
            from pyfaust.proj import sp
    except Exception as error:  # a broken third-party install must not stop the benchmark
        peer["error"] = f"{type(error).__name__}: {error}"
        return [], peer
    rows = []
    gram = (y.T @ y).numpy()
    n = y.shape[1]
    for m in sizes:
        target = 4 * m  # B with m G1 blocks: 2m additions + 2m multiplications
        givens = max(1, round(target / 6))
        start = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a PendingDeprecationWarning of numpy.matrix inside pyfaust
            _, basis = eigtj(gram, nGivens=givens, nGivens_per_fac=1)
        d = torch.from_numpy(np.ascontiguousarray(basis.toarray())).double()
        seconds = time.perf_counter() - start
        rows.append(
            row(
                "FAµST eigtj (Givens, PCA)",
                f"eigtj J={givens} (B m={m})",
                orthonormal_error(y, d),
                faust_cost(basis),
                coding="T_s",
                seconds=seconds,
                param="J",
                value=givens,
                matched_b_m=m,
                factors=basis.numfactors(),
                nnz=int(basis.nnz_sum()),
            )
        )
        print(f"  FAµST eigtj J={givens}: {rows[-1]['error']:.2f} % at {rows[-1]['total_ops']} ops", flush=True)
        nnz = max(n, round(target / 4 + 32))  # two sp factors of nnz each: measured ~= target operations
        start = time.perf_counter()
        stop = StoppingCriterion(num_its=palm_iterations)
        params = ParamsHierarchical([sp((n, n), nnz)], [sp((n, n), nnz)], stop, stop)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            faust = hierarchical(dense.numpy(), params)
        d = torch.from_numpy(np.ascontiguousarray(faust.toarray())).double()
        error, zero_atoms = omp_error(y, d)
        seconds = time.perf_counter() - start
        rows.append(
            row(
                "FAµST hierarchical (learned dense)",
                f"hierarchical 2 x sp({nnz}) (B m={m})",
                error,
                faust_cost(faust),
                coding="OMP",
                seconds=seconds,
                param="nnz per factor",
                value=nnz,
                matched_b_m=m,
                factors=faust.numfactors(),
                nnz=int(faust.nnz_sum()),
                zero_atoms=zero_atoms,
                relative_approximation_error=float((d - dense).norm() / dense.norm()),
            )
        )
        print(f"  FAµST hierarchical nnz={nnz}: {error:.2f} % at {rows[-1]['total_ops']} ops", flush=True)
    if butterfly:
        start = time.perf_counter()
        faust = faust_butterfly(dense.numpy(), type="bbtree")
        d = torch.from_numpy(np.ascontiguousarray(faust.toarray())).double()
        error, zero_atoms = omp_error(y, d)
        rows.append(
            row(
                "FAµST butterfly (learned dense)",
                "butterfly, 6 factors",
                error,
                faust_cost(faust),
                coding="OMP",
                seconds=time.perf_counter() - start,
                factors=faust.numfactors(),
                nnz=int(faust.nnz_sum()),
                zero_atoms=zero_atoms,
                relative_approximation_error=float((d - dense).norm() / dense.norm()),
            )
        )
        print(f"  FAµST butterfly: {error:.2f} % at {rows[-1]['total_ops']} ops", flush=True)
    return rows, peer


def main(argv: list[str] | None = None) -> Path:
    parser = benchmark_parser("reproduce_transforms", __doc__)
    parser.add_argument("--shear-max-m", type=int, default=256, help="largest m of the shear transforms")
    parser.add_argument("--no-peer", action="store_true", help="leave FAµST out")
    args = parse_args(parser, argv)
    reject(parser, args, rounds="reproduce_transforms learns each transform once", device="it runs on the CPU only")
    with configured(args) as device:
        return _run(args, device)


def _run(args, device) -> Path:
    """The experiment (``--quick``: 1,024 patches, small m/q, 2 sweeps)."""
    started = time.perf_counter()
    max_patches = 1024 if args.quick else None
    b_sizes = (8, 16) if args.quick else B_SIZES
    m_stages = (2,) if args.quick else M_STAGES
    shear_sizes = tuple(m for m in ((8,) if args.quick else B_SIZES) if m <= args.shear_max_m)
    shear_iterations = 2 if args.quick else SHEAR_ITERATIONS
    b4x4_sizes = (4,) if args.quick else B4X4_SIZES
    dense_iterations = 3 if args.quick else DENSE_ITERATIONS
    palm = 20 if args.quick else PALM_ITERATIONS

    y = load_patches(max_patches)
    n = y.shape[1]
    print(f"patches: {tuple(y.shape)}, s = {S}", flush=True)
    rows: list[dict] = []

    # Fixed and dense baselines (T_s codes).
    dct = dct_matrix()
    fixed = {
        "identity": (torch.eye(n, dtype=torch.float64), OpCount()),
        "DCT 2-D": (torch.kron(dct, dct).T, OpCount(additions=16 * 29, multiplications=16 * 11, shifts=64)),
        "WHT": (hadamard(n) / math.sqrt(n), OpCount(additions=n * int(math.log2(n)), shifts=n)),
        "Haar 2-D": (haar_2d(), OpCount(additions=168, shifts=64)),
        "PCA": (principal_basis(y.T @ y), OpCount(additions=n * (n - 1), multiplications=n * n)),
    }
    for name, (d, ops) in fixed.items():
        rows.append(row(name, name, orthonormal_error(y, d), ops, coding="T_s", op_count_source=OP_COUNT_SOURCES[name]))
        print(f"{name}: {rows[-1]['error']:.2f} % at {rows[-1]['total_ops']} ops", flush=True)
    wht_b = wht_as_b_transform(n)
    wht_b_error = orthonormal_error(y, wht_b.matrix().double())
    start = time.perf_counter()
    dense, dense_errors = learned_dense(y, dense_iterations)
    rows.append(
        row(
            "learned dense",
            f"learned dense orthonormal ({dense_iterations} iterations)",
            dense_errors[-1],
            OpCount(additions=n * (n - 1), multiplications=n * n),
            coding="T_s",
            seconds=time.perf_counter() - start,
            errors_per_iteration=dense_errors,
            op_count_source=OP_COUNT_SOURCES["learned dense"],
        )
    )
    print(f"learned dense: {dense_errors[-1]:.2f} %", flush=True)

    # Learned multiplication-free transforms.
    for m in b_sizes:
        start = time.perf_counter()
        result = learn_b_transform(y, m, S)
        seconds = time.perf_counter() - start
        error = orthonormal_error(y, result.transform.matrix().double())
        rows.append(
            row(
                "B",
                f"B m={m}",
                error,
                result.transform.op_count(),
                coding="T_s",
                seconds=seconds,
                param="m",
                value=m,
                blocks=m,
                errors_per_sweep=result.errors,
                initial_error=result.initial_error,
            )
        )
        print(f"B m={m}: {error:.2f} % at {rows[-1]['total_ops']} ops ({seconds:.1f} s)", flush=True)
    for q in m_stages:
        start = time.perf_counter()
        result = learn_m_transform(y, q, S)
        seconds = time.perf_counter() - start
        error = orthonormal_error(y, result.transform.matrix().double())
        rows.append(
            row(
                "M",
                f"M q={q}",
                error,
                result.transform.op_count(defer_scaling=True),
                coding="T_s",
                seconds=seconds,
                param="q",
                value=q,
                blocks=q * n // 2,
            )
        )
        print(f"M q={q}: {error:.2f} % at {rows[-1]['total_ops']} ops ({seconds:.1f} s)", flush=True)
    for bits, family in ((1, "shear (1 bit)"), (None, "shear (exact)")):
        for m in shear_sizes:
            start = time.perf_counter()
            result = learn_shear_transform(y, m, S, bits=bits, iterations=shear_iterations)
            seconds = time.perf_counter() - start
            d = result.transform.matrix().double()
            error = float(representation_error(y, result.codes.double(), d))
            rows.append(
                row(
                    family,
                    f"{family} m={m}",
                    error,
                    result.transform.op_count(bits),
                    coding="OMP",
                    seconds=seconds,
                    param="m",
                    value=m,
                    blocks=m,
                    bits=bits,
                    errors_per_sweep=result.errors,
                    initial_error=result.initial_error,
                )
            )
            print(f"{family} m={m}: {error:.2f} % at {rows[-1]['total_ops']} ops ({seconds:.1f} s)", flush=True)
    rows += b4x4_rows(y, b4x4_sizes)
    fast_sweeps = 2 if args.quick else fast_rows.SWEEPS
    rows += fast_rows.fast_transform_rows(y, S, sweeps=fast_sweeps)
    generalised = fast_rows.generalisation(photograph_patches(max_patches), S, torch.kron(dct, dct).T, fast_sweeps)

    peers: dict = {}
    if args.no_peer:
        peers["pyfaust"] = {"requirement": PYFAUST, "error": "left out (--no-peer)"}
    else:
        print("FAµST:", flush=True)
        peer_rows, peers["pyfaust"] = faust_rows(y, dense, b_sizes, butterfly=not args.quick, palm_iterations=palm)
        rows += peer_rows

    claims = claims_from(rows, {"error": wht_b_error, "blocks": wht_b.num_blocks, **_ops_dict(wht_b.op_count())})
    claims += fast_rows.claims(rows, generalised)
    setup = {
        "data": "sklearn sample photographs (china.jpg, flower.jpg), grey, 8x8 non-overlapping patches, mean removed",
        "patches": y.shape[0],
        "max_patches": max_patches,
        "n": n,
        "s": S,
        "shear_iterations": shear_iterations,
        "dense_iterations": dense_iterations,
        "palm_iterations": palm,
        "shear_max_m": args.shear_max_m,
        "b_sizes": list(b_sizes),
        "m_stages": list(m_stages),
        "b4x4_sizes": list(b4x4_sizes),
        "b4x4_iterations": B4X4_ITERATIONS,
        "held_out_fraction": HELD_OUT_FRACTION,
        "split_seed": SPLIT_SEED,
        "learned_fast_sweeps": fast_sweeps,
        "learned_fast_bits": fast_rows.BITS,
        "quick": args.quick,
    }
    total = round(time.perf_counter() - started, 1)
    path = write_result(
        "reproduce_transforms",
        device,
        rows,
        claims,
        args,
        extra={
            "setup": setup,
            "total_seconds": total,
            "op_count_sources": OP_COUNT_SOURCES,
            "wht_as_b_transform": {
                "blocks": wht_b.num_blocks,
                "error": wht_b_error,
                **_ops_dict(wht_b.op_count()),
                "deferred_scaling": _ops_dict(wht_b.op_count(defer_scaling=True)),
            },
            "peers": peers,
            "learned_fast_generalisation": generalised,
        },
    )
    plot(rows, result_path("reproduce_transforms", device, args, ".png"))
    print_claims(claims)
    print(f"total {total} s; wrote {path}", flush=True)
    return path


def _ops_dict(ops: OpCount) -> dict:
    return {
        "additions": ops.additions,
        "multiplications": ops.multiplications,
        "shifts": ops.shifts,
        "total_ops": ops.additions + ops.multiplications + ops.shifts,
    }


def _series(rows: list[dict], family: str) -> list[dict]:
    return sorted((r for r in rows if r["family"] == family), key=lambda r: r["value"])


def _fmt(values: list[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def claims_from(rows: list[dict], wht_b: dict) -> list[dict]:
    """The paper's claims and the comparisons with the baselines, from the rows."""
    claims = []
    for family in ("B", "shear (1 bit)", "shear (exact)", "B⊗"):
        series = _series(rows, family)
        if len(series) < 2:
            continue
        errors = [r["error"] for r in series]
        sizes = ", ".join(str(r["value"]) for r in series)
        claims.append(
            {
                "claim": f"error falls with m: {family} (m = {sizes}; error %, each below the last)",
                "figure": _fmt(errors),
                "holds": all(b < a for a, b in pairwise(errors)),
            }
        )
    b = {r["value"]: r for r in _series(rows, "B")}
    pairs = [
        (m, q)
        for m, q in ((64, 2), (128, 4), (256, 8))
        if m in b and q in {r["value"] for r in rows if r["family"] == "M"}
    ]
    if pairs:
        mq = {r["value"]: r for r in _series(rows, "M")}
        gaps = [mq[q]["error"] - b[m]["error"] for m, q in pairs]
        where = ", ".join(f"m={m} vs q={q}" for m, q in pairs)
        claims.append(
            {
                "claim": f"B beats M at equal block count m = nq/2 ({where}; M's error minus B's, points, > 0)",
                "figure": _fmt(gaps),
                "holds": all(g > 0 for g in gaps),
            }
        )
    one = {r["value"]: r for r in _series(rows, "shear (1 bit)")}
    exact = {r["value"]: r for r in _series(rows, "shear (exact)")}
    common = sorted(set(one) & set(exact))
    if common:
        gaps = [one[m]["error"] - exact[m]["error"] for m in common]
        claims.append(
            {
                "claim": "1-bit shears are close to exact ones (1-bit error minus exact error at m = "
                + ", ".join(map(str, common))
                + "; within 1 point)",
                "figure": _fmt(gaps),
                "holds": all(abs(g) <= 1 for g in gaps),
            }
        )
    learned = [r for r in rows if r["family"] in ("B", "M", "shear (1 bit)")]
    by_name = {r["family"]: r for r in rows if r["family"] in ("DCT 2-D", "WHT", "Haar 2-D", "PCA")}
    for name, base in by_name.items():
        cheaper = [r for r in learned if r["total_ops"] <= base["total_ops"]]
        if name == "PCA" or not cheaper:
            cheaper = learned
            budget = "any size here"
        else:
            budget = f"<= {base['total_ops']} operations"
        best = min(cheaper, key=lambda r: r["error"])
        claims.append(
            {
                "claim": f"a learned multiplication-free transform (B, M, 1-bit shear; {budget}) reaches the {name}'s error "
                f"({base['error']:.2f} % at {base['total_ops']} operations); figure: best ({best['label']}, "
                f"{best['total_ops']} ops) minus {name}, points",
                "figure": round(best["error"] - base["error"], 2),
                "holds": best["error"] <= base["error"],
            }
        )
    if 256 in b:
        claims.append(
            {
                "claim": f"B_m-DLA at m = 256 reaches the WHT, itself a B-transform of {wht_b['blocks']} G1 blocks "
                f"({wht_b['error']:.2f} %, {wht_b['total_ops']} ops) in its search space; figure: B m=256 minus WHT, points",
                "figure": round(b[256]["error"] - wht_b["error"], 2),
                "holds": b[256]["error"] <= wht_b["error"],
            }
        )
    b4x4 = _series(rows, "B⊗")
    if b4x4:
        gaps = [r["held_out_error"] - r["train_error"] for r in b4x4]
        claims.append(
            {
                "claim": "B⊗_m-DLA generalises: its held-out error is within 1 point of its error on the patches it "
                f"learned from (m = {', '.join(str(r['value']) for r in b4x4)}; held-out minus train, points)",
                "figure": _fmt(gaps),
                "holds": all(abs(g) <= 1 for g in gaps),
            }
        )
    givens = {r["matched_b_m"]: r for r in rows if r["family"] == "FAµST eigtj (Givens, PCA)"}
    hier = {r["matched_b_m"]: r for r in rows if r["family"] == "FAµST hierarchical (learned dense)"}
    for peer, name in (
        (givens, "FAµST eigtj (Givens rotations approximating PCA)"),
        (hier, "FAµST hierarchical (2 sparse factors of the learned dense dictionary)"),
    ):
        sizes = sorted(set(peer) & set(b))
        if sizes:
            gaps = [peer[m]["error"] - b[m]["error"] for m in sizes]
            claims.append(
                {
                    "claim": f"B beats {name} at about equal operations (m = {', '.join(map(str, sizes))}; "
                    "peer's error minus B's, points, > 0)",
                    "figure": _fmt(gaps),
                    "holds": all(g > 0 for g in gaps),
                }
            )
    return claims


MARKERS = {
    "B": "o",
    "M": "s",
    "shear (1 bit)": "^",
    "shear (exact)": "v",
    "B⊗": "d",
    "FAµST eigtj (Givens, PCA)": "D",
    "FAµST hierarchical (learned dense)": "P",
    "FAµST butterfly (learned dense)": "X",
    "DCT 2-D": "*",
    "WHT": "h",
    "Haar 2-D": "p",
    "PCA": "<",
    "learned dense": ">",
}


def plot(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(10, 5.5))
    colours = plt.get_cmap("tab20").colors
    for k, family in enumerate(dict.fromkeys(r["family"] for r in rows)):
        mine = sorted((r for r in rows if r["family"] == family and r["total_ops"] > 0), key=lambda r: r["total_ops"])
        if not mine:
            continue
        xs, ys = [r["total_ops"] for r in mine], [r["error"] for r in mine]
        ax.plot(
            xs,
            ys,
            marker=MARKERS.get(family, "o"),
            linestyle="-" if len(mine) > 1 else "none",
            color=colours[(2 * k) % 20 + (2 * k) // 20],
            label=family,
            markersize=9 if len(mine) == 1 else 6,
        )
    floor = [r for r in rows if r["family"] == "identity"]
    if floor:
        ax.axhline(floor[0]["error"], color="grey", linestyle=":", label="identity (T_s of pixels)")
    ax.set_xscale("log")
    ax.set_xlabel("operations per 8x8 patch (additions + multiplications + shifts)")
    ax.set_ylabel(f"representation error (%), s = {S}")
    ax.set_title("Fast transforms of 8x8 image patches: error against cost")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
