"""The W4A16 linear on Hopper's warpgroup MMA: W decoded in registers is wgmma's A operand, x is its B operand in
shared memory, staged once a CTA ("wgmma"; sm_90a only: wgmma does not exist on sm_100).

`linear_w4a16` feeds `mma.sync` m16n8k16 from registers on both sides, so every warp loads and pairs x for itself
(four 16-byte loads and 16 PRMT a token tile a step, and 16 registers a tile): at 8 tokens those loads keep the L1's
data pipe 95 % busy, at 16 the x registers halve the resident warps (BENCHMARKS.md, "Where the time goes at 1, 8 and
16 tokens"). Here the four warps of a warpgroup own 16 weight rows each (64 rows, `row_warps = 4`) on the same K
steps, and `wgmma.mma_async` m64nNk16 (N = 8 or 16 tokens) reads their decoded codes from registers and x from
shared memory, where the CTA put it before its K loop: no x load, PRMT or register in the loop.

x in shared memory. The CTA stages x for every 128-K step its warpgroups take (`x_slots` steps at most) in the
order of the decoded codes (the same K permutation as `linear_w4a16`, PAIRS), as wgmma's canonical K-major layout
without swizzle: a B tile of one MMA is 2 (K halves) x N/8 core matrices of 8 tokens x 16 bytes,

    byte of (token n, MMA slot kappa) = 32N·(8·slot + mma) + 128·(kappa // 8) + 256·(n // 8) + 16·(n % 8) + 2·(kappa % 8)

so the descriptor's leading byte offset (K) is 128 and its stride byte offset (N) 256. Tokens past M are zeros.

The rest is `LinearW4A16`'s: the decode and block scales of a step (decode_word, scale_codes), the accumulators'
layout (wgmma's m64nNk16 D fragment of a warp is mma.sync's C fragment of its 16 rows, one 8-column tile after
the other), and the reduction over warpgroups (k_warps) and cluster CTAs (k_splits) in a fixed order.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels.compile import SmemAllocator, load_atom
from cute_kernels.linear_w4a16 import (
    PAIRS, STEP_K, LinearW4A16, decode_word, prmt, scale_codes, scale_multipliers, x_pair_selector,
)
from cute_kernels.ptx import inline_ptx

MMAS_PER_STEP = STEP_K // 16  # m64nNk16 MMAs of one 128-K step
CORE_BYTES = 128  # one core matrix: 8 rows of 16 bytes
X_ALIGN = 128


def x_tile_bytes(tokens: int) -> int:
    """Bytes of x in one MMA's B tile: 16 K slots x `tokens` bf16/f16."""
    return 32 * tokens


def x_smem_bytes(x_slots: int, tokens: int) -> int:
    """Shared memory of the staged x: x_slots steps of MMAS_PER_STEP B tiles."""
    return x_slots * MMAS_PER_STEP * x_tile_bytes(tokens)


# A B tile's shared-memory descriptor (no swizzle, base offset 0): the low word holds the start address and the
# leading byte offset (128: the two K halves), the high word the stride byte offset (256: 8-token rows of core
# matrices), all in 16-byte units. Shared addresses stay below 2^18, so adding to the address never carries out of it.
DESC_LO_LBO = (CORE_BYTES >> 4) << 16
DESC_HI = 2 * CORE_BYTES >> 4


@dsl_user_op
def fence_proxy_async_shared(*, loc=None, ip=None) -> None:
    """This thread's shared-memory stores made visible to the async proxy (wgmma's operand reads)."""
    inline_ptx(None, [], "fence.proxy.async.shared::cta;", "~{memory}", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def wgmma_step(acc, frags, desc_lo, tile16: int, dtype: str, *, loc=None, ip=None):
    """One step's `wgmma.mma_async` m64nNk16 (N = 2·len(acc)) in one asm statement: fence, an MMA per A fragment
    (four bf16/f16 pairs from registers) with B tile i at the descriptor whose low word is `desc_lo` + i·tile16 (K-major,
    no swizzle; the high word is DESC_HI), fp32
    accumulate into `acc`, commit and wait. One statement, so that no copy of the accumulators sits between the
    MMAs (ptxas would wait for each MMA before it)."""
    n = len(acc)
    ab = "bf16" if dtype == "bf16" else "f16"
    d = ", ".join(f"${i}" for i in range(n))
    a0 = n
    dsc = n + 4 * len(frags)
    lines = ["{", ".reg .b32 lo, hi;", ".reg .b64 dd;", ".reg .pred p;", "setp.ne.b32 p, 1, 0;",
             f"mov.b32 hi, {DESC_HI};", "wgmma.fence.sync.aligned;"]
    for i in range(len(frags)):
        av = ", ".join(f"${a0 + 4 * i + e}" for e in range(4))
        lines += [f"add.u32 lo, ${dsc}, {i * tile16};", "mov.b64 dd, {lo, hi};",
                  f"wgmma.mma_async.sync.aligned.m64n{2 * n}k16.f32.{ab}.{ab} {{{d}}}, {{{av}}}, dd, p, 1, 1, 0;"]
    lines += ["wgmma.commit_group.sync.aligned;", "wgmma.wait_group.sync.aligned 0;", "}"]
    # Inputs in the constraints' order: the A fragments, the descriptor, then the accumulators tied to the outputs.
    operands = ([Uint32(v).ir_value(loc=loc, ip=ip) for f in frags for v in f]
                + [Int32(desc_lo).ir_value(loc=loc, ip=ip)]
                + [Float32(v).ir_value(loc=loc, ip=ip) for v in acc])
    constraints = ",".join(["=f"] * n + ["r"] * (4 * len(frags)) + ["r"] + [str(i) for i in range(n)])
    # No memory clobber: the staged x was written before the CTA's barrier, and W loads of later steps may move
    # above the MMAs (as they do above mma.sync in LinearW4A16).
    res = inline_ptx(llvm.StructType.get_literal([T.f32()] * n), operands, "\n\t".join(lines), constraints,
                     side_effects=True, loc=loc, ip=ip)
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(n)]


