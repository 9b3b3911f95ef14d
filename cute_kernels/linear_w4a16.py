"""The W4A16 decode linear: y[M, N] = x[M, K] · dequant(W)[N, K]ᵀ (+ bias), x bf16/fp16, W NVFP4 or MXFP4 exactly as
checkpoints store it (uint8 (N, K/2), the even k in the low nibble; scales plain (N, K/16) e4m3, the 128x4 atom
layout, or MXFP4's (N, K/32) e8m0). One kernel for sm_90 and sm_100a: `mma.sync` m16n8k16 (tensor cores fed from
registers), since at M >= 4 tokens the CUDA cores cannot do the multiply-adds at the rate the bytes arrive.

Operand roles. W is the MMA's A (16 weight rows a group), x is B (8 tokens a tile; 16 with two tiles; tokens past
M repeat the last one and are never stored). A thread (r = lane/4, c = lane%4) loads 16 bytes (32 codes) of rows
r and r+8 of each group per 128-K step, at K offset 32c; its four 8-code words w feed MMAs 2w and 2w+1. The MMA's K
order inside a step is a permutation of the step's K, the same for W and x, so the sum is unchanged:

    MMA 2w + jj of a step, thread c:  slots (2c, 2c+1)   <- the codes of pair PAIRS[2jj]   of word w
                                      slots (2c+8, 2c+9) <- the codes of pair PAIRS[2jj+1] of word w
    code i of word w of thread c is K element 128·s + 32c + 8w + i; x's B registers hold the same elements

The pairs are whatever decodes cheapest (`decode_word`): bf16 takes codes (i, i+4), which sit 16 bits apart, so one
mask, one multiply and one mask place both; f16 makes e4m3 bytes and converts them two at a time in hardware. The
block scale multiplies the placed pair (one HMUL2), folded with the placement's power of two where it fits (the
scale fold, NV_FOLD); the rest of that power of two, and the global scale, multiply the fp32 sum once at the end.

Two K parts a row (k_parts = 2, 4 tokens a tile). With 4 lanes a row the 16-byte W loads of one warp
instruction touch 8 rows x 64 bytes, half of each 128-byte line, and the scale loads 8 rows. With k_parts = 2, MMA
rows 2j and 2j+1 (lanes r = 2j, 2j+1) hold the same weight row, its first and second 128-K half of a 256-K step,
so 8 lanes read each row's whole line; the MMA's 8 columns hold (token, part), 4 tokens x 2 parts, with x of that
part. Column (t, p) times row (j, p') sums part p's x against part p' of W; only p == p' is kept, and the two parts
of a row are added (part 0 + part 1, by a shuffle from lane r ^ 1) before the store. The loop is the same code: a
lane's step index is 2s + p, so it loads and decodes what a one-part lane of step 2s + p would.

Accumulator sets (acc_sets = 2): MMA i of a step adds into set i % 2, so a step's MMAs of one (group, tile) are two
dependent chains of 4 instead of one of 8; the sets are added once after the K loop, in a fixed order.

x in fragment order (x_fragments, `linear_w4a16_fragments.LinearW4A16Fragments`): a first kernel writes x once a
call so that each lane's four 16-byte x chunks of a step come from 512 contiguous bytes a warp, already paired for
the B registers; this loop then loads them at fixed offsets from one address a step and skips the PRMT.

Work split: a CTA is row_warps x k_warps warps; a warp owns `groups` 16-row groups and takes every k_warps-th step,
so the row_warps warps on the same steps share x through L1. k-warps are summed in warp order through shared
memory; with k_splits > 1 the k_splits CTAs of a thread-block cluster share the steps of one row tile, and rank 0
adds their sums in rank order through distributed shared memory: the result is bit-identical run to run. Each
product W·x is exact in fp32 and the tensor cores sum in fp32. On the H200 the loop is about three instructions an
element, close to what the SMs can issue while the bytes stream, so the split is chosen to keep the most warps
resident (nvfp4_gemv/linear/kernels.py; BENCHMARKS.md, "The W4A16 linear").
"""

import functools
import operator
from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint8, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels.compile import REGISTER_FILE, SmemAllocator, cap_registers, launch, load_atom
from cute_kernels.decode import e4m3x2_to_f16x2
from cute_kernels.ptx import asm_u32, cluster_sync, inline_ptx, ld_shared_cluster_f32
from layouts.constants import SF_VEC
from layouts.sf_cute import sf_layout_by_col

STEP_K = 128  # K elements a warp covers per step: 4 threads x 32 codes
MMA_COLUMNS = 8  # the MMA's N: the tokens of one token tile
FORMATS = ("nvfp4", "mxfp4")
X_DTYPES = ("bf16", "fp16")
MX_VEC = 32


