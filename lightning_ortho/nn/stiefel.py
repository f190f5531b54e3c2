"""Matrices with orthonormal columns (the Stiefel manifold ``St(n, k) = {Q in F^{n x k} : Q^H Q = I_k}``, ``F`` the
real or complex numbers) from unconstrained coordinates, and back.

The coordinates of ``Q`` are a matrix ``X`` of its own shape ``(..., n, k)``, ``n >= k``, read as Householder
reflections and column phases:

* below the diagonal, column ``i`` of ``X`` holds ``a_i``, the reflection vector ``v_i = e_i + a_i`` (its entries
  above ``i`` are zero, entry ``i`` is one): the reflection ``H_i = I - 2 v_i v_i^H / (v_i^H v_i)``, which is
  Hermitian and unitary (a reflection in the complex case too, unlike LAPACK's ``geqrf`` factors);
* on the diagonal, ``X_ii`` gives column ``i``'s sign (real: ``-1`` where ``X_ii < 0``, else ``1``) or phase
  (complex: ``X_ii / |X_ii|``, ``1`` where ``X_ii = 0``);
* above the diagonal, nothing: those entries are never read.

Then ``Q = H_1 H_2 ... H_k E_k D`` with ``E_k`` the first ``k`` columns of the identity and ``D`` the diagonal of
signs or phases. Every matrix with orthonormal columns has such coordinates (Householder QR of ``Q`` itself ends in
``E_k D``; :func:`stiefel_coordinates`), so the map is onto ``St(n, k)``; ``Q`` is computed in ``O(n k^2)`` by
``torch.linalg.householder_product`` without an ``n x n`` matrix. A sign is piecewise constant (no gradient) and
weight decay only shrinks ``X_ii``, which never changes its sign: the result stays orthonormal whatever an optimiser
does to the diagonal (PyTorch's own Householder map reads the signs as ``int(X_ii)``, which is ``0`` once weight
decay has shrunk ``|X_ii|`` below one).
"""

from __future__ import annotations

import torch


def householder_stiefel(coordinates: torch.Tensor) -> torch.Tensor:
    """``Q = H_1 ... H_k E_k D`` ``(..., n, k)`` with orthonormal columns, from coordinates of the same shape (see the
    module docstring), real or complex.

    Raises:
        ValueError: fewer rows than columns (``n < k``: transpose first), or not a floating-point or complex
            tensor of at least two dims.
    """
    _check_tall(coordinates, "householder_stiefel")
    k = coordinates.shape[-1]
    # u_i = v_i / ||v_i|| with v_i = e_i + (column i below the diagonal)
    vectors = coordinates.tril(diagonal=-1) + torch.eye(
        *coordinates.shape[-2:], dtype=coordinates.dtype, device=coordinates.device
    )
    squared = vectors.real.square() + vectors.imag.square() if vectors.is_complex() else vectors.square()
    unit = vectors * squared.sum(dim=-2, keepdim=True).rsqrt()
    # compact WY: H_1 ... H_k = I - U S^{-1} U^H with S = I/2 + striu(U^H U) (Joffrain et al. 2006), so
    # Q0 = E_k - U S^{-1} (U^H E_k) = E_k - U S^{-1} U[:k]^H: matrix products and one k x k triangular solve, which
    # autograd differentiates in O(n k) memory (torch.linalg.householder_product's backward forms n x n matrices)
    eye = torch.eye(k, dtype=coordinates.dtype, device=coordinates.device)
    s = torch.triu(unit.mH @ unit, diagonal=1) + eye / 2
    top = unit[..., :k, :].mH  # U^H E_k (k, k)
    product = -unit @ torch.linalg.solve_triangular(s, top, upper=True)
    product[..., :k, :] += eye
    return product * column_phases(coordinates).unsqueeze(-2)