class LinearW4A16Wgmma(LinearW4A16):
    """`LinearW4A16` with `wgmma`: one warpgroup a 64-row tile, x staged in shared memory."""

    def __init__(self, config, target=None):
        if target is not None and target.family != "sm_90":
            raise ValueError(f"LinearW4A16Wgmma needs sm_90 (wgmma), got {target}")
        super().__init__(config, target)

    def slots_used(self, n_full, tail, split):
        """Staged steps of this CTA: rounds of k_warps steps, a round for every k_lanes steps of K (the partial last
        step included)."""
        cfg = self.cfg
        k_lanes = cfg.k_warps * cfg.k_splits
        return ((n_full + tail - split * cfg.k_warps + k_lanes - 1) // k_lanes) * cfg.k_warps

    @cute.jit
    def stage_x(self, x_words, xs_base, m, k, n_full, tail, split, bidy):
        """Every thread copies 16-byte pieces of x (token n, step s, lane c, word w) into their B-tile slots."""
        cfg = self.cfg
        tokens = cfg.tokens_per_cta
        tile = x_tile_bytes(tokens)
        k_lanes = cfg.k_warps * cfg.k_splits
        tidx, _, _ = cute.arch.thread_idx()
        slots = self.slots_used(n_full, tail, split)
        pieces = slots * tokens * 16
        pairs = PAIRS[cfg.mma_dtype]
        atom = load_atom(Uint32, 128)
        for p in cutlass.range(tidx, pieces, cfg.threads, unroll=4):
            cw = p % 16  # (c, w): 4c + w
            n = (p // 16) % tokens
            j = p // (16 * tokens)
            c = cw // 4
            w = cw % 4
            s = (j // cfg.k_warps) * k_lanes + split * cfg.k_warps + j % cfg.k_warps
            k0 = s * STEP_K + 32 * c + 8 * w
            tok = bidy * tokens + n
            u = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
            u.fill(0)
            if tok < m and k0 < k:
                cute.copy(atom, cute.local_tile(x_words[tok, None], (4,), (k0 // 8,)), u)
            bs = [prmt(u[a // 2], u[b // 2], x_pair_selector(a, b)) for a, b in pairs]
            row = xs_base + (n // 8) * (2 * CORE_BYTES) + (n % 8) * 16 + 4 * c
            for jj in cutlass.range_constexpr(2):
                mma = 2 * w + jj
                for kc in cutlass.range_constexpr(2):
                    addr = row + (j * MMAS_PER_STEP + mma) * tile + kc * CORE_BYTES
                    st_shared_u32(addr, bs[2 * jj + kc])
        fence_proxy_async_shared()
        cute.arch.sync_threads()

    def make_regs(self):
        return (
            cute.make_rmem_tensor(cute.make_layout((4, 2, 1)), Uint32),  # W words (word, half)
            None,
            cute.make_rmem_tensor(cute.make_layout((2, 1)), Uint32),  # scale bits (half)
        )

    @cute.jit
    def load_w_step(self, regs, w_words, sf, s, rows, c, live):
        """W's 16 bytes and the block scales of step s for this thread's two rows (zeros where not live)."""
        rW, _, rS = regs
        if live:
            wq = s * (STEP_K // 8) + 4 * c
            atom_w = load_atom(Uint32, 128, l1_no_allocate=True)
            for h in cutlass.range_constexpr(2):
                cute.copy(atom_w, cute.local_tile(w_words[rows[0, h], None], (4,), (wq // 4,)), rW[None, h, 0])
            self.load_scales(rS, sf, s, rows, c)
        else:
            rW.fill(0)
            for h in cutlass.range_constexpr(2):
                rS[h, 0] = Uint32(0x3838)  # any finite scale: the codes are zero

    @cute.jit
    def mma_step(self, regs, acc, desc_lo):
        """Decode a step's codes and issue its 8 MMAs (B tiles from the descriptor low word desc_lo on), then wait."""
        cfg = self.cfg
        dt = cfg.mma_dtype
        rW, _, rS = regs
        tile16 = x_tile_bytes(cfg.tokens_per_cta) >> 4
        sc = [scale_multipliers(cfg.fmt, dt, rS[h, 0]) for h in range(2)]
        nacc = 4 * cfg.token_tiles
        d = [acc[i] for i in range(nacc)]
        frags = []
        for w in cutlass.range_constexpr(4):
            dec = [scale_codes(cfg.fmt, dt, decode_word(rW[w, h, 0], dt), sc[h][w // 2]) for h in range(2)]
            for jj in cutlass.range_constexpr(2):
                frags.append((dec[0][2 * jj], dec[1][2 * jj], dec[0][2 * jj + 1], dec[1][2 * jj + 1]))
        d = wgmma_step(d, frags, desc_lo, tile16, dt)
        for i in cutlass.range_constexpr(nacc):
            acc[i] = d[i]

    @cute.kernel
    def kernel(self, x_words: cute.Tensor, w_words: cute.Tensor, sf: cute.Tensor, mY: cute.Tensor,
               mGS: cute.Tensor, mBias: cute.Tensor, m: Int32, n: Int32, k: Int32):
        cfg = self.cfg
        bidx, bidy, split, lane, warp, wr, wk, kq, k_lanes, r, c = self.coordinates()
        # The warpgroup's index as a warp-uniform value, so that its steps and B descriptors live in uniform registers.
        wk = cute.arch.make_warp_uniform(wk)
        kq = wk if cfg.k_splits == 1 else split * cfg.k_warps + wk
        row0 = bidx * cfg.rows_per_cta + wr * 16
        rows = cute.make_rmem_tensor(cute.make_layout((1, 2)), Int32)
        for h in cutlass.range_constexpr(2):
            rows[0, h] = cutlass.min(row0 + 8 * h + r, n - 1)

        smem = SmemAllocator()
        xs = smem.allocate_tensor(Uint32, cute.make_layout(x_smem_bytes(cfg.x_slots, cfg.tokens_per_cta) // 4),
                                  X_ALIGN)
        red, cta_sums = self.reduction_smem(smem)
        xs_base = Int32(xs.iterator.toint())
        n_full = k // STEP_K
        tail = 1 if k % STEP_K != 0 else 0
        self.stage_x(x_words, xs_base, m, k, n_full, tail, split, bidy)

        acc = cute.make_rmem_tensor(cute.make_layout((4, 1, cfg.token_tiles)), Float32)
        acc.fill(0.0)
        tile16 = x_tile_bytes(cfg.tokens_per_cta) >> 4
        desc_base = Int32(DESC_LO_LBO) + (xs_base >> 4)
        my_steps = (n_full - kq + k_lanes - 1) // k_lanes
        for st in cutlass.range(my_steps, unroll=cfg.unroll):
            regs = self.make_regs()
            self.load_w_step(regs, w_words, sf, kq + st * k_lanes, rows, c, True)
            self.mma_step(regs, acc, desc_base + (st * cfg.k_warps + wk) * (MMAS_PER_STEP * tile16))
        if tail == 1:
            if kq == n_full % k_lanes:
                regs = self.make_regs()
                st = n_full // k_lanes
                self.load_w_step(regs, w_words, sf, n_full, rows, c, n_full * STEP_K + 32 * c < k)
                self.mma_step(regs, acc, desc_base + (st * cfg.k_warps + wk) * (MMAS_PER_STEP * tile16))

        self.sum_and_store(acc, red, cta_sums, lane, warp, wr, wk, split, (mGS, row0, r, c, bidy, mY, mBias, m, n))


@dsl_user_op
def st_shared_u32(addr, value, *, loc=None, ip=None) -> None:
    """`st.shared.u32` of `value` at the shared-window address `addr`."""
    inline_ptx(None, [Int32(addr).ir_value(loc=loc, ip=ip), Uint32(value).ir_value(loc=loc, ip=ip)],
               "st.shared.u32 [$0], $1;", "r,r,~{memory}", side_effects=True, loc=loc, ip=ip)
