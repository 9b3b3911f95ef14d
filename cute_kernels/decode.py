"""Device helpers shared by the CUDA-core kernels: fp4 (e2m1) decode, e4m3 scale decode, and the exact 16-element
block dot product. The helpers are the arch switch: sm_90 has no fp4 conversion, so it maps nibbles to int8 with
`prmt` lookups and multiplies with `dp4a`; sm_100 has `cvt.rn.f16x2.e2m1x2` and multiplies with `fma.rn.f16x2`.

Both paths compute each 16-element block sum exactly (an int32 of 4·a·b on sm_90; two f16 lanes of ≤ 8 products,
each a multiple of 0.25 with |sum| ≤ 288, on sm_100), so a kernel's only rounding is its fp32 sum over blocks.

    sm_90 lookup: prmt(LUT_LO, LUT_HI, sel) picks byte sel[2:0] of {LUT_HI:LUT_LO} for each selector nibble; a
    nibble with bit 3 set (a negative code) yields the sign of that byte instead, and every LUT byte is positive, so
    it yields 0. The codes of x give the positive part P, the codes of x ^ 0x8888 the magnitudes N of the negative
    part, and a·b = P·b - N·b, with b prepared once per piece as signed int8 (SWAR: per byte p + 128 - n, bit 7
    flipped back).
"""

from cutlass import Float32, Int32, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels.ptx import asm_u32, inline_ptx

# 2·|e2m1| for codes 0..7 (0, 0.5, 1, 1.5, 2, 3, 4, 6), one byte each, as prmt's 8-byte table.
E2M1X2_LUT_LO = 0x03020100
E2M1X2_LUT_HI = 0x0C080604
SIGN_BITS = 0x88888888
# Per byte: p + 128 - n (no borrow across bytes since p, n <= 12), then flip bit 7 back: p - n as int8.
BYTE_BIAS = 0x80808080
# The fp32 1.5·2²³ as bits. An int32 v with |v| < 2²² added to these bits gives the float 1.5·2²³ + v exactly,
# so bits(v + MAGIC) - 1.5·2²³ is float(v) in one IADD and one FADD (full-rate pipes) instead of an I2F.
MAGIC_BITS = 0x4B400000
MAGIC = 12582912.0


def lut_registers(arch: str, slot):
    """The lookup table of block_dot and prepare_b, in two vector registers; call once, outside the K loop.

    `slot` is this lane's 2 words of shared memory. With a literal table, or one loaded from a warp-uniform address,
    ptxas keeps it in a uniform register and copies it into a vector register before every PRMT (sm_90 SASS: 69
    extra instructions in a 430-instruction loop body, BENCHMARKS.md). Stored and read back through a per-lane
    address with a volatile load, it stays in two registers."""
    if const_expr(arch == "sm_90"):
        slot[0] = Uint32(E2M1X2_LUT_LO)
        slot[1] = Uint32(E2M1X2_LUT_HI)
        addr = slot.iterator.toint()
        return (_ld_shared_volatile(addr), _ld_shared_volatile(addr + 4))
    return (Uint32(0), Uint32(0))


@dsl_user_op
def _ld_shared_volatile(addr, *, loc=None, ip=None) -> Uint32:
    # An asm load: NVVM may not forward the stored constant into it, and ptxas cannot rematerialize it.
    return Uint32(
        inline_ptx(
            T.i32(), [Int32(addr).ir_value(loc=loc, ip=ip)], "ld.volatile.shared.b32 $0, [$1];", "=r,r,~{memory}",
            side_effects=True, loc=loc, ip=ip,
        )
    )


@dsl_user_op
def prmt(lo, hi, sel, *, loc=None, ip=None) -> Uint32:
    """`prmt.b32`: four bytes of {hi:lo} chosen by the four low selector nibbles of `sel` (one PRMT)."""
    return asm_u32([lo, hi, sel], "prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", loc, ip)


@dsl_user_op
def dp4a(a, b, c, *, loc=None, ip=None) -> Int32:
    """`dp4a.s32.s32`: c + the dot product of the four signed bytes of a and b (one IDP.4A)."""
    return Int32(asm_u32([a, b, c], "dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", loc, ip))


