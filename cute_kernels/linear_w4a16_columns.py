"""The W4A16 linear for one or two tokens a CTA, with the block scales applied after the MMA ("block columns").

`linear_w4a16` multiplies every decoded pair of codes by its block scale (one HMUL2 a pair) and pairs x for the
MMA's B operand with a PRMT a register, and its bf16 decode takes three integer instructions a pair. Here:

- x is prepared once a call by a small kernel (`prep_kernel`): each token as f16 times a power of two 2^-e (so a
  bf16 x of any range fits f16's, exactly: 8 significant bits in 11, for every element within 2^22 of the token's
  largest), already in the order of the MMA's B registers, so the main loop loads its B operands as they are.
  fp16 x is only reordered (e = 0). The factor 2^e of each token multiplies its outputs at the end (NVFP4), or
  (MXFP4) its block scales, exactly, so that the sums are at the output's own scale: at MXFP4's largest scales (to
  2^125) a sum of x brought up near f16's top would pass fp32's range where the output does not.
- W is decoded to f16 (e4m3 bytes of code · 2^-6, converted two at a time in hardware): 11 instructions a word of 8
  codes, against 13 for bf16 and 4 more for the block scale.
- The block scale goes after the MMA. Lane t of a row group holds 32 consecutive K elements a step, two NVFP4 blocks
  (one MXFP4 block). B column 4j + t holds x of token j only in the K slots of lane t and zeros elsewhere, so column
  4j + t of the product is the partial dot product of lane t's codes alone: MMAs of words 0-1 give lane t's first
  block, words 2-3 its second. Each column is then multiplied by its block scale in fp32 and added into the row's sum
  (an FFMA a column a row a step). The 8 MMA columns hold 2 tokens x 4 lanes, so a CTA takes two tokens.

Lane (r, c) of a warp holds B column r, K slots of lane c: it loads x (token r / 4) only if r % 4 == c, and its
other registers stay zero. Its MMA results are columns 2c, 2c + 1: token c / 2, lane blocks 2(c % 2) and
2(c % 2) + 1, whose scales it loads (4 NVFP4 bytes or 2 MXFP4 bytes a row a step). Lanes c and c ^ 1 hold the two
halves of one token's row sum, added by one shuffle before the store. Every sum is in a fixed order: bit-identical
run to run. Each product W·x is exact in fp32 and the tensor cores sum a column's products of a step in fp32; the
scale then multiplies that sum inside one FFMA (one rounding) where `LinearW4A16` multiplies each code exactly
before the MMA, so the two kernels round differently but alike in size, and agree bit for bit where every sum is
exact (the tests check both).

The work split (row groups, k-warps, clusters) is `LinearW4A16`'s, with two tokens a CTA
(`nvfp4_gemv.linear.kernels`: COLUMN_REGISTERS, block_columns_for; BENCHMARKS.md, "Block scales after the MMA").
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels.compile import SmemAllocator, launch, load_atom
from cute_kernels.decode import e4m3x2_to_f32x2
from cute_kernels.linear_w4a16 import (
    MX_VEC, PAIRS, STEP_K, LinearW4A16, decode_word, ld_global_nc, mma_16816, prmt, sf_address, w_chunk,
    w_load_atom, x_pair_selector,
)
from cute_kernels.ptx import asm_u32, inline_ptx
from layouts.constants import SF_VEC

PREP_THREADS = 1024  # one 64-byte piece a thread covers K up to 32768 in one round trip
X_WORDS_PER_STEP = STEP_K // 2  # f16 pairs of one token's 128-K step
X_TARGET_EXP = 7  # the prepared x of a token lies below 2^(X_TARGET_EXP + 1)


def prepared_words(k: int) -> int:
    """32-bit words of one prepared token (f16 pairs), K rounded up to whole 128-K steps."""
    return -(-k // STEP_K) * X_WORDS_PER_STEP


def _bits_to_f32(bits) -> Float32:
    return Float32(llvm.bitcast(T.f32(), Uint32(bits).ir_value()))


def _f32_bits(v) -> Uint32:
    return Uint32(llvm.bitcast(T.i32(), Float32(v).ir_value()))


def f32x2_to_f16x2(lo, hi) -> Uint32:
    """Two fp32 values to one f16 pair (`cvt.rn.f16x2.f32`, lo in the low half)."""
    return asm_u32([_f32_bits(lo), _f32_bits(hi)], "cvt.rn.f16x2.f32 $0, $2, $1;", "=r,r,r")


@dsl_user_op
def ld_global_nc_u32(addr, *, loc=None, ip=None) -> Uint32:
    """`ld.global.nc.u32` at a byte address (four block scales)."""
    return Uint32(inline_ptx(T.i32(), [Int64(addr).ir_value(loc=loc, ip=ip)], "ld.global.nc.u32 $0, [$1];", "=r,l",
                             loc=loc, ip=ip))


def e8m0_to_f32(s) -> Float32:
    """An e8m0 byte as the fp32 2^(s - 127): s = 0 is the subnormal 2^-127, s = 255 NaN."""
    bits = asm_u32(
        [s],
        "{\n\t.reg .b32 e;\n\t.reg .pred z, n;\n\tshl.b32 e, $1, 23;\n\tsetp.eq.u32 z, $1, 0;\n\t"
        "setp.eq.u32 n, $1, 255;\n\tselp.b32 e, 4194304, e, z;\n\tselp.b32 $0, 2143289344, e, n;\n\t}",
        "=r,r",
    )
    return _bits_to_f32(bits)


class LinearW4A16Columns(LinearW4A16):
    """`LinearW4A16` with `block_columns`: call it with two more operands, the prepared x (M, prepared_words(K))
    uint32 and its factors (M,) fp32, which the call fills before the main kernel reads them."""

    @staticmethod
    def fake_operands(config):
        from cutlass.cute.runtime import make_fake_tensor

        x, w, sf, y, gs, bias = LinearW4A16.fake_operands(config)
        m = x.shape[0]
        xp = make_fake_tensor(Uint32, (m, cute.sym_int(divisibility=64)), stride=(cute.sym_int(divisibility=64), 1),
                              assumed_align=16)
        fx = make_fake_tensor(Float32, (m,), stride=(1,), assumed_align=4)
        return x, w, sf, y, gs, bias, xp, fx

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mSF: cute.Tensor, mY: cute.Tensor, mGS: cute.Tensor,
                 mBias: cute.Tensor, mXP: cute.Tensor, mFX: cute.Tensor, stream=None):
        x_words, w_words, sf, m, n, k = self.views(mX, mW, mSF, mY)
        xp = cute.make_tensor(mXP.iterator, cute.make_layout((m, mXP.shape[1]), stride=(mXP.stride[0], 1)))
        shape = self.launch_shape(m, n)
        prep = self.prep_kernel(x_words, xp, mFX, k)
        main = self.kernel(xp, mFX, w_words, sf, mY, mGS, mBias, m, n, k)
        prep_shape = dict(grid=[m, 1, 1], block=[PREP_THREADS, 1, 1])
        launch(prep, prep_shape, stream)
        launch(main, dict(shape, use_pdl=True), stream)

    # ------------------------------------------------------------ the x pass

    @cute.kernel
    def prep_kernel(self, x_words: cute.Tensor, xp: cute.Tensor, fx: cute.Tensor, k: Int32):
        """Token `block_idx.x`: its largest |x| (bf16), the power of two 2^e that brings it below 2^8, and every
        32-element piece (step s, lane c) as 16 f16 pairs in B-register order at words 64s + 16w + 4c + i."""
        cfg = self.cfg
        cute.arch.griddepcontrol_launch_dependents()
        tidx, _, _ = cute.arch.thread_idx()
        tok, _, _ = cute.arch.block_idx()
        n_pieces = k // 32
        inv = Float32(1.0)
        if const_expr(cfg.x_dtype == "bf16"):
            smem = SmemAllocator()
            red = smem.allocate_tensor(Int32, cute.make_layout(PREP_THREADS // 32), 16)
            mx = Int32(0)
            for p in cutlass.range(tidx, n_pieces, PREP_THREADS, unroll=2):
                u = self.load_piece(x_words, tok, p)
                for i in cutlass.range_constexpr(16):
                    mx = cutlass.max(mx, Int32(u[i] & Uint32(0x7FFF)))
                    mx = cutlass.max(mx, Int32((u[i] >> 16) & Uint32(0x7FFF)))
            for sh in cutlass.range_constexpr(5):
                mx = cutlass.max(mx, cute.arch.shuffle_sync_bfly(mx, offset=1 << sh))
            if tidx % 32 == 0:
                red[tidx // 32] = mx
            cute.arch.sync_threads()
            mx = red[0]
            for w in cutlass.range_constexpr(1, PREP_THREADS // 32):
                mx = cutlass.max(mx, red[w])
            expo = (mx >> 7) & 0xFF  # the bf16 exponent field of the largest |x|
            e = Int32(0)
            if mx != 0 and expo != 255:
                e = cutlass.max(expo - 127 - X_TARGET_EXP, -126)
            inv = _bits_to_f32(Uint32((127 - e) << 23))
            if tidx == 0:
                fx[tok] = _bits_to_f32(Uint32((e + 127) << 23))
        else:
            if tidx == 0:
                fx[tok] = Float32(1.0)
        pairs = PAIRS["fp16"]
        store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Uint32, num_bits_per_copy=128)
        for p in cutlass.range(tidx, n_pieces, PREP_THREADS, unroll=2):  # read again, from L1
            u = self.load_piece(x_words, tok, p)
            s = p // 4
            c = p % 4
            for w in cutlass.range_constexpr(4):
                o = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
                for i in cutlass.range_constexpr(4):
                    a, b = pairs[i]
                    ea, eb = 8 * w + a, 8 * w + b
                    if const_expr(cfg.x_dtype == "bf16"):
                        va = _bits_to_f32(u[ea // 2] << 16 if ea % 2 == 0 else u[ea // 2] & Uint32(0xFFFF0000))
                        vb = _bits_to_f32(u[eb // 2] << 16 if eb % 2 == 0 else u[eb // 2] & Uint32(0xFFFF0000))
                        o[i] = f32x2_to_f16x2(va * inv, vb * inv)
                    else:
                        o[i] = prmt(u[ea // 2], u[eb // 2], x_pair_selector(a, b))
                cute.copy(store, o, cute.local_tile(xp[tok, None], (4,), (16 * s + 4 * w + c,)))

    @staticmethod
    def load_piece(x_words, tok, p):
        """Piece p (32 elements, 64 bytes) of token tok of x, in four 16-byte loads."""
        u = cute.make_rmem_tensor(cute.make_layout(16), Uint32)
        atom = load_atom(Uint32, 128)
        for v in range(4):
            cute.copy(atom, cute.local_tile(x_words[tok, None], (4,), (4 * p + v,)), cute.local_tile(u, (4,), (v,)))
        return u

    # ------------------------------------------------------------ the main kernel

    @cute.jit
    def load_w(self, rW, rS, w_words, sf, s, rows, c, live, live_sf):
        """Step s: W's 16 bytes a row and this lane's block scales (NVFP4: 4 bytes, MXFP4: 2, a row)."""
        cfg = self.cfg
        if live:
            atom_w = w_load_atom(cfg)
            for g in cutlass.range_constexpr(cfg.groups):
                for h in cutlass.range_constexpr(2):
                    cute.copy(atom_w, w_chunk(w_words, rows[g, h], s, c), rW[None, h, g])
        else:
            rW.fill(0)
        for g in cutlass.range_constexpr(cfg.groups):
            for h in cutlass.range_constexpr(2):
                if live_sf:
                    if const_expr(cfg.fmt == "nvfp4"):
                        col = s * (STEP_K // SF_VEC) + 4 * (c % 2)
                        rS[h, g] = ld_global_nc_u32(sf_address(sf, cfg.fmt, rows[g, h], col))
                    else:
                        col = s * (STEP_K // MX_VEC) + 2 * (c % 2)
                        rS[h, g] = ld_global_nc(sf_address(sf, cfg.fmt, rows[g, h], col), 16)
                else:
                    rS[h, g] = Uint32(0x38383838 if cfg.fmt == "nvfp4" else 0x7F7F)  # finite: the codes are zero

    @cute.jit
    def load_x(self, rX, xp, s, tok_x, holds_x, c, live):
        """Step s: the prepared x of this lane's piece, on the lanes that hold x (zeros past K)."""
        if holds_x:
            if live:
                atom_x = load_atom(Uint32, 128)
                for w in cutlass.range_constexpr(4):
                    cute.copy(atom_x, cute.local_tile(xp[tok_x, None], (4,), (16 * s + 4 * w + c,)),
                              cute.local_tile(rX, (4,), (w,)))
            else:
                rX.fill(0)

    @cute.jit
    def compute_cols(self, rW, rS, rX, acc, tok_factor):
        """The step's MMAs into per-step partial sums (NVFP4: one set a block of the lane, MXFP4: one), then each
        column times its block scale into the row sums; where the scales take the token's factor
        (folds_token_factor), each scale first times `tok_factor`, the power of two of the token this lane's columns
        hold."""
        cfg = self.cfg
        sets = 2 if cfg.fmt == "nvfp4" else 1
        for g in cutlass.range_constexpr(cfg.groups):
            d = [[Float32(0.0)] * 4 for _ in range(sets)]
            for w in cutlass.range_constexpr(4):
                dec = [decode_word(rW[w, h, g], "fp16", cfg.shifts_on_fma) for h in range(2)]
                for jj in cutlass.range_constexpr(2):
                    a = (dec[0][2 * jj], dec[1][2 * jj], dec[0][2 * jj + 1], dec[1][2 * jj + 1])
                    b = (rX[4 * w + 2 * jj], rX[4 * w + 2 * jj + 1])
                    ab = w // 2 if sets == 2 else 0
                    d[ab] = mma_16816(d[ab], a, b, "fp16")
            for h in cutlass.range_constexpr(2):
                bits = rS[h, g]
                v = acc[h, g]
                if const_expr(cfg.fmt == "nvfp4"):
                    s00, s01 = e4m3x2_to_f32x2(bits & Uint32(0xFFFF))
                    s10, s11 = e4m3x2_to_f32x2(bits >> 16)
                    v = v + d[0][2 * h] * s00
                    v = v + d[1][2 * h] * s01
                    v = v + d[0][2 * h + 1] * s10
                    v = v + d[1][2 * h + 1] * s11
                else:
                    s0, s1 = e8m0_to_f32(bits & Uint32(0xFF)), e8m0_to_f32(bits >> 8)
                    if const_expr(self.folds_token_factor()):
                        s0, s1 = s0 * tok_factor, s1 * tok_factor
                    v = v + d[0][2 * h] * s0
                    v = v + d[0][2 * h + 1] * s1
                acc[h, g] = v

    @cute.kernel
    def kernel(self, xp: cute.Tensor, fx: cute.Tensor, w_words: cute.Tensor, sf: cute.Tensor, mY: cute.Tensor,
               mGS: cute.Tensor, mBias: cute.Tensor, m: Int32, n: Int32, k: Int32):
        cfg = self.cfg
        bidx, bidy, split, lane, warp, wr, wk, kq, k_lanes, r, c = self.coordinates()
        row0 = bidx * cfg.rows_per_cta + wr * (16 * cfg.groups)
        rows = cute.make_rmem_tensor(cute.make_layout((cfg.groups, 2)), Int32)
        for g in cutlass.range_constexpr(cfg.groups):
            for h in cutlass.range_constexpr(2):
                rows[g, h] = cutlass.min(row0 + 16 * g + 8 * h + r, n - 1)
        tok_x = cutlass.min(bidy * 2 + r // 4, m - 1)
        holds_x = r % 4 == c

        red, cta_sums = self.reduction_smem()
        acc = cute.make_rmem_tensor(cute.make_layout((2, cfg.groups)), Float32)
        acc.fill(0.0)
        rX = cute.make_rmem_tensor(cute.make_layout(16), Uint32)
        rX.fill(0)
        n_full = k // STEP_K
        my_steps = (n_full - kq + k_lanes - 1) // k_lanes
        rW = cute.make_rmem_tensor(cute.make_layout((4, 2, cfg.groups)), Uint32)
        rS = cute.make_rmem_tensor(cute.make_layout((2, cfg.groups)), Uint32)
        # W of the first step is requested before the wait for the x pass, so the two round trips overlap; W of
        # each next step right after the MMAs of the last (the same registers: one step in flight, as in
        # LinearW4A16).
        if my_steps > 0:
            self.load_w(rW, rS, w_words, sf, kq, rows, c, True, True)
        cute.arch.griddepcontrol_wait()  # the prepared x of this call's x pass
        tok_factor = Float32(1.0)
        if const_expr(self.folds_token_factor()):
            tok_factor = fx[cutlass.min(bidy * 2 + c // 2, m - 1)]  # the token of this lane's columns
        for st in cutlass.range(my_steps, unroll=cfg.unroll):
            s = kq + st * k_lanes
            self.load_x(rX, xp, s, tok_x, holds_x, c, True)
            self.compute_cols(rW, rS, rX, acc, tok_factor)
            if st + 1 < my_steps:
                self.load_w(rW, rS, w_words, sf, s + k_lanes, rows, c, True, True)
        if k % STEP_K != 0:
            if kq == n_full % k_lanes:
                s_last = n_full
                live = s_last * STEP_K + 32 * c < k
                self.load_w(rW, rS, w_words, sf, s_last, rows, c, live, s_last * STEP_K + 64 * (c % 2) < k)
                self.load_x(rX, xp, s_last, tok_x, holds_x, c, live)
                self.compute_cols(rW, rS, rX, acc, tok_factor)

        self.sum_and_store(acc, red, cta_sums, lane, warp, wr, wk, split, (fx, mGS, row0, r, c, bidy, mY, mBias, m, n))

    def folds_token_factor(self) -> bool:
        """Whether the token's factor multiplies the block scales (MXFP4 with bf16 x) rather than the output."""
        return self.cfg.fmt == "mxfp4" and self.cfg.x_dtype == "bf16"

    def sums_per_thread(self) -> int:
        return 2 * self.cfg.groups  # rows r and r + 8 of each group, one token

    def store_sums(self, sum_of, sum_args, fx, mGS, row0, r, c, bidy, mY, mBias, m, n):
        """(LinearW4A16.store_sums for block columns.) Rows r, r + 8 of each group, token c / 2: this lane's two
        columns plus its neighbour's (lane c ^ 1), in that order for even c, which stores."""
        cfg = self.cfg
        factor = self.output_factor(mGS)
        for g in range(cfg.groups):
            for h in range(2):
                v = sum_of(h + 2 * g, *sum_args)
                other = cute.arch.shuffle_sync_bfly(v, offset=1)
                self.store_column(v + other, factor, row0 + 16 * g + 8 * h + r, bidy * 2 + c // 2, c, fx, mY, mBias,
                                  m, n)

    @cute.jit
    def store_column(self, v, factor, row, tok, c, fx, mY, mBias, m, n):
        """y[tok, row] from the even lane of the pair: the sum times `factor` and the token's factor (unless the
        scales held it), plus the bias."""
        if c % 2 == 0 and row < n and tok < m:
            y = v * factor
            if const_expr(not self.folds_token_factor()):
                y = y * fx[tok]
            if const_expr(self.cfg.bias):
                y = y + mBias[row].to(Float32)
            mY[tok, row] = y.to(mY.element_type)
