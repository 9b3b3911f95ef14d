"""Input generators, a portable reference, the contest's correctness check, and exact one-hot probes.

Computes c[m, 0, l] = fp16(sum_k A[m,k,l] * SFA[m,k/16,l] * B[0,k,l] * SFB[0,k/16,l]) with the contest's tuple
(a, b, sfa, sfb, sfa_permuted, sfb_permuted, c) of docs/contract.md: fp4 e2m1 packed two a byte (even K index in the low
nibble), one e4m3 scale per 16 K elements, batch-major memory. The reference decodes fp4 through a 16-entry LUT and
e4m3 through torch's float8 cast, multiplies in fp32 (each product of two scaled fp4 values is exact in fp32),
accumulates in fp32 and rounds once to fp16. It uses only elementwise torch ops (no `torch._scaled_mm`, no matmul
that TF32 could change), so it runs on the CPU and on any GPU, and it indexes tensors logically, never by stride.
"""

from __future__ import annotations

import torch

from layouts.convert import plain_to_permuted
from layouts.constants import SF_VEC
from nvfp4_gemv.validate import B_ROWS, validate_problem

# Value of each e2m1 code: bit 3 is the sign, bits 2..0 index the magnitudes.
FP4_E2M1_LUT: tuple[float, ...] = (
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)  # fmt: skip

E4M3_ONE = 0x38  # e4m3 byte of 1.0
FP4_ONE = 0x2  # e2m1 code of 1.0
E4M3_NAN = (0x7F, 0xFF)  # the only non-finite e4m3fn bytes

# Contest scales are the e4m3 values 0, 1, 2.
_CONTEST_SCALE_BYTES = (0x00, E4M3_ONE, 0x40)
# Full-range A scales: every finite e4m3 byte with the sign bit clear (0 through 448, subnormals included).
_FULL_SCALE_BYTES = tuple(range(0x7F))
# Full-range b scales: exponent field 0..3, i.e. 0, the 7 subnormals and the normals up to 0.1171875.
_SMALL_SCALE_BYTES = tuple(range(0x20))
_NONFINITE_COUNT = 3

# Rows of A decoded at once by ref_kernel: bounds its fp32 temporaries to about 3 * 32 MiB.
_REF_CHUNK_ELEMS = 1 << 23


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.uint8:
        return t
    if t.element_size() != 1:
        raise ValueError(f"expected a 1-byte dtype (uint8, float4_e2m1fn_x2 or float8_e4m3fn), got {t.dtype}")
    return t.view(torch.uint8)


def dequant_fp4(packed: torch.Tensor) -> torch.Tensor:
    """Packed fp4 bytes (..., n) (uint8 or float4_e2m1fn_x2) -> float32 values (..., 2n), low nibble first."""
    p = _as_bytes(packed)
    lut = torch.tensor(FP4_E2M1_LUT, dtype=torch.float32, device=p.device)
    lo = lut[(p & 0xF).long()]
    hi = lut[(p >> 4).long()]
    return torch.stack((lo, hi), dim=-1).flatten(-2)


def decode_e4m3(t: torch.Tensor) -> torch.Tensor:
    """e4m3fn bytes (uint8 or float8_e4m3fn) -> float32 values; 0x7F and 0xFF are NaN."""
    return _as_bytes(t).view(torch.float8_e4m3fn).float()