@dsl_user_op
def e4m3x2_to_f16x2(pair, *, loc=None, ip=None) -> Uint32:
    """Two e4m3 bytes (low 16 bits of `pair`, the first in the low byte) to f16x2 (`cvt.rn.f16x2.e4m3x2`, sm_89
    and later, sm_90 included): every finite e4m3 value, subnormals included, is exact in f16, and NaN stays NaN."""
    return asm_u32(
        [pair], "{\n\t.reg .b16 s;\n\tcvt.u16.u32 s, $1;\n\tcvt.rn.f16x2.e4m3x2 $0, s;\n\t}", "=r,r", loc, ip
    )


@dsl_user_op
def e4m3x2_to_f32x2(pair, *, loc=None, ip=None):
    """Two e4m3 bytes (low 16 bits of `pair`, first scale in the low byte) to two exact fp32 values."""
    h2 = e4m3x2_to_f16x2(pair, loc=loc, ip=ip)
    lo = asm_u32([h2], "{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, $1;\n\tcvt.f32.f16 $0, l;\n\t}", "=r,r", loc, ip)
    hi = asm_u32([h2], "{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, $1;\n\tcvt.f32.f16 $0, h;\n\t}", "=r,r", loc, ip)
    return (
        Float32(llvm.bitcast(T.f32(), lo.ir_value(loc=loc, ip=ip), loc=loc, ip=ip)),
        Float32(llvm.bitcast(T.f32(), hi.ir_value(loc=loc, ip=ip), loc=loc, ip=ip)),
    )


@dsl_user_op
def e2m1x2_to_f16x2(byte_word, *, loc=None, ip=None) -> Uint32:
    """`cvt.rn.f16x2.e2m1x2` (sm_100a and later): the low byte's two codes to f16x2, even element in the low half."""
    return asm_u32(
        [byte_word],
        "{\n\t.reg .b8 s;\n\tcvt.u8.u32 s, $1;\n\tcvt.rn.f16x2.e2m1x2 $0, s;\n\t}",
        "=r,r",
        loc,
        ip,
    )


@dsl_user_op
def hfma2(a, b, c, *, loc=None, ip=None) -> Uint32:
    """`fma.rn.f16x2` on packed words (one HFMA2)."""
    return asm_u32([a, b, c], "fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r", loc, ip)


@dsl_user_op
def f16x2_sum_f32(h2, *, loc=None, ip=None) -> Float32:
    """The two f16 lanes of a packed word, each widened exactly to fp32, then added in fp32."""
    s = asm_u32(
        [h2],
        "{\n\t.reg .b16 l, h;\n\t.reg .f32 a, b;\n\tmov.b32 {l, h}, $1;\n\tcvt.f32.f16 a, l;\n\t"
        "cvt.f32.f16 b, h;\n\tadd.rn.f32 a, a, b;\n\tmov.b32 $0, a;\n\t}",
        "=r,r",
        loc,
        ip,
    )
    return Float32(llvm.bitcast(T.f32(), s.ir_value(loc=loc, ip=ip), loc=loc, ip=ip))


# --- the arch switch --------------------------------------------------------------------------------------------
#
# prepare_b(arch, word) turns one 32-bit word of b (8 codes) into what block_dot needs for those 8 elements;
# block_dot(arch, a0, a1, bp0, bp1) is the exact sum over one 16-element block (words a0, a1 of A), as fp32;
# block_scale(arch) is the constant that the block sum carries (the int path sums 2a·2b).