@dataclass(frozen=True)
class LinearW4A16Config:
    """The cache key of one compiled linear kernel."""

    fmt: str = "nvfp4"  # "nvfp4" (e4m3 per 16) or "mxfp4" (e8m0 per 32)
    sf_kind: str = "plain"  # nvfp4 scale layout: "plain" (N, K/16) or "permuted" (the 128x4 atom layout)
    x_dtype: str = "bf16"  # activations and output: "bf16" or "fp16"
    token_tiles: int = 1  # 8-token MMA tiles per CTA (1: M <= 8 per CTA, 2: 16, 4: 32; W decoded once a CTA)
    groups: int = 1  # 16-row MMA groups per warp
    row_warps: int = 1  # warps on different rows, same K steps (they share x through L1)
    k_warps: int = 8  # warps on the same rows, interleaved K steps (summed in warp order)
    unroll: int = 1  # unroll of the K-step loop
    bias: bool = False
    global_scale: bool = False
    sf_dtype: str = "u8"  # the scale tensor's element type as passed: "u8" or (nvfp4) "e4m3", so no view per call
    max_registers: int = 0  # 0: as ptxas likes; else a cap, so that more warps stay resident (min CTAs per SM)
    k_splits: int = 1  # CTAs of a cluster that split K for the same rows (their sums meet in shared memory)
    m_major: bool = False  # token tiles on the grid's x (consecutive CTAs share W's rows through L2), for M > 16
    k_parts: int = 1  # P > 1: each weight row on P MMA rows, P 128-K parts of a (P·128)-K step, 8 / P tokens a tile
    acc_sets: int = 1  # 2: a step's MMAs alternate between two accumulator sets (two chains of 4, not one of 8)
    block_columns: bool = False  # LinearW4A16Columns: x prepared as f16, block scales after the MMA, 2 tokens a CTA
    x_fragments: bool = False  # LinearW4A16Fragments: x prepared in fragment order, a warp's x load 512 bytes in a row
    mx_fold: bool = False  # MXFP4: the scale fold (MX_FOLD) on the steps whose scales fit it; False: the general path
    mx_fold_redo: bool = False  # with mx_fold: every step on the fold, and the warp's K again on the general path where
    # a scale left the fold's range (one vote after the loop), instead of a vote a step (LinearW4A16.kernel)
    mx_fold_zero_blocks: bool = True  # with mx_fold: a scale below the fold's range stands where its block's codes
    # are all zero (an amax rule's 2^-127 for a zero block): on the whole-K fold (bf16), a pass over the warp's scales
    # before a redo (zero_blocks_check); on a vote a step (fp16), where the vote fails (fold_fits)
    w_l2_prefetch: int = 0  # 0, 64, 128 or 256: W's loads with `.L2::<n>B` (the L2 fetches that much on a miss)
    shifts_on_fma: bool = False  # the decode's right shifts as `mul.hi.u32` (IMAD.HI, the FMA pipe) instead of SHF
    # (the ALU pipe, which the decode's masks keep busy); the same bits (decode_word). 1-2 % slower on an H100 at 1,
    # 4 and 16 tokens (BENCHMARKS.md), so no dispatched config sets it; kept for `nvfp4-gemv ab shifts_on_fma`
    pdl: bool = False  # the default kernel launched programmatically dependent on the stream's previous grid: its
    # CTAs may start while that grid drains and wait (griddepcontrol.wait) before their first global load, and it
    # lets the next such grid start once every CTA is past its K loop. The launcher sets it on the default kernel at
    # 1-16 tokens (kernels.PDL: 0.935 of the time on geomean on an H100, calls back to back). With x_fragments the
    # call's first grid, the x pass, is the one launched so and waits before it reads x or writes the workspace (the
    # main kernel already waits for the pass); the launcher sets it there too (0.963 over 44 points, H100)
    experts: str = ""  # LinearW4A16Experts: "i32" or "i64", the expert ids' dtype (a CTA row a (token, expert) slot)
    expert_group: bool = False  # with experts: the slots that share an expert in runs of up to a token tile, each run
    # in the CTA row of its first slot (found by a warp's scan of the ids), so the expert is read once a run instead
    # of once a slot
    expert_runs: bool = False  # with experts ("i32"): the same runs, read from a table the host made on the device
    # (`kernels.run_table`: a row a run, its expert and its slots) instead of scanned: CTA row r runs row r

    def __post_init__(self):
        if self.fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {FORMATS}, got {self.fmt!r}")
        if self.x_dtype not in X_DTYPES:
            raise ValueError(f"x_dtype must be one of {X_DTYPES}, got {self.x_dtype!r}")
        if self.sf_kind not in ("plain", "permuted") or (self.fmt == "mxfp4" and self.sf_kind != "plain"):
            raise ValueError(f"sf_kind must be 'plain' or (nvfp4 only) 'permuted', got {self.sf_kind!r} for {self.fmt}")
        if self.token_tiles not in (1, 2, 4) or self.groups not in (1, 2, 4):
            raise ValueError(f"token_tiles must be 1, 2 or 4 and groups 1, 2 or 4, got {self}")
        if not 1 <= self.row_warps * self.k_warps <= 16:
            raise ValueError(f"row_warps * k_warps must be in 1..16, got {self}")
        if self.fmt == "mxfp4" and self.global_scale:
            raise ValueError("mxfp4 has no global scale")
        if self.sf_dtype not in ("u8", "e4m3") or (self.sf_dtype == "e4m3" and self.fmt != "nvfp4"):
            raise ValueError(f"sf_dtype must be 'u8' or (nvfp4) 'e4m3', got {self.sf_dtype!r} for {self.fmt}")
        if self.k_splits not in (1, 2, 4, 8) or (self.k_splits > 1 and self.max_registers):
            raise ValueError(f"k_splits must be 1, 2, 4 or 8 (a portable cluster), and uncapped, got {self}")
        if self.k_parts not in (1, 2, 4, 8):
            raise ValueError(f"k_parts must be 1, 2, 4 or 8, got {self}")
        if self.acc_sets not in (1, 2):
            raise ValueError(f"acc_sets must be 1 or 2, got {self}")
        if self.block_columns and (self.k_parts, self.token_tiles, self.acc_sets, self.m_major) != (1, 1, 1, False):
            raise ValueError(f"block_columns takes one K part, one token tile, one accumulator set and no m_major, "
                             f"got {self}")
        if self.experts and (self.experts not in ("i32", "i64") or self.sf_kind != "plain" or (
                self.block_columns, self.x_fragments, self.m_major) != (False, False, False)
                or (self.token_tiles > 1 and not self.expert_runs)):
            raise ValueError(f"experts must be '', 'i32' or 'i64', and takes plain scales, one token tile (more only "
                             f"with expert_runs: a run a CTA row), no block columns, no x in fragment order and no "
                             f"m_major, got {self}")
        if self.expert_group and not self.experts:
            raise ValueError(f"expert_group is a way of routing experts (experts = 'i32' or 'i64'), got {self}")
        if self.expert_runs and (self.experts != "i32" or self.expert_group):
            raise ValueError(f"expert_runs reads a run table of int32 (experts = 'i32'), in place of expert_group's "
                             f"scan, got {self}")
        if self.mx_fold and (self.fmt != "mxfp4" or self.block_columns):
            raise ValueError(f"mx_fold is MXFP4's scale fold in the default kernel, got {self}")
        if self.mx_fold_redo and not self.mx_fold:
            raise ValueError(f"mx_fold_redo is a way of taking the scale fold (mx_fold), got {self}")
        if self.w_l2_prefetch not in (0, 64, 128, 256):
            raise ValueError(f"w_l2_prefetch must be 0, 64, 128 or 256, got {self.w_l2_prefetch}")
        if self.block_columns and self.x_fragments:
            raise ValueError("block_columns prepares x its own way; x_fragments is for the default kernel")
        if self.pdl and (self.experts or self.block_columns):
            raise ValueError(f"pdl is for the default kernel and x in fragment order (no experts or block columns, "
                             f"whose launches order themselves), got {self}")
        if self.m_major and self.k_splits > 1:
            raise ValueError(f"m_major takes no cluster (k_splits = 1), got {self}")
        if self.max_registers and (self.max_registers % 8 or not 24 <= self.max_registers <= 248
                                   or not 2 <= self.min_ctas_per_sm() <= 32):
            raise ValueError(f"max_registers must be 0 or a multiple of 8 in 24..248 at which 2 to 32 CTAs fill the "
                             f"register file, got {self}")

    @property
    def mma_dtype(self) -> str:
        """The MMA's operand type, x's: fp16 x with NVFP4 stays f16 (code x scale <= 2688 is exact in f16); MXFP4's
        power-of-two scales fit f16 only over part of their range, so a warp's step whose scales leave it (MX_FOLD)
        goes as bf16 with x as an exact bf16 hi + lo pair (split_x)."""
        if self.block_columns:
            return "fp16"  # x prepared as f16 (LinearW4A16Columns)
        if self.fmt == "mxfp4" and not self.mx_fold:
            return "bf16"
        return self.x_dtype

    @property
    def split_x(self) -> bool:
        """MXFP4 with fp16 x: the steps whose scales leave f16's range multiply x as a bf16 hi + lo pair."""
        return self.x_dtype == "fp16" and self.fmt == "mxfp4" and not self.block_columns

    @property
    def group_rows(self) -> int:
        """Weight rows of one 16-row MMA group (16 / k_parts)."""
        return 16 // self.k_parts

    @property
    def rows_per_cta(self) -> int:
        return self.group_rows * self.groups * self.row_warps

    @property
    def tile_tokens(self) -> int:
        """Tokens of one 8-column MMA tile (8 / k_parts: the columns are (token, part); 2 with block columns: (token,
        lane))."""
        return 2 if self.block_columns else 8 // self.k_parts

    @property
    def tokens_per_cta(self) -> int:
        return self.tile_tokens * self.token_tiles

    @property
    def step_k(self) -> int:
        """K elements of one row a warp covers per step."""
        return STEP_K * self.k_parts

    @property
    def threads(self) -> int:
        return 32 * self.row_warps * self.k_warps

    def min_ctas_per_sm(self) -> int:
        """The CTAs per SM that max_registers a thread allows (told to ptxas, which then caps the registers)."""
        return REGISTER_FILE // (self.max_registers * self.threads)

    def output_factor(self) -> float:
        """The power of two left on the fp32 sum by the scale fold (see NV_FOLD)."""
        if self.block_columns:
            return 2.0**6  # code · 2^-6 as decoded, the scales applied in fp32
        if self.fmt == "mxfp4":
            return 1.0
        return 1.0 if self.mma_dtype == "fp16" else 2.0**8


SF_DTYPES = {"u8": Uint8, "e4m3": cutlass.Float8E4M3FN}  # read as bytes either way


# ---------------------------------------------------------------- device helpers


def _u32(v, loc=None, ip=None):
    return Uint32(v).ir_value(loc=loc, ip=ip)


@dsl_user_op
def prmt(a, b, sel: int, *, loc=None, ip=None) -> Uint32:
    """`prmt.b32` with an immediate selector: bytes of {b:a} (one PRMT)."""
    return asm_u32([a, b], f"prmt.b32 $0, $1, $2, {sel:#x};", "=r,r,r", loc, ip)


@dsl_user_op
def mul_x2(a, b, dtype: str, *, loc=None, ip=None) -> Uint32:
    """Packed `mul.rn.f16x2` / `mul.rn.bf16x2` (one HMUL2); bf16 keeps subnormal inputs (PTX: no .ftz for bf16)."""
    op = "mul.rn.f16x2" if dtype == "fp16" else "mul.rn.bf16x2"
    return asm_u32([a, b], f"{op} $0, $1, $2;", "=r,r,r", loc, ip)