def cayley_stiefel(coordinates: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    """``Y = (I - W/2)^{-1} (I + W/2) B`` ``(..., n, k)``: the Cayley transform of the skew(-Hermitian) ``n x n``
    matrix ``W = P Z B^H - B Z^H P`` (``P = I - B B^H / 2``, ``Z`` the coordinates) applied to the base ``B``, which
    has orthonormal columns (Wen and Yin 2013). ``W`` has rank at most ``2k``: with ``U = [P Z, B]`` and
    ``V = [B, -P Z]`` (``W = U V^H``), the Sherman-Morrison-Woodbury identity gives
    ``Y = B + 2 U (2 I - V^H U)^{-1} V^H B``, ``O(n k^2 + k^3)`` and never an ``n x n`` matrix (where ``2k >= n``
    the ``n x n`` system is the smaller one, and it is solved instead). ``W B`` is the
    projection of ``Z`` onto the tangent space at ``B``, so ``Z = 0`` gives ``B``; the part of ``Z`` normal to the
    manifold has no effect (and no gradient). A square base reads ``Z`` in its own frame instead:
    ``Y = B (I - A/2)^{-1} (I + A/2)`` with ``A = (Z - Z^H) / 2``, as PyTorch's square Cayley map is written.
    ``base=None`` is the identity frame ``E_k`` (the first ``k`` columns of the identity: static trivialisation),
    inverted by :func:`cayley_coordinates`.

    Raises:
        ValueError: shapes that differ or ``n < k``.
    """
    # (I - M/2)^{-1} (I + M/2) = 2 (I - M/2)^{-1} - I, the two factors commuting: one solve against the base, no
    # product with it (a quarter less work than a solve and a product, forward and backward)
    square = _square_skew(coordinates, base, "cayley_stiefel")
    if square is not None:  # B square: W = B A B^H, Y = B (I - A/2)^{-1} (I + A/2) = 2 B (I - A/2)^{-1} - B
        eye = torch.eye(square.shape[-1], dtype=square.dtype, device=square.device)
        if base is None:  # B = I
            return 2 * torch.linalg.inv(eye - square / 2) - eye
        base = base.to(square.dtype)
        return 2 * torch.linalg.solve(eye - square / 2, base, left=False) - base
    base = _frame(coordinates) if base is None else base
    w = _dense_skew(coordinates, base, 2)
    if w is not None:  # 2k >= n: the n x n system is the smaller one; Y = 2 (I - W/2)^{-1} B - B
        eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
        base = base.to(w.dtype)
        return 2 * torch.linalg.solve(eye - w / 2, base) - base
    u, v_h_u, v_h_b = _low_rank_skew(coordinates, base)
    eye = torch.eye(v_h_u.shape[-1], dtype=v_h_u.dtype, device=v_h_u.device)
    return base + 2 * u @ torch.linalg.solve(2 * eye - v_h_u, v_h_b)


def exp_stiefel(coordinates: torch.Tensor, base: torch.Tensor | None = None) -> torch.Tensor:
    """``Y = exp(W) B`` ``(..., n, k)`` for the same ``W = U V^H`` as :func:`cayley_stiefel`:
    ``exp(U V^H) = I + U phi(V^H U) V^H`` with ``phi(M) = sum_j M^j / (j + 1)! = (e^M - I) M^{-1}``, read off the
    exponential of the ``4k x 4k`` block matrix ``[[M, I], [0, 0]]`` (whose top right block is ``phi(M)``), so
    ``Y = B + U phi(V^H U) V^H B`` in ``O(n k^2 + k^3)`` (where ``4k >= n``, ``exp(W) B`` with the ``n x n``
    exponential, the smaller one; a square base: ``Y = B exp(A)``, ``A = (Z - Z^H) / 2``, as for
    :func:`cayley_stiefel`). ``base=None`` is the identity frame ``E_k``; a square ``Y`` is inverted by
    :func:`exp_coordinates`.

    Raises:
        ValueError: shapes that differ or ``n < k``.
    """
    square = _square_skew(coordinates, base, "exp_stiefel")
    if square is not None:  # B square: W = B A B^H, Y = B exp(A)
        rotation = torch.linalg.matrix_exp(square)
        return rotation if base is None else base.to(square.dtype) @ rotation
    base = _frame(coordinates) if base is None else base
    w = _dense_skew(coordinates, base, 4)
    if w is not None:  # 4k >= n: the n x n exponential is the smaller one
        return torch.linalg.matrix_exp(w) @ base.to(w.dtype)
    u, v_h_u, v_h_b = _low_rank_skew(coordinates, base)
    m = v_h_u.shape[-1]
    block = v_h_u.new_zeros((*v_h_u.shape[:-2], 2 * m, 2 * m))
    block[..., :m, :m] = v_h_u
    block[..., :m, m:] = torch.eye(m, dtype=v_h_u.dtype, device=v_h_u.device)
    phi = torch.linalg.matrix_exp(block)[..., :m, m:]
    return base + u @ (phi @ v_h_b)


@torch.no_grad()
def cayley_coordinates(orthonormal: torch.Tensor) -> torch.Tensor:
    """Coordinates ``Z = [A; C]`` ``(..., n, k)`` with ``cayley_stiefel(Z) = Q`` in the identity frame, for ``Q``
    ``(..., n, k)`` with orthonormal columns. With ``Q = [Q_1; Q_2]`` (``Q_1`` its top ``k x k`` block) the frame's
    skew matrix is ``W = [[A, -C^H], [C, 0]]``, and ``(I - W/2) Q = (I + W/2) E_k`` solves to
    ``C = 2 Q_2 (I + Q_1)^{-1}``, ``A = (2 (Q_1 - I) + C^H Q_2) (I + Q_1)^{-1}`` (the inverse Cayley transform
    ``2 (Q - I) (Q + I)^{-1}`` where ``Q`` is square). It exists where ``-1`` is not an eigenvalue of ``Q_1``: never
    for a real square ``Q`` of determinant ``-1`` (the Cayley map reaches ``SO(n)`` only), almost always otherwise.
    The result is not checked here; map it back to see how well it was determined.

    Raises:
        ValueError: ``n < k``, or not a floating-point or complex tensor of at least two dims.
    """
    _check_tall(orthonormal, "cayley_coordinates")
    k = orthonormal.shape[-1]
    top, bottom = orthonormal[..., :k, :], orthonormal[..., k:, :]
    eye = torch.eye(k, dtype=orthonormal.dtype, device=orthonormal.device)
    shifted = top + eye  # I + Q_1
    lower = 2 * torch.linalg.solve(shifted, bottom, left=False)  # C
    upper = torch.linalg.solve(shifted, 2 * (top - eye) + lower.mH @ bottom, left=False)  # A
    return torch.cat(((upper - upper.mH) / 2, lower), dim=-2)


@torch.no_grad()
def exp_coordinates(orthonormal: torch.Tensor) -> torch.Tensor:
    """The principal logarithm ``A`` ``(..., n, n)`` (skew(-Hermitian), eigenvalues ``i theta`` with
    ``|theta| < pi``) of a square orthogonal or unitary ``Q``, so that ``exp_stiefel(A) = Q`` in the identity frame.
    ``Q`` is normal, so it shares its eigenvectors with its Cayley transform ``S = (Q - I) (Q + I)^{-1}``, whose
    eigenvalue for ``e^{i theta}`` is ``i tan(theta / 2)``: the Hermitian eigendecomposition ``-i S = V T V^H`` gives
    ``A = V diag(2 i atan(T)) V^H`` (computed in double precision; the real part for a real ``Q``). It exists where
    ``-1`` is not an eigenvalue of ``Q``: never for a real ``Q`` of determinant ``-1`` (the exponential reaches
    ``SO(n)`` only). The result is not checked here.

    Raises:
        ValueError: a matrix that is not square, or not a floating-point or complex tensor of at least two dims.
    """
    _check_tall(orthonormal, "exp_coordinates")
    n, k = orthonormal.shape[-2:]
    if n != k:
        raise ValueError(
            f"exp_coordinates: the logarithm of a tall {n} x {k} matrix in the identity frame has no closed form;"
            " pass a square matrix."
        )
    work = orthonormal.to(torch.complex128)
    eye = torch.eye(n, dtype=work.dtype, device=work.device)
    cayley = torch.linalg.solve(work + eye, work - eye, left=False)  # S = (Q - I)(Q + I)^{-1}
    hermitian = -1j * cayley
    values, vectors = torch.linalg.eigh((hermitian + hermitian.mH) / 2)
    logarithm = (vectors * (2j * torch.atan(values)).unsqueeze(-2)) @ vectors.mH
    logarithm = (logarithm - logarithm.mH) / 2
    return (logarithm if orthonormal.is_complex() else logarithm.real).to(orthonormal.dtype)


def _frame(coordinates: torch.Tensor) -> torch.Tensor:
    """The identity frame ``E_k`` (the first ``k`` columns of the identity) in the shape of ``coordinates``."""
    n, k = coordinates.shape[-2:]
    return torch.eye(n, k, dtype=coordinates.dtype, device=coordinates.device).expand(coordinates.shape)


def _square_skew(coordinates: torch.Tensor, base: torch.Tensor | None, where: str) -> torch.Tensor | None:
    """For a square base (``n = k``, ``B B^H = I``, so ``P = I/2``): ``A = (Z - Z^H) / 2`` read in the base's frame,
    with ``W = B A B^H`` the skew matrix of the coordinates ``Z' = B Z`` (any ``Z'`` is one: the map from ``Z`` is
    the same trivialisation in other coordinates, a matrix product cheaper); else ``None``. Checks the shapes."""
    _check_tall(coordinates, where)
    if base is not None and coordinates.shape != base.shape:
        raise ValueError(
            f"{where}: the coordinates {tuple(coordinates.shape)} and the base {tuple(base.shape)} differ in shape."
        )
    if coordinates.shape[-2] != coordinates.shape[-1]:
        return None
    return (coordinates - coordinates.mH) / 2


def _dense_skew(coordinates: torch.Tensor, base: torch.Tensor, per_column: int) -> torch.Tensor | None:
    """``W = P Z B^H - B Z^H P`` ``(..., n, n)`` where the low-rank form's matrices (``per_column * k`` square: the
    Cayley system ``2k``, the exponential's block ``4k``) would be as large as ``n`` (the dense form is then the
    cheaper one), else ``None``."""
    n, k = coordinates.shape[-2:]
    if per_column * k < n:
        return None
    base = base.to(coordinates.dtype)
    half = (coordinates - base @ (base.mH @ coordinates) / 2) @ base.mH  # P Z B^H
    return half - half.mH


def _low_rank_skew(coordinates: torch.Tensor, base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(U, V^H U, V^H B)`` of ``W = U V^H`` (see :func:`cayley_stiefel`)."""
    base = base.to(coordinates.dtype)
    b_h_z = base.mH @ coordinates
    pz = coordinates - base @ b_h_z / 2  # P Z
    u = torch.cat((pz, base), dim=-1)
    pz_h_pz, b_h_pz = pz.mH @ pz, b_h_z - (base.mH @ base) @ b_h_z / 2
    # V^H U = [[B^H P Z, B^H B], [-(P Z)^H P Z, -(P Z)^H B]], V^H B = [[B^H B], [-(P Z)^H B]]
    b_h_b = base.mH @ base
    top = torch.cat((b_h_pz, b_h_b), dim=-1)
    bottom = torch.cat((-pz_h_pz, -b_h_pz.mH), dim=-1)
    v_h_u = torch.cat((top, bottom), dim=-2)
    v_h_b = torch.cat((b_h_b, -b_h_pz.mH), dim=-2)
    return u, v_h_u, v_h_b


def column_phases(coordinates: torch.Tensor) -> torch.Tensor:
    """``(..., k)``: the signs (real) or unit phases (complex) that the diagonal of ``coordinates`` gives the columns;
    ``1`` where an entry is zero."""
    diagonal = coordinates.diagonal(dim1=-2, dim2=-1)
    if diagonal.is_complex():
        modulus = diagonal.abs()
        return torch.where(modulus > 0, diagonal / torch.where(modulus > 0, modulus, 1.0), 1.0).to(diagonal.dtype)
    return torch.where(diagonal < 0, -1.0, 1.0).to(diagonal.dtype)


@torch.no_grad()
def stiefel_coordinates(orthonormal: torch.Tensor) -> torch.Tensor:
    """Coordinates ``X`` with ``householder_stiefel(X) = Q`` (to rounding), for ``Q`` ``(..., n, k)`` with
    orthonormal columns: Householder QR of ``Q`` with reflections (``v = c - alpha e_1``, ``alpha`` of modulus
    ``||c||`` and the opposite phase of ``c``'s first entry, so that nothing cancels), computed in double precision.
    The unused entries above the diagonal are zero.

    Raises:
        ValueError: ``n < k``, or not a floating-point or complex tensor of at least two dims.
    """
    _check_tall(orthonormal, "stiefel_coordinates")
    wide = torch.complex128 if orthonormal.is_complex() else torch.float64
    work = orthonormal.to(wide).clone()
    n, k = work.shape[-2:]
    coordinates = torch.zeros_like(work)
    for j in range(k):
        column = work[..., j:, j]  # (..., n - j)
        first = column[..., 0]
        norm = torch.linalg.vector_norm(column, dim=-1)
        modulus = first.abs()
        phase = torch.where(modulus > 0, first / torch.where(modulus > 0, modulus, 1.0), 1.0).to(wide)
        alpha = -phase * norm  # reflected onto alpha e_1; |first - alpha| = |first| + norm: no cancellation
        head = first - alpha
        safe_head = torch.where(head != 0, head, 1.0)  # a zero column (not orthonormal): any reflection will do
        tail = column[..., 1:] / safe_head.unsqueeze(-1)
        coordinates[..., j + 1 :, j] = tail
        coordinates[..., j, j] = torch.where(norm > 0, alpha / torch.where(norm > 0, norm, 1.0), 1.0)
        # apply H_j (v = e_1 + tail) to the remaining block: W <- W - 2 v (v^H W) / (v^H v)
        v = torch.cat((torch.ones_like(first).unsqueeze(-1), tail), dim=-1)
        scale = 2.0 / torch.linalg.vector_norm(v, dim=-1).square()
        block = work[..., j:, j:]
        work[..., j:, j:] = block - (scale.unsqueeze(-1) * v).unsqueeze(-1) * (v.conj().unsqueeze(-2) @ block)
    return coordinates.to(orthonormal.dtype)


def sample_haar_stiefel(
    shape: tuple[int, ...],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """A matrix ``(..., n, k)`` (``n >= k``) with orthonormal columns drawn uniformly (Haar measure): the ``Q`` of
    the QR decomposition of a Gaussian matrix with the signs (phases) of ``R``'s diagonal moved into ``Q``
    (Mezzadri 2007), drawn in double precision.

    Raises:
        ValueError: ``n < k`` or fewer than two dims.
    """
    if len(shape) < 2 or shape[-2] < shape[-1]:
        raise ValueError(f"sample_haar_stiefel: shape must be (..., n, k) with n >= k, got {tuple(shape)}.")
    wide = torch.complex128 if dtype.is_complex else torch.float64
    if generator is not None and device is None:
        device = generator.device
    gaussian = torch.randn(shape, dtype=wide, device=device, generator=generator)  # complex: circular Gaussian
    q, r = torch.linalg.qr(gaussian)
    return (q * column_phases(r).unsqueeze(-2)).to(dtype)


def project_to_stiefel(matrix: torch.Tensor) -> torch.Tensor:
    """The orthonormal-columns factor of ``matrix`` ``(..., n, k)`` (``n >= k``) by QR, with the signs (phases) of
    ``R``'s diagonal moved into it, so that a matrix that already has orthonormal columns is returned as it is (to
    rounding). This is the projection PyTorch's and geotorch's parametrisations apply to a non-orthogonal matrix.

    Raises:
        ValueError: ``n < k``, or a rank-deficient matrix (its QR factor is not determined).
    """
    _check_tall(matrix, "project_to_stiefel")
    q, r = torch.linalg.qr(matrix)
    diagonal = r.diagonal(dim1=-2, dim2=-1)
    if diagonal.numel() and not bool((diagonal.abs() > 0).all()):
        raise ValueError(
            "project_to_stiefel: the matrix is rank deficient (a zero on R's diagonal), so no orthonormal factor is"
            " determined; initialise the weight with init='haar' or 'identity' instead."
        )
    return q * column_phases(r).unsqueeze(-2)


@torch.no_grad()
def orthonormalize_(matrix: torch.Tensor) -> torch.Tensor:
    """Replace ``matrix`` ``(..., n, k)`` (``n >= k``), in place, by its polar factor ``U V^H`` (the nearest matrix
    with orthonormal columns) where its columns are not orthonormal to ``10 n eps`` of its dtype: a float32 matrix
    cast to float64 is orthonormal only to ~1e-7. One that passes is left bit for bit; meta, empty and half-precision
    matrices are left alone. Returns ``matrix``."""
    if matrix.device.type == "meta" or matrix.numel() == 0 or matrix.dtype in (torch.float16, torch.bfloat16):
        return matrix
    if float(orthonormality_error(matrix)) <= 10 * matrix.shape[-2] * torch.finfo(matrix.dtype).eps:
        return matrix
    u, _, v_h = torch.linalg.svd(matrix, full_matrices=False)
    return matrix.copy_(u @ v_h)


def orthonormality_error(matrix: torch.Tensor) -> torch.Tensor:
    """``max |Q^H Q - I|`` over the batch (a 0-d tensor) for ``Q`` ``(..., n, k)``, ``n >= k``."""
    gram = matrix.mH @ matrix
    eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    return (gram - eye).abs().amax() if gram.numel() else gram.new_zeros((), dtype=gram.real.dtype)


def _check_tall(matrix: torch.Tensor, where: str) -> None:
    if not isinstance(matrix, torch.Tensor) or matrix.dim() < 2:
        raise ValueError(f"{where}: expected a tensor of shape (..., n, k), got {_describe(matrix)}.")
    if not (matrix.is_floating_point() or matrix.is_complex()):
        raise ValueError(f"{where}: expected a floating-point or complex tensor, got {matrix.dtype}.")
    if matrix.shape[-2] < matrix.shape[-1]:
        raise ValueError(
            f"{where}: expected (..., n, k) with n >= k, got {tuple(matrix.shape)}; pass the transpose (rows then"
            " come out orthonormal)."
        )


def _describe(value: object) -> str:
    return str(tuple(value.shape)) if isinstance(value, torch.Tensor) else type(value).__name__