def prepare_b(arch: str, w, luts):
    """Per 8 elements of b (one 32-bit word): sm_90 -> two signed int8x4 words (elements 0-3, 4-7);
    sm_100 -> four f16x2 words."""
    w = Uint32(w)
    if const_expr(arch == "sm_90"):
        wn = w ^ Uint32(SIGN_BITS)
        bias = Uint32(BYTE_BIAS)
        lo, hi = luts
        p_lo = prmt(lo, hi, w)
        n_lo = prmt(lo, hi, wn)
        p_hi = prmt(lo, hi, w >> 16)
        n_hi = prmt(lo, hi, wn >> 16)
        return (((p_lo | bias) - n_lo) ^ bias, ((p_hi | bias) - n_hi) ^ bias)
    else:
        return (
            e2m1x2_to_f16x2(w),
            e2m1x2_to_f16x2(w >> 8),
            e2m1x2_to_f16x2(w >> 16),
            e2m1x2_to_f16x2(w >> 24),
        )


def block_dot(arch: str, a0, a1, bp0, bp1, luts) -> Float32:
    """Exact Σ over one 16-element block, times block_scale(arch): A words a0, a1 against prepared b words.

    sm_90: the positive codes of A (P) and the magnitudes of its negative codes (N) against signed b, in two dp4a
    chains; the block sum is P·b - N·b. sm_100: eight fma.rn.f16x2 into one packed accumulator."""
    if const_expr(arch == "sm_90"):
        lo, hi = luts
        pos = Int32(MAGIC_BITS)  # |P·b - N·b| <= 16·12·12 < 2²²
        neg = Int32(0)
        for x, bp in ((Uint32(a0), bp0), (Uint32(a1), bp1)):
            xn = x ^ Uint32(SIGN_BITS)
            pos = dp4a(prmt(lo, hi, x), bp[0], pos)
            neg = dp4a(prmt(lo, hi, xn), bp[0], neg)
            pos = dp4a(prmt(lo, hi, x >> 16), bp[1], pos)
            neg = dp4a(prmt(lo, hi, xn >> 16), bp[1], neg)
        return Float32(llvm.bitcast(T.f32(), (pos - neg).ir_value())) - Float32(MAGIC)
    else:
        acc = Uint32(0)
        for x, bp in ((Uint32(a0), bp0), (Uint32(a1), bp1)):
            acc = hfma2(e2m1x2_to_f16x2(x), bp[0], acc)
            acc = hfma2(e2m1x2_to_f16x2(x >> 8), bp[1], acc)
            acc = hfma2(e2m1x2_to_f16x2(x >> 16), bp[2], acc)
            acc = hfma2(e2m1x2_to_f16x2(x >> 24), bp[3], acc)
        return f16x2_sum_f32(acc)


def block_scale(arch: str) -> float:
    return 0.25 if arch == "sm_90" else 1.0


def accumulate_piece(arch: str, rA, scale_words, rB, sb_word, acc, half, luts):
    """One 32-element K piece (two scale blocks) of every row a thread owns, added into acc[i, q] in fp32.

    rA[w, q, i]: the piece's four A words of row (i, q); scale_words[i][q]: that row's scale word of the piece's
    64-element group (4 scales, first in the low byte); rB: the piece's four b words; sb_word: b's scale word of
    the group. `half` (0 or 1) picks the piece's two scales in the words. Each block product d·(sa·sb) is exact in
    fp32 (a ≤ 12-bit block sum times an 8-bit scale product), so each row takes one rounding per block."""
    sb0, sb1 = e4m3x2_to_f32x2(Uint32(sb_word) >> (half * 16))
    inv = Float32(block_scale(arch))
    sb0 = sb0 * inv
    sb1 = sb1 * inv
    bp0 = prepare_b(arch, rB[0], luts)
    bp1 = prepare_b(arch, rB[1], luts)
    bp2 = prepare_b(arch, rB[2], luts)
    bp3 = prepare_b(arch, rB[3], luts)
    for i in range(len(scale_words)):
        for q in range(4):
            sa0, sa1 = e4m3x2_to_f32x2(Uint32(scale_words[i][q]) >> (half * 16))
            d0 = block_dot(arch, rA[0, q, i], rA[1, q, i], bp0, bp1, luts)
            d1 = block_dot(arch, rA[2, q, i], rA[3, q, i], bp2, bp3, luts)
            acc[i, q] = acc[i, q] + d0 * (sa0 * sb0)
            acc[i, q] = acc[i, q] + d1 * (sa1 * sb1)