@dsl_user_op
def f16_half_to_bf16x2(h2, half: int, scale: float, *, loc=None, ip=None) -> Uint32:
    """One f16 half of `h2`, times the power of two `scale` in fp32, as a bf16 pair of two equal values (exact: an
    e4m3 value has 4 significant bits)."""
    sel = "l" if half == 0 else "h"
    f = f"0f{_f32_bits(scale):08X}"
    return asm_u32(
        [h2],
        "{\n\t.reg .b16 l, h;\n\t.reg .f32 a;\n\tmov.b32 {l, h}, $1;\n\tcvt.f32.f16 a, " + sel + ";\n\t"
        f"mul.rn.f32 a, a, {f};\n\tcvt.rn.bf16x2.f32 $0, a, a;\n\t}}",
        "=r,r",
        loc,
        ip,
    )


def _f32_bits(v: float) -> int:
    import struct

    return struct.unpack("<I", struct.pack("<f", v))[0]


@dsl_user_op
def mma_16816(acc, a, b, dtype: str, *, loc=None, ip=None):
    """`mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}` into four fp32 accumulators (returned)."""
    ab = "bf16" if dtype == "bf16" else "f16"
    operands = [_u32(v, loc, ip) for v in (*a, *b)] + [Float32(v).ir_value(loc=loc, ip=ip) for v in acc]
    res = inline_ptx(
        llvm.StructType.get_literal([T.f32()] * 4),
        operands,
        f"mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32 {{$0, $1, $2, $3}}, {{$4, $5, $6, $7}}, "
        "{$8, $9}, {$10, $11, $12, $13};",
        "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3",
        loc=loc,
        ip=ip,
    )
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def split_f16x2_to_bf16x2(h2, *, loc=None, ip=None):
    """An f16 pair as two bf16 pairs (hi, lo) with hi + lo == the f16 values exactly (bf16 has the range, and 8 +
    8 significant bits cover f16's 11). An infinite half gives hi = inf and lo = -256 (inf - inf is NaN, and
    `max.bf16x2` keeps the number): hi·w + lo·w is then ±inf, or NaN where w = 0, as in the reference; a finite lo
    is at most 2^-9 · 65504 in size, so the max leaves it alone. A NaN half gives a NaN hi."""
    asm = (
        "{\n\t.reg .b16 l, h;\n\t.reg .f32 a, b, c, d;\n\t.reg .b32 p, q;\n\tmov.b32 {l, h}, $2;\n\t"
        "cvt.f32.f16 a, l;\n\tcvt.f32.f16 b, h;\n\tcvt.rn.bf16x2.f32 p, b, a;\n\tmov.b32 $0, p;\n\t"
        "mov.b32 {l, h}, p;\n\tcvt.f32.bf16 c, l;\n\tcvt.f32.bf16 d, h;\n\tsub.rn.f32 a, a, c;\n\t"
        "sub.rn.f32 b, b, d;\n\tcvt.rn.bf16x2.f32 p, b, a;\n\tmov.b32 q, 0xC380C380;\n\t"
        "max.bf16x2 $1, p, q;\n\t}"
    )
    res = inline_ptx(
        llvm.StructType.get_literal([T.i32()] * 2), [_u32(h2, loc, ip)], asm, "=r,=r,r", loc=loc, ip=ip
    )
    return (
        Uint32(llvm.extractvalue(T.i32(), res, [0], loc=loc, ip=ip)),
        Uint32(llvm.extractvalue(T.i32(), res, [1], loc=loc, ip=ip)),
    )


@dsl_user_op
def ld_global_nc(addr, bits: int, *, loc=None, ip=None) -> Uint32:
    """`ld.global.nc.u8` / `.u16` at a byte address, zero-extended (a block scale or two)."""
    return Uint32(
        inline_ptx(
            T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip)],
            f"{{\n\t.reg .b16 s;\n\tld.global.nc.u{bits} s, [$1];\n\tcvt.u32.u16 $0, s;\n\t}}", "=r,l",
            loc=loc, ip=ip,
        )
    )  # fmt: skip


# The codes each decoded pair holds, per MMA dtype: word pair P[i] = (codes a, b), a in the low half.
PAIRS = {"bf16": ((0, 4), (1, 5), (2, 6), (3, 7)), "fp16": ((0, 2), (1, 3), (4, 6), (5, 7))}


@dsl_user_op
def e4m3x2_half_to_f16x2(word, half: int, *, loc=None, ip=None) -> Uint32:
    """The e4m3 pair in 16-bit half `half` of `word` to f16x2 (`cvt.rn.f16x2.e4m3x2`, one F2FP)."""
    sel = "l" if half == 0 else "h"
    return asm_u32(
        [word], "{\n\t.reg .b16 l, h;\n\tmov.b32 {l, h}, $1;\n\tcvt.rn.f16x2.e4m3x2 $0, " + sel + ";\n\t}", "=r,r",
        loc, ip,
    )


@dsl_user_op
def mul_hi(a, b: int, *, loc=None, ip=None) -> Uint32:
    """`mul.hi.u32`: the high 32 bits of a · b (a right shift when b is a power of two, on the FMA pipe)."""
    return asm_u32([a, Uint32(b)], "mul.hi.u32 $0, $1, $2;", "=r,r,r", loc, ip)


def decode_word(q, dtype: str, shifts_on_fma: bool = False):
    """The 8 codes of word q (code i in bits 4i..4i+3) as four placed pairs, in PAIRS[dtype] order.

    bf16: pair (i, i+4) shares a 16-bit-apart nibble position, so one mask keeps both, one multiply by
    2^(6-b) + 2^(12-b) makes two disjoint copies (mag to bits 6-8, sign to bit 15 of each half) and one mask keeps
    the wanted bits: LOP3, IMAD, LOP3. The value is code · 2^-126 (0 and ±0.5 are subnormal; HMUL2.BF16 keeps them).
    f16: every code byte-aligned as an e4m3 byte (sign to bit 7, (e1 e0 m) to bits 4-2: an e4m3 of value
    code · 2^-6, subnormals included), two bytes at a time through `cvt.rn.f16x2.e4m3x2`: 7 integer ops and 4
    F2FP a word. With shifts_on_fma, the one right shift of each (bf16's q >> 8, f16's q >> 2) is a `mul.hi.u32` by
    2^24 or 2^30: ptxas keeps it as IMAD.HI, which issues to the FMA pipe instead of the ALU's (ptxas already makes
    the left shifts IMAD.SHL)."""
    q = Uint32(q)

    def right(n):
        return mul_hi(q, 1 << (32 - n)) if shifts_on_fma else q >> n

    if dtype == "bf16":
        out = []
        hi = right(8)
        for i in range(4):
            src = q if i < 2 else hi
            b = 4 * (i % 2)
            x = src & Uint32(0x000F000F << b)
            out.append((x * Uint32((1 << (6 - b)) + (1 << (12 - b)))) & Uint32(0x81C081C0))
        return out
    even = ((q << 4) & Uint32(0x80808080)) | ((q << 2) & Uint32(0x1C1C1C1C))  # codes 0, 2, 4, 6
    odd = (q & Uint32(0x80808080)) | (right(2) & Uint32(0x1C1C1C1C))  # codes 1, 3, 5, 7
    return [
        e4m3x2_half_to_f16x2(even, 0),
        e4m3x2_half_to_f16x2(odd, 0),
        e4m3x2_half_to_f16x2(even, 1),
        e4m3x2_half_to_f16x2(odd, 1),
    ]


def x_pair_selector(a: int, b: int) -> int:
    """prmt selector taking x element a (of words u[a//2]) to the low half and b (of u[b//2]) to the high half."""
    lo = 2 * (a % 2)
    hi = 4 + 2 * (b % 2)
    return ((hi + 1) << 12) | (hi << 8) | ((lo + 1) << 4) | lo