def _scaled_products(data, dtype):
    """Yield (batch, first row, last row + 1, products) with products[r, j, e] = A·sfa·b·sfb of row r, 16-element
    block j, element e, computed in `dtype` a row chunk at a time (temporaries bounded by _REF_CHUNK_ELEMS)."""
    a, b, sfa, sfb, _, _, _ = data
    m, kb, l = a.shape  # noqa: E741
    k = 2 * kb
    blocks = k // SF_VEC
    rows = max(1, _REF_CHUNK_ELEMS // k)
    # Row 0 of b, scaled: (L, K/16, 16).
    b_scaled = dequant_fp4(b[0].T).to(dtype).view(l, blocks, SF_VEC) * decode_e4m3(sfb[0].T).to(dtype).unsqueeze(-1)
    for li in range(l):
        for m0 in range(0, m, rows):
            m1 = min(m, m0 + rows)
            products = dequant_fp4(a[m0:m1, :, li]).to(dtype).view(m1 - m0, blocks, SF_VEC)
            products *= decode_e4m3(sfa[m0:m1, :, li]).to(dtype).unsqueeze(-1)
            products *= b_scaled[li]
            yield li, m0, m1, products


def ref_kernel(data) -> torch.Tensor:
    """Reference GEMV: fills data's c with fp16(fp32 sum of the scaled products) and returns it."""
    c = data[-1]
    for li, m0, m1, products in _scaled_products(data, torch.float32):
        c[m0:m1, 0, li] = products.sum(dim=(1, 2), dtype=torch.float32).to(torch.float16)
    return c


def check(out: torch.Tensor, ref: torch.Tensor, rtol: float = 1e-3, atol: float = 1e-3) -> tuple[bool, str]:
    """The contest's check: an element fails if |out - ref| > atol + rtol*|ref| or its NaN/+Inf/-Inf status differs.

    Returns (passed, message); on failure the message gives the count and the worst element.
    """
    if tuple(out.shape) != tuple(ref.shape):
        return False, f"shape mismatch: got {tuple(out.shape)}, expected {tuple(ref.shape)}"
    o = out.detach().to(device="cpu", dtype=torch.float64)
    r = ref.detach().to(device="cpu", dtype=torch.float64)
    inf = float("inf")
    status_bad = (o.isnan() != r.isnan()) | ((o == inf) != (r == inf)) | ((o == -inf) != (r == -inf))
    finite = o.isfinite() & r.isfinite()
    diff = (o - r).abs()
    allowed = atol + rtol * r.abs()
    tol_bad = finite & (diff > allowed)
    bad = status_bad | tol_bad
    n_bad = int(bad.sum())
    if n_bad == 0:
        return True, f"all {o.numel()} elements match"
    if bool(status_bad.any()):
        flat = int(status_bad.flatten().nonzero()[0])
        why = "NaN/Inf status differs"
    else:
        excess = torch.where(tol_bad, diff - allowed, torch.full_like(diff, -inf))
        flat = int(excess.flatten().argmax())
        why = f"|diff| {diff.flatten()[flat].item():.6g} > allowed {allowed.flatten()[flat].item():.6g}"
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), o.shape))
    return False, (
        f"{n_bad} of {o.numel()} elements mismatch (rtol={rtol}, atol={atol}); worst at {idx}: "
        f"got {o.flatten()[flat].item():.6g}, expected {r.flatten()[flat].item():.6g} ({why})"
    )


FP16_OVERFLOW = 65520.0  # |x| at or above this rounds to fp16 infinity