# The scale fold: the placed code carries 2^-6 (f16) or 2^-126 (bf16). NVFP4's e4m3 scale (<= 448) times 2^6 fits
# f16 (product code·scale, exact); times 2^118 it fits bf16 (product code·scale·2^-8, exact, and output_factor()
# puts the 2^8 back on the fp32 sum). MXFP4's 2^(s-127) cannot absorb 2^126 for s > 128, so its placed codes are
# multiplied by 2^126 first (exact) and then by the scale.
NV_FOLD = {"fp16": 2.0**6, "bf16": 2.0**118}
BF16_2_126 = 0x7E807E80  # 2^126 in both bf16 halves
F16_2_6 = 0x54005400  # 64.0 in both f16 halves


# MXFP4's scale fold: the placed code carries 2^-126 (bf16) or 2^-6 (f16), and where the e8m0 scale s lets, one
# multiplier 2^(s - 127) times the inverse of that power of two, in the MMA's type, makes code · 2^(s - 127) in one
# HMUL2 (exact): bf16 2^(s - 1) for s <= 128; f16 2^(s - 121) for 107 <= s <= 136 (scales 2^-20 to 2^9, the
# multiplier a normal f16 and every code · scale exact in f16). mx_fold_multiplier makes it with one IMAD: the
# exponent field s + offset in both halves. A warp's step with any scale outside takes the general path (the
# placed code times 2^126, then the scale, in bf16; with fp16 x, x as a bf16 hi + lo pair), whose products are the
# same exact values.
MX_FOLD = {"bf16": (126, 7, 0, 128), "fp16": (-106, 10, 107, 136)}  # (exponent offset, mantissa bits, least s, most s)
# With bf16 x over the warp's whole K (mx_fold_redo) the multiplier is 2^(s - 1 - MX_FOLD_SHIFT): every product
# and fp32 sum 2^-16 of its value, and the warp's sums times 2^16 after the loop (exact, before they meet the other
# warps'). That moves bf16's top from 2^1 to 2^17 (s <= 144). Its least s is 64 (2^-63): the products (exact bf16 down
# to s = 11) then stay normal fp32 numbers for any |x| >= 2^-45, where a sum 2^-16 of its value could otherwise fall
# into fp32's subnormals; scales that small take the general path, as any out of range.
MX_FOLD_SHIFT = 16


def mx_fold_window(dtype: str, redo: bool = False):
    """(exponent offset, mantissa bits, least s, most s) of the scale fold for the MMA's `dtype`; bf16 on the
    whole-K fold (`redo`) shifted by MX_FOLD_SHIFT."""
    offset, bits, least, most = MX_FOLD[dtype]
    if redo and dtype == "bf16":
        return offset - MX_FOLD_SHIFT, bits, 64, most + MX_FOLD_SHIFT
    return offset, bits, least, most


def mx_fold_multiplier(s, dtype: str, redo: bool = False) -> Uint32:
    """2^(s - 127) / (the placed code's power of two) in both halves of `dtype` (times 2^-MX_FOLD_SHIFT for bf16
    on the whole-K fold), for s in mx_fold_window's range."""
    offset, bits, _, _ = mx_fold_window(dtype, redo)
    k = (1 << bits) | (1 << (bits + 16))
    return Uint32(s) * Uint32(k) + Uint32((offset * k) & 0xFFFFFFFF)


def block_codes(rW, h: int, g: int) -> Uint32:
    """The magnitude bits of a lane's 32 codes of one row (its 4 W words (word, h, g) of a step, one MXFP4 block):
    zero where every code is +0 or -0."""
    return (rW[0, h, g] | rW[1, h, g] | rW[2, h, g] | rW[3, h, g]) & Uint32(0x77777777)


def mx_fold_fits(s, dtype: str):
    """Whether the e8m0 scale s is in the vote-a-step fold's range for `dtype` (one unsigned compare)."""
    _, _, least, most = mx_fold_window(dtype)
    return Uint32(s) - Uint32(least) <= Uint32(most - least)


@dsl_user_op
def f16x2_to_bf16x2_times_64(h2, *, loc=None, ip=None) -> Uint32:
    """An f16 pair (placed codes, code · 2^-6) as the bf16 pair of the codes: exact (a code has 2 significant bits)."""
    return asm_u32(
        [h2],
        "{\n\t.reg .b16 l, h;\n\t.reg .f32 a, b;\n\tmov.b32 {l, h}, $1;\n\tcvt.f32.f16 a, l;\n\tcvt.f32.f16 b, h;\n\t"
        "mul.rn.f32 a, a, 0f42800000;\n\tmul.rn.f32 b, b, 0f42800000;\n\tcvt.rn.bf16x2.f32 $0, b, a;\n\t}",
        "=r,r",
        loc,
        ip,
    )


@dsl_user_op
def e8m0_to_bf16x2(s, *, loc=None, ip=None) -> Uint32:
    """An e8m0 byte s as 2^(s-127) in both bf16 halves: exponent bits s << 7; s = 0 is the subnormal 2^-127, and
    s = 255 is NaN."""
    return asm_u32(
        [s],
        "{\n\t.reg .b32 e;\n\t.reg .pred z, n;\n\tshl.b32 e, $1, 7;\n\tsetp.eq.u32 z, $1, 0;\n\t"
        "setp.eq.u32 n, $1, 255;\n\tselp.b32 e, 64, e, z;\n\tselp.b32 e, 32704, e, n;\n\t"
        "prmt.b32 $0, e, e, 0x1010;\n\t}",
        "=r,r",
        loc,
        ip,
    )


def w_chunk(w_words: cute.Tensor, row, s, c):
    """Lane c's 16 bytes of W row `row` in 128-K step s (its 32 codes, K offset 128·s + 32c): 4 words."""
    wq = s * (STEP_K // 8) + 4 * c  # the lane's first W word
    return cute.local_tile(w_words[row, None], (4,), (wq // 4,))


def w_load_atom(cfg: LinearW4A16Config):
    """The copy atom of W's 16-byte loads: past L1 (read once), and with `.L2::<n>B` where cfg.w_l2_prefetch says."""
    hints = {}
    if cfg.w_l2_prefetch:
        hints["l2_prefetch_size"] = getattr(cute.nvgpu.L2PrefetchSize, f"SIZE_{cfg.w_l2_prefetch}B")
    return load_atom(Uint32, 128, l1_no_allocate=True, **hints)


def fake_weight_operands(n, sf_kind: str, sf_dtype: str):
    """Fake W (N, K/2) bytes and its scales (plain (N, K/16 or K/32), or the padded 128x4-atom buffer) as the
    kernels that read checkpoint weights are compiled on: dynamic sizes, 16-byte aligned."""
    from cutlass.cute.runtime import make_fake_tensor

    kb = cute.sym_int(divisibility=32)
    w = make_fake_tensor(Uint8, (n, kb), stride=(kb, 1), assumed_align=16)
    if sf_kind == "permuted":
        rows, cols = cute.sym_int(divisibility=128), cute.sym_int(divisibility=4)
    else:
        rows, cols = n, cute.sym_int(divisibility=2)
    return w, make_fake_tensor(SF_DTYPES[sf_dtype], (rows, cols), stride=(cols, 1), assumed_align=16)


@cute.jit
def weight_views(mW: cute.Tensor, mSF: cute.Tensor, fmt: str, sf_kind: str, n, k):
    """W as (N, K/8) 32-bit words (8 codes each, the lowest nibble first) and its scales as bytes in (row, scale
    column) coordinates: NVFP4 through the `layouts/` view of the plain or permuted buffer, MXFP4 plain (N, K/32)."""
    w_words = cute.make_tensor(
        cute.recast_ptr(mW.iterator, dtype=Uint32), cute.make_layout((n, k // 8), stride=(k // 8, 1))
    )
    if const_expr(fmt == "nvfp4"):
        sf = cute.make_tensor(cute.recast_ptr(mSF.iterator, dtype=Uint8), sf_layout_by_col(sf_kind, n, k, 1))
    else:
        sf = cute.make_tensor(cute.recast_ptr(mSF.iterator, dtype=Uint8),
                              cute.make_layout((n, k // MX_VEC), stride=(k // MX_VEC, 1)))
    return w_words, sf


@cute.jit
def sf_address(sf: cute.Tensor, fmt: str, row, col):
    """Byte address of the block scale of `row` at scale column `col` (NVFP4: a 16-element block, through the
    plain or permuted layout; MXFP4: a 32-element block, plain)."""
    if const_expr(fmt == "nvfp4"):
        # row, col >= 0: masks and shifts (`%` and `//` on a signed Int32 are floor-division sequences)
        off = sf.layout(((row & 31, (row >> 5) & 3, row >> 7), (col & 3, col >> 2), 0))
    else:
        off = sf.layout((row, col))
    return sf.iterator.toint() + Int64(off)


@cute.jit
def scale_multipliers(fmt: str, dtype: str, bits):
    """The multiplier pairs of one row's two 16-element blocks (NVFP4, `bits` = their two e4m3 bytes) or one
    32-element block (MXFP4, `bits` = its e8m0 byte), in `dtype`, with NVFP4's scale fold (NV_FOLD):
    (for words 0-1, for words 2-3) of a 32-code piece."""
    if const_expr(fmt == "mxfp4"):
        sc = e8m0_to_bf16x2(bits)
        return sc, sc
    h2 = e4m3x2_to_f16x2(bits)
    if const_expr(dtype == "fp16"):
        h2 = mul_x2(h2, Uint32(F16_2_6), "fp16")
        return prmt(h2, h2, 0x1010), prmt(h2, h2, 0x3232)
    return f16_half_to_bf16x2(h2, 0, NV_FOLD["bf16"]), f16_half_to_bf16x2(h2, 1, NV_FOLD["bf16"])


@cute.jit
def scale_codes(fmt: str, dtype: str, placed, multiplier):
    """Four placed pairs of one word (decode_word) times one block's multiplier pair (scale_multipliers): code ·
    scale, times 2^-8 for NVFP4 in bf16 (the fold's remainder, `output_factor`)."""
    out = list(placed)
    for i in cutlass.range_constexpr(4):
        v = out[i]
        if const_expr(fmt == "mxfp4"):
            v = mul_x2(v, Uint32(BF16_2_126), "bf16")
        out[i] = mul_x2(v, multiplier, dtype)
    return out


class LinearW4A16:
    def __init__(self, config: LinearW4A16Config, target=None):
        self.cfg = config
        self.warps = config.row_warps * config.k_warps

    @staticmethod
    def can_implement(m: int, n: int, k: int) -> bool:
        """M, N >= 1; K a positive multiple of 64; every int32 offset the kernel forms fits: x's 32-bit words
        (M·K/2), W's (N·K/8) and y's elements (M·N) below 2^31."""
        return (m >= 1 and n >= 1 and k >= 64 and k % 64 == 0 and m * k < 2**32 and n * k < 2**34
                and m * n < 2**31)

    @staticmethod
    def fake_operands(config: LinearW4A16Config):
        from cutlass.cute.runtime import make_fake_tensor

        m, n = cute.sym_int(), cute.sym_int()
        k = cute.sym_int(divisibility=64)
        xdt = cutlass.BFloat16 if config.x_dtype == "bf16" else cutlass.Float16
        x = make_fake_tensor(xdt, (m, k), stride=(cute.sym_int(divisibility=8), 1), assumed_align=16)
        w, sf = fake_weight_operands(n, config.sf_kind, config.sf_dtype)
        y = make_fake_tensor(xdt, (m, n), stride=(cute.sym_int(), 1), assumed_align=2)
        gs = make_fake_tensor(Float32, (1,), stride=(1,), assumed_align=4)
        bias = make_fake_tensor(xdt, (cute.sym_int(),), stride=(1,), assumed_align=2)
        return x, w, sf, y, gs, bias

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mSF: cute.Tensor, mY: cute.Tensor, mGS: cute.Tensor,
                 mBias: cute.Tensor, stream=None):
        launch(*self.build(mX, mW, mSF, mY, mGS, mBias), stream=stream)

    @cute.jit
    def build(self, mX, mW, mSF, mY, mGS, mBias):
        x_words, w_words, sf, m, n, k = self.views(mX, mW, mSF, mY)
        return self.kernel(x_words, w_words, sf, mY, mGS, mBias, m, n, k), self.launch_shape(m, n)

    def views(self, mX, mW, mSF, mY):
        """(x as 32-bit words, W as words, its scales as bytes by (row, scale column), M, N, K) of a call."""
        cfg = self.cfg
        m, k = mX.shape
        n = mY.shape[1]
        x_words = cute.make_tensor(
            cute.recast_ptr(mX.iterator, dtype=Uint32), cute.make_layout((m, k // 2), stride=(mX.stride[0] // 2, 1))
        )
        w_words, sf = weight_views(mW, mSF, cfg.fmt, cfg.sf_kind, n, k)
        return x_words, w_words, sf, m, n, k

    def launch_shape(self, m, n) -> dict:
        """The main kernel's launch keywords: grid, block, cluster, and the register cap as CTAs an SM."""
        cfg = self.cfg
        n_tiles = (n + cfg.rows_per_cta - 1) // cfg.rows_per_cta
        m_tiles = (m + cfg.tokens_per_cta - 1) // cfg.tokens_per_cta
        grid = [n_tiles * cfg.k_splits, m_tiles, 1]
        if const_expr(cfg.m_major):
            grid = [m_tiles, n_tiles, 1]
        shape = dict(grid=grid, block=[cfg.threads, 1, 1])
        if const_expr(cfg.pdl):
            shape["use_pdl"] = True
        if const_expr(cfg.k_splits > 1):
            shape["cluster"] = [cfg.k_splits, 1, 1]  # consecutive CTAs: one row tile, K split over them
        if const_expr(cfg.max_registers > 0):
            # A CTA's shared memory: its k-warp sums, and 1 KB the SM reserves a CTA.
            cap_registers(shape, cfg.min_ctas_per_sm(), 4 * self.sums_per_thread() * 32 * self.warps + 1024)
        return shape

    # ------------------------------------------------------------ per step

    def make_regs(self):
        cfg = self.cfg
        return (
            cute.make_rmem_tensor(cute.make_layout((4, 2, cfg.groups)), Uint32),  # W words (word, half, group)
            cute.make_rmem_tensor(cute.make_layout((16, cfg.token_tiles)), Uint32),  # x words (word, tile)
            cute.make_rmem_tensor(cute.make_layout((2, cfg.groups)), Uint32),  # scale bits (half, group)
        )

    @cute.jit
    def load_scales(self, rS, sf, s, rows, c):
        """This thread's block scales of step s for each of its rows (NVFP4: two bytes, MXFP4: one)."""
        cfg = self.cfg
        if const_expr(cfg.fmt == "nvfp4"):
            col = s * (STEP_K // SF_VEC) + 2 * c
        else:
            col = s * (STEP_K // MX_VEC) + c
        for g in cutlass.range_constexpr(cfg.groups):
            for h in cutlass.range_constexpr(2):
                addr = sf_address(sf, cfg.fmt, rows[g, h], col)
                rS[h, g] = ld_global_nc(addr, 16 if cfg.fmt == "nvfp4" else 8)

    @cute.jit
    def load_step(self, regs, x_words, w_words, sf, s, rows, toks, c, live):
        """Load 128-K step s (of this lane's part) into registers: 16 bytes of W and the scales per row, 64 bytes of x
        per token."""
        cfg = self.cfg
        rW, rX, rS = regs
        if live:
            xq = s * (STEP_K // 2) + 16 * c  # first x word
            x_rows = [self.x_row(x_words, s, toks[t]) for t in range(cfg.token_tiles)]
            # (source, destination, atom) of every 16-byte chunk: W per (group, half), then x per (tile, 16 bytes).
            chunks = [
                (w_chunk(w_words, rows[g, h], s, c), rW[None, h, g], True)
                for g in range(cfg.groups) for h in range(2)
            ] + [
                (self.x_chunk(x_rows[t], c, xq, v), cute.local_tile(rX[None, t], (4,), (v,)), False)
                for t in range(cfg.token_tiles) for v in range(4)
            ]
            atom_w = w_load_atom(cfg)
            atom_x = load_atom(Uint32, 128)
            for src, dst, is_w in chunks:
                cute.copy(atom_w if is_w else atom_x, src, dst)
            self.load_scales(rS, sf, s, rows, c)
        else:
            rW.fill(0)
            rX.fill(0)
            for g in cutlass.range_constexpr(cfg.groups):
                for h in cutlass.range_constexpr(2):
                    # any finite scale, the codes being zero (MXFP4: 2^0, in MX_FOLD's range)
                    rS[h, g] = Uint32(0x3838 if cfg.fmt == "nvfp4" else 127)

    def x_row(self, x_words, s, tok):
        """Token `tok`'s x words of step s: its row of x, or, with x in fragment order, its (4 chunks, 4 lanes x 4
        words) of step s, one 64-bit address a step (the chunks then sit at fixed offsets)."""
        if const_expr(self.cfg.x_fragments):
            return x_words[s, tok >> 3, None, tok & 7, None]
        return x_words[tok, None]

    def x_chunk(self, x_row, c, xq, v):
        """This lane's 16-byte chunk v of a token's x_row: words xq + 4v.., or in fragment order chunk (v, c)."""
        if const_expr(self.cfg.x_fragments):
            return cute.local_tile(x_row[v, None], (4,), (c,))
        return cute.local_tile(x_row, (4,), (xq // 4 + v,))

    @cute.jit
    def fold_fits(self, regs):
        """MXFP4: whether every scale of this warp's loaded step is in MX_FOLD's range (a warp vote). With
        mx_fold_zero_blocks, where not, whether every scale outside lies below the range on a block whose codes
        are all zero: those scales are then raised to the range's least in `regs` (the block decodes to the same
        signed zeros under any finite multiplier) and the step stays on the fold."""
        cfg = self.cfg
        rW, _, rS = regs
        _, _, least, most = mx_fold_window(cfg.mma_dtype)
        blocks = [(h, g) for g in range(cfg.groups) for h in range(2)]
        all_fit = cute.arch.vote_all_sync(functools.reduce(
            operator.and_, [mx_fold_fits(rS[b], cfg.mma_dtype) for b in blocks]))
        if const_expr(cfg.mx_fold_zero_blocks and least > 0):
            if not all_fit:
                all_fit = cute.arch.vote_all_sync(functools.reduce(operator.and_, [
                    (Uint32(rS[b]) <= Uint32(most)) & ((Uint32(rS[b]) >= Uint32(least)) | (block_codes(rW, *b) == 0))
                    for b in blocks]))
                if all_fit:
                    for b in blocks:
                        rS[b] = cutlass.max(Uint32(rS[b]), Uint32(least))
        return all_fit

    @cute.jit
    def compute(self, regs, accs):
        """compute_step on one loaded step: for MXFP4 with the scale fold where every scale of the warp's step fits it,
        else the general path."""
        if const_expr(self.cfg.mx_fold):
            if self.fold_fits(regs):
                self.compute_step(regs, accs, True)
            else:
                self.compute_step(regs, accs, False)
        else:
            self.compute_step(regs, accs, False)

    @cute.jit
    def compute_step(self, regs, accs, fold: bool):
        """Decode and multiply one loaded step; MMA i of the step adds into accumulator set i % acc_sets. `fold`
        (MXFP4): every scale of the step is in MX_FOLD's range; else MXFP4 takes the general path (bf16 MMAs)."""
        cfg = self.cfg
        general = cfg.fmt == "mxfp4" and not fold
        mma_dt = "bf16" if general else cfg.mma_dtype
        # The decode's type, whose pair order x takes: the MMA's, but for x in fragment order, which comes paired for
        # the kernel's mma_dtype (a general MXFP4 step with fp16 x then decodes as f16 and converts).
        dt = cfg.mma_dtype if cfg.x_fragments else mma_dt
        pairs = PAIRS[dt]
        rW, rX, rS = regs
        # x as the MMA's B operand: MMA 2w + jj multiplies word w's pairs 2jj (slots 2c, 2c+1) and 2jj+1 (slots
        # 2c+8, 2c+9); its b0, b1 hold the same x elements (8w + a, 8w + b) of each pair (a, b).
        xb = []
        for t in cutlass.range_constexpr(cfg.token_tiles):
            tile = []
            for w in cutlass.range_constexpr(4):
                u = [rX[4 * w + e, t] for e in range(4)]
                bs = u  # x in fragment order comes paired
                if const_expr(not cfg.x_fragments):
                    bs = [prmt(u[a // 2], u[b // 2], x_pair_selector(a, b)) for a, b in pairs]
                for jj in cutlass.range_constexpr(2):
                    b0, b1 = bs[2 * jj], bs[2 * jj + 1]
                    if const_expr(cfg.split_x and general):
                        b0h, b0l = split_f16x2_to_bf16x2(b0)
                        b1h, b1l = split_f16x2_to_bf16x2(b1)
                        tile.append(((b0h, b1h), (b0l, b1l)))
                    else:
                        tile.append(((b0, b1),))
            xb.append(tile)
        for g in cutlass.range_constexpr(cfg.groups):
            if const_expr(fold):
                sc = [mx_fold_multiplier(rS[h, g], dt, cfg.mx_fold_redo) for h in range(2)]
            else:
                sc = [scale_multipliers(cfg.fmt, dt, rS[h, g]) for h in range(2)]  # sc[half][word // 2]
            for w in cutlass.range_constexpr(4):
                dec = [decode_word(rW[w, h, g], dt, cfg.shifts_on_fma) for h in range(2)]
                if const_expr(fold):
                    dec = [[mul_x2(v, sc[h], dt) for v in dec[h]] for h in range(2)]
                elif const_expr(general and dt == "fp16"):  # f16-placed codes as bf16 codes, then the scale
                    dec = [[mul_x2(f16x2_to_bf16x2_times_64(v), sc[h][0], "bf16") for v in dec[h]] for h in range(2)]
                else:
                    dec = [scale_codes(cfg.fmt, dt, dec[h], sc[h][w // 2]) for h in range(2)]
                for jj in cutlass.range_constexpr(2):
                    a = (dec[0][2 * jj], dec[1][2 * jj], dec[0][2 * jj + 1], dec[1][2 * jj + 1])
                    acc = accs[(2 * w + jj) % cfg.acc_sets]
                    for t in cutlass.range_constexpr(cfg.token_tiles):
                        for bb in xb[t][2 * w + jj]:
                            r = mma_16816([acc[q, g, t] for q in range(4)], a, bb, mma_dt)
                            for q in cutlass.range_constexpr(4):
                                acc[q, g, t] = r[q]

    @cute.kernel
    def kernel(self, x_words: cute.Tensor, w_words: cute.Tensor, sf: cute.Tensor, mY: cute.Tensor,
               mGS: cute.Tensor, mBias: cute.Tensor, m: Int32, n: Int32, k: Int32):
        self.body(x_words, w_words, sf, mY, mGS, mBias, m, n, k, None)

    @cute.jit
    def body(self, x_words, w_words, sf, mY, mGS, mBias, m, n, k, route):
        """The kernel's work. `route` None: CTA (row tile, token tile) of one weight; else an expert route
        (`linear_w4a16_experts.Route`): the CTA's token and the expert whose rows it reads."""
        cfg = self.cfg
        bidx, bidy, split, lane, warp, wr, wk, kq, k_lanes, r, c = self.coordinates()
        kp = cfg.k_parts
        part = r % kp  # this lane's K part (its MMA row of W and its MMA column of x)
        row0 = bidx * cfg.rows_per_cta + wr * (cfg.group_rows * cfg.groups)
        rows = cute.make_rmem_tensor(cute.make_layout((cfg.groups, 2)), Int32)
        for g in cutlass.range_constexpr(cfg.groups):
            for h in cutlass.range_constexpr(2):
                rows[g, h] = cutlass.min(row0 + cfg.group_rows * g + (8 // kp) * h + r // kp, n - 1)
                if const_expr(route is not None):
                    rows[g, h] = rows[g, h] + route.row_base
        toks = cute.make_rmem_tensor(cute.make_layout(cfg.token_tiles), Int32)
        for t in cutlass.range_constexpr(cfg.token_tiles):
            if const_expr(route is not None):
                toks[t] = route.token_of(t)  # this lane's MMA column's token in tile t
            else:
                toks[t] = cutlass.min(bidy * cfg.tokens_per_cta + cfg.tile_tokens * t + r // kp, m - 1)

        red, cta_sums = self.reduction_smem()
        accs = [cute.make_rmem_tensor(cute.make_layout((4, cfg.groups, cfg.token_tiles)), Float32)
                for _ in range(cfg.acc_sets)]
        for a in accs:
            a.fill(0.0)
        acc = accs[0]
        n_full = k // cfg.step_k
        my_steps = (n_full - kq + k_lanes - 1) // k_lanes
        if const_expr(cfg.x_fragments or cfg.pdl):
            # x in fragment order comes from this call's x pass (LinearW4A16Fragments), launched just before. An L2
            # prefetch of the first step's W and scales here made the call 1-2 us slower on the H200, not faster
            # (BENCHMARKS.md, "x in fragment order"). With pdl, any operand (W and its scales included) may come
            # from the grid before, and y may be read by it: nothing global is read or written before this wait.
            cute.arch.griddepcontrol_wait()
        # Loads go straight to registers, one step at a time. A second register buffer (loads of the next step
        # in flight), a per-thread cp.async ring of W in shared memory, a producer warp's bulk-copy ring, and L2
        # prefetches a few steps ahead were all slower on the H200: the loop's issue slots and the warps that stay
        # resident decide, not bytes in flight (BENCHMARKS.md, "The W4A16 linear").
        args = (x_words, w_words, sf, rows, toks, c, kq, k_lanes, part, n_full, my_steps, k)
        if const_expr(cfg.mx_fold_redo):
            # MXFP4: every step on the scale fold, keeping the largest distance of a scale above the fold's least; if
            # any scale of the warp's K left the range, the fold's sums are dropped and the warp's K is done again on
            # the general path, which makes the same exact products in the same order. One compare a scale and one
            # vote a warp where every scale fits (sm_90a, one group and tile: a loop of 187 instructions a step with
            # bf16 x against the general 233, fp16 x 175 against 402; 62-65 registers), twice the work where not.
            outside = cute.arch.vote_any_sync(self.k_loop(accs, args, "fold"))
            if const_expr(cfg.mx_fold_zero_blocks and cfg.mma_dtype == "bf16"):
                # A block whose codes are all zero decodes to (signed) zeros under any finite multiplier, on the fold
                # as on the general path; an amax rule gives such a block the least scale (e8m0 byte 0). Before the
                # redo, a pass over the scales (and the codes only of blocks whose scale lies below the fold's range)
                # finds whether every such scale belongs to a zero block; if so, the fold's sums stand.
                if outside:
                    outside = cute.arch.vote_any_sync(self.zero_blocks_check(args))
            if outside:
                for a in accs:
                    a.fill(0.0)
                self.k_loop(accs, args, "general")
            else:
                if const_expr(cfg.mma_dtype == "bf16"):  # the fold's sums, 2^-MX_FOLD_SHIFT of their values
                    for a in accs:
                        for i in cutlass.range_constexpr(cute.size(a)):
                            a[i] = a[i] * Float32(2.0**MX_FOLD_SHIFT)
        else:
            first = 0
            if const_expr(cfg.mx_fold):
                # MXFP4: steps with the scale fold (MX_FOLD) while every scale of the warp's step fits it. The first
                # step that does not ends this loop; it is computed on the general path as loaded, and k_loop takes
                # the rest on the general path. (Both paths in one loop body took 97 registers at one group and token
                # tile, not 64: ptxas keeps both paths' values live.)
                first = Int32(0)
                folding = Int32(1)
                fold_regs = self.make_regs()
                while first < my_steps and folding != 0:
                    self.load_step(fold_regs, x_words, w_words, sf, (kq + first * k_lanes) * kp + part, rows, toks,
                                   c, True)
                    if self.fold_fits(fold_regs):
                        self.compute_step(fold_regs, accs, True)
                        first = first + 1
                    else:
                        folding = Int32(0)
                if folding == 0:  # the step that left the fold, loaded already
                    self.compute_step(fold_regs, accs, False)
                    first = first + 1
            self.k_loop(accs, args, "vote" if cfg.mx_fold else "general", first)
        if const_expr(cfg.acc_sets == 2):
            for i in cutlass.range_constexpr(4 * cfg.groups * cfg.token_tiles):
                acc[i] = acc[i] + accs[1][i]
        if const_expr(cfg.pdl):
            cute.arch.griddepcontrol_launch_dependents()  # the next grid may launch once every CTA is here

        out = (mGS, row0, r, c, bidy, mY, mBias, m, n)
        if const_expr(route is not None):
            out = (*out, route)
        self.sum_and_store(acc, red, cta_sums, lane, warp, wr, wk, split, out)

    @cute.jit
    def k_loop(self, accs, args, mode: str, first=0):
        """This warp's full steps from its `first` (every k_lanes-th step of the K lane kq), then the last partial step,
        into accs. `mode`: "general" (MXFP4's general path), "fold" (every step on MXFP4's scale fold, keeping the
        largest distance of a scale byte above the fold's least: unsigned, so a byte below it is far) or
        "vote" (the full steps general, the partial step on the fold where its scales fit: `compute`). With "fold",
        returns whether a scale byte of this lane's K lay outside the fold's window (mx_fold_window with the redo)."""
        cfg = self.cfg
        x_words, w_words, sf, rows, toks, c, kq, k_lanes, part, n_full, my_steps, k = args
        kp = cfg.k_parts
        fold = mode == "fold"
        _, _, least, most = mx_fold_window(cfg.mma_dtype, True)
        worst = Uint32(0)
        for st in cutlass.range(first, my_steps, unroll=cfg.unroll):
            step_regs = self.make_regs()
            self.load_step(step_regs, x_words, w_words, sf, (kq + st * k_lanes) * kp + part, rows, toks, c, True)
            self.compute_step(step_regs, accs, fold)
            if const_expr(fold):
                worst = self.scale_distance(worst, step_regs, least)
        if k % cfg.step_k != 0:
            # The last partial step (64 K elements, or with two parts 64, 128 or 192): a lane whose 32 codes lie
            # past K multiplies zeros (and holds scale 2^0, in the fold's range).
            if kq == n_full % k_lanes:
                regs = self.make_regs()
                s_last = n_full * kp + part
                self.load_step(regs, x_words, w_words, sf, s_last, rows, toks, c, s_last * STEP_K + 32 * c < k)
                if const_expr(mode == "vote"):
                    self.compute(regs, accs)
                else:
                    self.compute_step(regs, accs, fold)
                if const_expr(fold):
                    worst = self.scale_distance(worst, regs, least)
        return worst > Uint32(most - least)

    @cute.jit
    def zero_blocks_check(self, args):
        """Whether a scale byte of this lane's K lies above the fold's window, or below it on a block (the lane's 32
        codes of the row) with a nonzero code: the scales of every step again, and W only where one is below (so
        a weight with few zero blocks reloads few of its codes); four steps' loads in flight."""
        cfg = self.cfg
        _, w_words, sf, rows, _, c, kq, k_lanes, part, n_full, my_steps, k = args
        kp = cfg.k_parts
        flags = Uint32(0)
        for st in cutlass.range(0, my_steps, unroll=4):
            flags = self.check_step(flags, w_words, sf, (kq + st * k_lanes) * kp + part, rows, c)
        if k % cfg.step_k != 0:
            s_last = n_full * kp + part
            if kq == n_full % k_lanes and s_last * STEP_K + 32 * c < k:
                flags = self.check_step(flags, w_words, sf, s_last, rows, c)
        return flags != Uint32(0)

    @cute.jit
    def check_step(self, flags, w_words, sf, s, rows, c):
        """flags, or 1 where a scale of step s of this lane's rows lies above the fold's window, or below it on a
        block with a nonzero code (zero_blocks_check)."""
        cfg = self.cfg
        _, _, least, most = mx_fold_window(cfg.mma_dtype, True)
        rS = cute.make_rmem_tensor(cute.make_layout((2, cfg.groups)), Uint32)
        self.load_scales(rS, sf, s, rows, c)
        for g in cutlass.range_constexpr(cfg.groups):
            for h in cutlass.range_constexpr(2):
                b = Uint32(rS[h, g])
                if b > Uint32(most):
                    flags = flags | Uint32(1)
                if b < Uint32(least):
                    rW = cute.make_rmem_tensor(cute.make_layout((4, 1, 1)), Uint32)
                    cute.copy(w_load_atom(cfg), w_chunk(w_words, rows[g, h], s, c), rW[None, 0, 0])
                    if block_codes(rW, 0, 0) != 0:
                        flags = flags | Uint32(1)
        return flags

    def scale_distance(self, worst, regs, least: int):
        """worst, or the distance above `least` of a scale byte of this loaded step where that is larger (unsigned)."""
        for g in range(self.cfg.groups):
            for h in range(2):
                worst = cutlass.max(worst, Uint32(regs[2][h, g]) - Uint32(least))
        return worst

    def coordinates(self):
        """Where this thread works: (row tile, token tile, rank in the cluster, lane, warp, row-warp, k-warp, this
        warp's K lane of the cluster's k_warps x k_splits, their count, MMA row r = lane / 4, c = lane % 4)."""
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidy, _ = cute.arch.block_idx()
        if const_expr(cfg.m_major):
            bidx, bidy = bidy, bidx  # bidx: the row tile, bidy: the token tile, as in the default grid
        split = 0
        if const_expr(cfg.k_splits > 1):
            split = bidx % cfg.k_splits  # the CTA's rank in its cluster
            bidx = bidx // cfg.k_splits
        lane = tidx % 32
        warp = tidx // 32
        wr = warp % cfg.row_warps
        wk = warp // cfg.row_warps
        kq = wk if cfg.k_splits == 1 else split * cfg.k_warps + wk
        return bidx, bidy, split, lane, warp, wr, wk, kq, cfg.k_warps * cfg.k_splits, lane // 4, lane % 4

    def sums_per_thread(self) -> int:
        """fp32 sums a thread holds after the K loop (its accumulators)."""
        return 4 * self.cfg.groups * self.cfg.token_tiles

    def reduction_smem(self):
        """Shared memory of sum_and_store: every warp's sums (k-warps), and with k_splits > 1 the CTA's sums that
        rank 0 reads (else None)."""
        cfg = self.cfg
        smem = SmemAllocator()
        per_thread = self.sums_per_thread()
        red = smem.allocate_tensor(Float32, cute.make_layout((per_thread, 32, self.warps)), 16)
        cta_sums = None
        if const_expr(cfg.k_splits > 1):
            cta_sums = smem.allocate_tensor(Float32, cute.make_layout((per_thread, 32, cfg.row_warps)), 16)
        return red, cta_sums

    @cute.jit
    def sum_and_store(self, acc, red, cta_sums, lane, warp, wr, wk, split, out):
        """k-warps in warp order through shared memory, then, with k_splits > 1, the cluster's CTAs in rank order;
        the first k-warp of rank 0 stores through store_sums(sum_of, sum_args, *out)."""
        cfg = self.cfg
        per_thread = self.sums_per_thread()
        if const_expr(cfg.k_warps > 1):
            for i in cutlass.range_constexpr(per_thread):
                red[i, lane, warp] = acc[i]
            cute.arch.sync_threads()
        if const_expr(cfg.k_splits == 1):
            if wk == 0:
                self.store_sums(self.k_warp_sum, (acc, red, lane, wr), *out)
        else:
            # The cluster's CTAs in rank order, read by rank 0 from their shared memory; the second barrier keeps
            # every CTA (and its shared memory) alive until rank 0 has read it.
            if wk == 0:
                for i in cutlass.range_constexpr(per_thread):
                    v = self.k_warp_sum(i, acc, red, lane, wr)
                    acc[i] = v
                    cta_sums[i, lane, wr] = v
            cluster_sync()
            if split == 0 and wk == 0:
                self.store_sums(self.cluster_sum, (acc, cta_sums, lane, wr), *out)
            cluster_sync()

    def k_warp_sum(self, i, acc, red, lane, wr):
        """Accumulator i of this thread plus the same accumulator of the CTA's other k-warps, in warp order."""
        v = acc[i]
        for kw in range(1, self.cfg.k_warps):
            v = v + red[i, lane, wr + kw * self.cfg.row_warps]
        return v

    def cluster_sum(self, i, acc, part, lane, wr):
        """Rank 0's CTA sum i plus the other ranks' (their `part` in shared memory), in rank order."""
        v = acc[i]
        addr = (part.iterator + part.layout((i, lane, wr))).toint()
        for z in range(1, self.cfg.k_splits):
            v = v + ld_shared_cluster_f32(addr, z)
        return v

    def store_sums(self, sum_of, sum_args, mGS, row0, r, c, bidy, mY, mBias, m, n, route=None):
        """Every output of this thread's rows and tokens: sum_of(i, *sum_args) for accumulator i, through `store`.
        With P = k_parts > 1, accumulators 2h and 2h + 1 are columns 2c and 2c + 1 of MMA row r + 8h, that is
        (token (2c + b) / P, part (2c + b) % P) against (weight row 8h / P + r / P, part r % P): a lane keeps the one
        whose parts match (b = r % 2, where c % (P / 2) == (r % P) / 2; zero elsewhere), and the P parts of a row
        meet by a fixed butterfly over the lane bits that name them (r's low bits, c's low bits)."""
        cfg = self.cfg
        kp = cfg.k_parts
        factor = self.output_factor(mGS, route)
        for g in range(cfg.groups):
            for t in range(cfg.token_tiles):
                for q in range(4):
                    i = q + 4 * (g + cfg.groups * t)
                    if const_expr(kp == 1):
                        self.store(sum_of(i, *sum_args), factor, g, t, q, row0, r, c, bidy, mY, mBias, m, n, route)
                    elif const_expr(q % 2 == 0):
                        even, odd = sum_of(i, *sum_args), sum_of(i + 1, *sum_args)
                        v = Float32(cutlass.select_(r % 2 == 1, odd, even))
                        if const_expr(kp > 2):
                            v = Float32(cutlass.select_(c % (kp // 2) == (r % kp) // 2, v, Float32(0.0)))
                        for bit in range(kp.bit_length() - 1):  # the lane bits of r's part: 4, 8, 16
                            v = v + cute.arch.shuffle_sync_bfly(v, offset=4 << bit)
                        for bit in range((kp // 2).bit_length() - 1):  # and of c's: 1, 2
                            v = v + cute.arch.shuffle_sync_bfly(v, offset=1 << bit)
                        self.store(v, factor, g, t, q, row0, r, c, bidy, mY, mBias, m, n, route)

    @cute.jit
    def output_factor(self, mGS, route=None):
        """What the fp32 sums are multiplied by before the store: the scale fold's power of two, times the global
        scale where there is one (with a route, its expert's)."""
        factor = Float32(self.cfg.output_factor())
        if const_expr(self.cfg.global_scale):
            factor = factor * mGS[0 if route is None else route.expert]
        return factor

    @cute.jit
    def store(self, v, factor, g, t, q, row0, r, c, bidy, mY, mBias, m, n, route=None):
        """y[tok, row] of accumulator q of group g, token tile t: the sum v times `factor`, plus the bias (with K
        parts, from the lane of part 0). With a route, y[slot, row] from the MMA's first column, the expert's bias,
        and NaN where the slot's expert id is out of range."""
        cfg = self.cfg
        kp = cfg.k_parts
        row = row0 + cfg.group_rows * g + (8 // kp) * (q // 2) + r // kp
        if const_expr(route is None):
            tok = bidy * cfg.tokens_per_cta + cfg.tile_tokens * t + (2 * c + q % 2) // kp
            ok = row < n and tok < m
        else:  # the route's tokens: the slot of this lane's MMA column 2c + q % 2 (-1: none; a repeated column)
            tok = route.slot_of(q % 2, t)
            ok = row < n and tok >= 0
        if const_expr(kp > 1):
            ok = ok and r % kp == 0 and c % (kp // 2) == 0
        if ok:
            v = v * factor
            if const_expr(cfg.bias):
                v = v + mBias[row if route is None else route.row_base + row].to(Float32)
            if const_expr(route is not None):
                v = Float32(cutlass.select_(route.valid, v, Float32(float("nan"))))
            mY[tok, row] = v.to(mY.element_type)