def exact_gemv(data) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact, magnitude), float64 (M, L): Σ_k of the scaled products, and Σ_k of their absolute values.

    Every scaled product is exact in float64, and so is each 16-element block's sum; the sum over blocks carries at
    most a few float64 rounding errors, far below any fp32 effect."""
    a = data[0]
    exact = torch.empty((a.shape[0], a.shape[2]), dtype=torch.float64, device=a.device)
    mag = torch.empty_like(exact)
    for li, m0, m1, products in _scaled_products(data, torch.float64):
        exact[m0:m1, li] = products.sum(dim=(1, 2))
        mag[m0:m1, li] = products.abs().sum(dim=(1, 2))
    return exact, mag


def check_fp32_bound(out: torch.Tensor, data, rtol: float = 1e-3, atol: float = 1e-3) -> tuple[bool, str]:
    """Check `out` (M, 1, L) against the exact sum, allowing the contest's tolerance plus the worst-case error of
    any fp32 summation order of the K/16 exact block terms:
    |out - exact| <= atol + rtol·|exact| + (K/16)·2⁻²⁴·Σ|terms|.

    The contest's own check compares against an fp32 reference, which carries such an error too: on full-range data
    (scales up to 448, sums that cancel), two correct kernels that add in different orders can differ by more than
    1e-3. This bound holds for every order, yet a single wrong block term (a scale, a sign, a nibble) exceeds it
    by two orders of magnitude. NaN must match NaN; where the bound straddles fp16 overflow, ±inf or finite pass."""
    exact, mag = exact_gemv(data)
    k = 2 * data[0].shape[1]
    o = out.detach()[:, 0, :].to(dtype=torch.float64, device=exact.device)
    tol = atol + rtol * exact.abs() + (k // SF_VEC) * 2.0**-24 * mag
    nan_bad = o.isnan() != exact.isnan()
    must_inf = exact.abs() - tol >= FP16_OVERFLOW
    may_inf = exact.abs() + tol >= FP16_OVERFLOW
    inf_bad = (must_inf & ((o != torch.sign(exact) * float("inf")))) | (~may_inf & o.isinf())
    both = o.isfinite() & exact.isfinite()
    diff = (o - exact).abs()
    tol_bad = both & ~must_inf & (diff > tol)
    bad = nan_bad | inf_bad | tol_bad
    n_bad = int(bad.sum())
    if n_bad == 0:
        return True, f"all {o.numel()} elements within the fp32 bound"
    flat = int(bad.flatten().nonzero()[0])
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), o.shape))
    return False, (
        f"{n_bad} of {o.numel()} elements outside the fp32 bound; first at (row, batch) {idx}: got "
        f"{o.flatten()[flat].item():.6g}, exact {exact.flatten()[flat].item():.6g}, allowed ±"
        f"{tol.flatten()[flat].item():.3g}"
    )


def _generator(seed: int, device) -> torch.Generator:
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(seed)
    return g


def _draw(table, shape, g: torch.Generator, device) -> torch.Tensor:
    """uint8 tensor of `shape`, each element drawn uniformly from the byte values in `table`."""
    t = torch.tensor(table, dtype=torch.uint8, device=device)
    return t[torch.randint(0, len(table), shape, generator=g, device=device)]


def _assemble(a_u8, b_u8, sfa_u8, sfb_u8, device):
    """Batch-major byte tensors (L, rows, cols) -> the contest tuple with its dtypes, shapes and strides."""
    l, m, _ = a_u8.shape  # noqa: E741
    a = a_u8.permute(1, 2, 0).view(torch.float4_e2m1fn_x2)
    b = b_u8.permute(1, 2, 0).view(torch.float4_e2m1fn_x2)
    sfa = sfa_u8.permute(1, 2, 0).view(torch.float8_e4m3fn)
    sfb = sfb_u8.permute(1, 2, 0).view(torch.float8_e4m3fn)
    c = torch.zeros((l, m, 1), dtype=torch.float16, device=device).permute(1, 2, 0)
    return a, b, sfa, sfb, plain_to_permuted(sfa), plain_to_permuted(sfb), c


def _draw_all(m, k, l, seed, device, byte_values, sfa_bytes, sfb_bytes):  # noqa: E741
    """(generator, (a, b, sfa, sfb) as batch-major uint8): fp4 bytes uniform in [0, byte_values), scale bytes
    uniform over the given tables, in one seeded order."""
    m, k, l = validate_problem(m, k, l)  # noqa: E741
    g = _generator(seed, device)
    a = torch.randint(0, byte_values, (l, m, k // 2), dtype=torch.uint8, generator=g, device=device)
    b = torch.randint(0, byte_values, (l, B_ROWS, k // 2), dtype=torch.uint8, generator=g, device=device)
    sfa = _draw(sfa_bytes, (l, m, k // SF_VEC), g, device)
    sfb = _draw(sfb_bytes, (l, B_ROWS, k // SF_VEC), g, device)
    return g, (a, b, sfa, sfb)


def generate_input(m: int, k: int, l: int, seed: int, device="cpu"):  # noqa: E741
    """The contest's data: A and b bytes uniform in {0,1,2,3}, scales uniform in the e4m3 values {0,1,2}.

    Deterministic for a (seed, device type); the same seed gives different data on the CPU and on a GPU.
    """
    g, (a, b, sfa, sfb) = _draw_all(m, k, l, seed, device, 4, _CONTEST_SCALE_BYTES, _CONTEST_SCALE_BYTES)
    return _assemble(a, b, sfa, sfb, device)


def generate_full_range(m: int, k: int, l: int, seed: int, device="cpu", nonfinite: bool = False):  # noqa: E741
    """Full-range data: every fp4 code in A and b (all 256 bytes, negatives and -0 included); scales over e4m3.

    SFA is uniform over all 127 non-negative finite e4m3 bytes (0, subnormals, up to 448). SFB is uniform over the
    bytes with exponent field <= 3 (0, subnormals, normals up to 0.1171875): with SFA's heavy tail this keeps the
    median |c| near 30*sqrt(K) and |c| below ~25000 at K = 16384, inside fp16, and keeps the fp32 rounding of
    the sum (order-dependent, up to ~0.015 at K = 16384) small against the check's atol on all but rare rows
    with |c| near 0. Scale bytes never carry the sign bit: NVFP4 block scaling reads scales as unsigned UE4M3
    (cuBLAS, tcgen05 `mxf4nvf4`), so a negative scale has no meaning the contest's reference agrees on.
    nonfinite=True then sets 3 seeded SFA bytes to NaN (0x7F, 0xFF alternating), leaving all else as with
    nonfinite=False; each such row of c is NaN.
    """
    g, (a, b, sfa, sfb) = _draw_all(m, k, l, seed, device, 256, _FULL_SCALE_BYTES, _SMALL_SCALE_BYTES)
    if nonfinite:
        pos = torch.randint(0, sfa.numel(), (_NONFINITE_COUNT,), generator=g, device=device)
        nan_bytes = torch.tensor([E4M3_NAN[i % 2] for i in range(_NONFINITE_COUNT)], dtype=torch.uint8, device=device)
        sfa.view(-1)[pos] = nan_bytes
    return _assemble(a, b, sfa, sfb, device)


def one_hot_probe(m: int, k: int, l: int, col: int, seed: int, device="cpu"):  # noqa: E741
    """Data whose exact output is one dequantized column of A: c[:, 0, :] == fp16(A[:, col, :]).

    A is full range (all 256 bytes) with unit scales; row 0 of b is 1.0 (code 2) at K index `col` and 0 elsewhere,
    with unit scales. Rows 1..127 of b and sfb hold random full-range bytes and scales, which a correct kernel
    never reads. Every output is a single exact product, so a correct kernel matches `probe_expected` bit for bit
    (up to the sign of zero).
    """
    m, k, l = validate_problem(m, k, l)  # noqa: E741
    if not 0 <= col < k:
        raise ValueError(f"col must be in [0, {k}), got {col}")
    g = _generator(seed, device)
    a = torch.randint(0, 256, (l, m, k // 2), dtype=torch.uint8, generator=g, device=device)
    b = torch.randint(0, 256, (l, B_ROWS, k // 2), dtype=torch.uint8, generator=g, device=device)
    sfb = _draw(_SMALL_SCALE_BYTES, (l, B_ROWS, k // SF_VEC), g, device)
    sfa = torch.full((l, m, k // SF_VEC), E4M3_ONE, dtype=torch.uint8, device=device)
    b[:, 0] = 0
    b[:, 0, col // 2] = FP4_ONE << (4 * (col % 2))
    sfb[:, 0] = E4M3_ONE
    return _assemble(a, b, sfa, sfb, device)


def probe_expected(data, col: int) -> torch.Tensor:
    """Exact output for data whose row 0 of b is zero except at K index `col`: fp16(A*SFA*B*SFB) at column `col`.

    Returns a new (M, 1, L) float16 tensor with c's strides; zeros are +0.
    """
    a, b, sfa, sfb, _, _, c = data
    shift = 4 * (col % 2)
    lut = torch.tensor(FP4_E2M1_LUT, dtype=torch.float32, device=a.device)
    a_val = lut[((_as_bytes(a[:, col // 2, :]) >> shift) & 0xF).long()]  # (M, L)
    b_val = lut[((_as_bytes(b[0, col // 2, :]) >> shift) & 0xF).long()]  # (L,)
    prod = a_val * decode_e4m3(sfa[:, col // SF_VEC, :]) * (b_val * decode_e4m3(sfb[0, col // SF_VEC, :]))
    out = torch.empty_like(c)
    out[:, 0, :] = (prod + 0.0).to(torch.float16)
    return out
