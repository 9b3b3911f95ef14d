"""The W4A16 linear on Hopper's warpgroup MMA (sm_90a only: `wgmma` does not exist on sm_100): W decoded in registers
is `wgmma.mma_async`'s A operand, x is its B operand in a two-slot ring in shared memory, and W's loads run
`wgmma_depth` steps ahead of the MMAs in registers.

`linear_w4a16` feeds `mma.sync` m16n8k16 from registers on both sides, so every warp loads and pairs x for itself
(four 16-byte loads and 16 PRMT a token tile a step, and 16 registers a tile): at 8 tokens those loads keep the L1's
data pipe 95 % busy, at 16 the x registers halve the resident warps (BENCHMARKS.md, "Where the time goes at 1, 8 and
16 tokens"). Here the four warps of a warpgroup own 16 weight rows each (64 rows: `row_warps = 4`) on the same K
steps, and m64nNk16 (N = 8 or 16 tokens) reads their decoded codes from registers and x from shared memory: a step's
x is copied once for the warpgroup (one 16-byte piece a thread per 8 tokens), not once a warp.

A warpgroup's step i (its steps are kq, kq + k_lanes, ...; k-warps and cluster CTAs split K as in `LinearW4A16`):

    decode W(i) into A fragments (the stage loaded D steps ago)   load W(i + D), scales, x piece(i + D) into that stage
    barrier of the warpgroup (x(i) is in slot i % 2; every warp's MMAs of step i - 1 are done)
    x(i + 1), loaded D - 1 steps ago, paired and stored into slot (i + 1) % 2;  fence.proxy.async
    fence; 8 MMAs; commit; wait (one asm statement, so ptxas keeps the MMAs back to back)

so each lane keeps D steps of W in flight whatever the MMAs wait for (the experiment of `bd1d7b1` staged x whole and
loaded W after each MMA wait: one step in flight, BENCHMARKS.md "Warpgroup MMAs with x in shared memory").

x in shared memory, as wgmma's canonical K-major layout without swizzle, in the decoded codes' K order (PAIRS, as in
`linear_w4a16`): one MMA's B tile is 2 (K halves) x N/8 core matrices of 8 tokens x 16 bytes,

    byte of (token n, MMA slot kappa) = 128·(kappa // 8) + 256·(n // 8) + 16·(n % 8) + 2·(kappa % 8)

so the descriptor's leading byte offset (K) is 128 and its stride byte offset (N) 256. Tokens past M stay zero (the
ring is zeroed once); pieces past K are stored as zeros.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels.compile import SmemAllocator
from cute_kernels.linear_w4a16 import (
    MX_VEC, PAIRS, STEP_K, LinearW4A16, decode_word, ld_global_nc, prmt, scale_codes, scale_multipliers, sf_address,
    x_pair_selector,
)
from cute_kernels.ptx import inline_ptx
from layouts.constants import SF_VEC

MMAS_PER_STEP = STEP_K // 16  # m64nNk16 MMAs of one 128-K step
CORE_BYTES = 128  # one core matrix: 8 rows of 16 bytes
SLOTS = 2  # x ring slots a warpgroup
WG_THREADS = 128

# A B tile's shared-memory descriptor (no swizzle, base offset 0): the low word holds the start address and the
# leading byte offset (128: the two K halves), the high word the stride byte offset (256: 8-token rows of core
# matrices), all in 16-byte units. Shared addresses stay below 2^18, so adding to the address never carries out of it.
DESC_LO_LBO = (CORE_BYTES >> 4) << 16
DESC_HI = 2 * CORE_BYTES >> 4


def x_tile_bytes(tokens: int) -> int:
    """Bytes of x in one MMA's B tile: 16 K slots x `tokens` bf16/f16."""
    return 32 * tokens


def slot_bytes(tokens: int) -> int:
    """One ring slot: a step's MMAS_PER_STEP B tiles."""
    return MMAS_PER_STEP * x_tile_bytes(tokens)


@dsl_user_op
def fence_proxy_async_shared(*, loc=None, ip=None) -> None:
    """This thread's shared-memory stores made visible to the async proxy (wgmma's operand reads)."""
    inline_ptx(None, [], "fence.proxy.async.shared::cta;", "~{memory}", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def bar_sync(barrier, threads: int, *, loc=None, ip=None) -> None:
    """`bar.sync barrier, threads`: a named barrier of `threads` threads (a warpgroup's)."""
    inline_ptx(None, [Int32(barrier).ir_value(loc=loc, ip=ip)], f"bar.sync $0, {threads};", "r,~{memory}",
               side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def ld_v4(addr, qualifier: str, *, loc=None, ip=None):
    """`ld.global.<qualifier>.v4.u32` at a byte address: 16 bytes as four words."""
    res = inline_ptx(llvm.StructType.get_literal([T.i32()] * 4), [Int64(addr).ir_value(loc=loc, ip=ip)],
                     f"ld.global.{qualifier}.v4.u32 {{$0, $1, $2, $3}}, [$4];", "=r,=r,=r,=r,l", loc=loc, ip=ip)
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def st_shared_u32(addr, value, *, loc=None, ip=None) -> None:
    """`st.shared.u32` of `value` at the shared-window address `addr`."""
    inline_ptx(None, [Int32(addr).ir_value(loc=loc, ip=ip), Uint32(value).ir_value(loc=loc, ip=ip)],
               "st.shared.u32 [$0], $1;", "r,r,~{memory}", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def wgmma_step(acc, frags, desc_lo, tile16: int, dtype: str, *, loc=None, ip=None):
    """One step's `wgmma.mma_async` m64nNk16 (N = 2·len(acc)) in one asm statement: fence, an MMA per A fragment
    (four bf16/f16 pairs from registers) with B tile i at the descriptor whose low word is `desc_lo` + i·tile16,
    fp32 accumulate into `acc`, commit and wait. One statement, so that no copy of the accumulators sits between the
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
    # Operands in the constraints' order: the A fragments, the descriptor, then the accumulators tied to the outputs.
    operands = ([Uint32(v).ir_value(loc=loc, ip=ip) for f in frags for v in f]
                + [Int32(desc_lo).ir_value(loc=loc, ip=ip)]
                + [Float32(v).ir_value(loc=loc, ip=ip) for v in acc])
    constraints = ",".join(["=f"] * n + ["r"] * (4 * len(frags)) + ["r"] + [str(i) for i in range(n)])
    # No memory clobber: the ring slot was written before the warpgroup's barrier, and loads of later steps may
    # move above the MMAs.
    res = inline_ptx(llvm.StructType.get_literal([T.f32()] * n), operands, "\n\t".join(lines), constraints,
                     side_effects=True, loc=loc, ip=ip)
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(n)]


class LinearW4A16Wgmma(LinearW4A16):
    """`LinearW4A16` with `wgmma`: one warpgroup a 64-row tile, x through a shared-memory ring, W `wgmma_depth` steps
    ahead in registers."""

    def __init__(self, config, target=None):
        if target is not None and target.family != "sm_90":
            raise ValueError(f"LinearW4A16Wgmma needs sm_90 (wgmma), got {target}")
        super().__init__(config, target)

    @property
    def pieces(self) -> int:
        """16-byte x pieces a thread copies a step: a step's x is 16 pieces (lane c, word w) a token."""
        return self.cfg.tokens_per_cta // 8

    def make_stage(self):
        return (
            cute.make_rmem_tensor(cute.make_layout((4, 2)), Uint32),  # W words (word, half)
            cute.make_rmem_tensor(cute.make_layout((4, self.pieces)), Uint32),  # x pieces
            cute.make_rmem_tensor(cute.make_layout(2), Uint32),  # scale bits (half)
        )

    @cute.jit
    def load_stage(self, stage, addr, s, live, c, xpos, k, m, with_x):
        """Step s into a stage: W's 16 bytes and the block scales of this lane's two rows, and (with_x) this thread's x
        pieces. `addr`: the byte addresses of step 0 (load_addresses). live: whether the warpgroup has step s."""
        cfg = self.cfg
        rW, rX, rS = stage
        if live and s * STEP_K + 32 * c < k:
            for h in cutlass.range_constexpr(2):
                v = ld_v4(addr[h] + Int64(s) * (STEP_K // 2), "L1::no_allocate")
                for e in cutlass.range_constexpr(4):
                    rW[e, h] = v[e]
                rS[h] = ld_global_nc(addr[2 + h] + Int64(s) * addr[4], 16 if cfg.fmt == "nvfp4" else 8)
        else:
            rW.fill(0)
            for h in cutlass.range_constexpr(2):
                rS[h] = Uint32(0x3838)  # any finite scale: the codes are zero
        if const_expr(with_x):
            self.load_x(stage, addr, s, live, xpos, k, m)

    @cute.jit
    def load_x(self, stage, addr, s, live, xpos, k, m):
        """This thread's x pieces of step s (zeros past K or where the warpgroup has no step s; none past M)."""
        _, rX, _ = stage
        for j in cutlass.range_constexpr(self.pieces):
            if live and xpos[0, j] < m and s * STEP_K + xpos[1, j] < k:
                v = ld_v4(addr[5 + j] + Int64(s) * (2 * STEP_K), "nc")
                for e in cutlass.range_constexpr(4):
                    rX[e, j] = v[e]
            else:
                for e in cutlass.range_constexpr(4):
                    rX[e, j] = Uint32(0)

    @cute.jit
    def load_addresses(self, x_words, w_words, sf, rows, c, kq, xpos, m):
        """Byte addresses of step 0 of this thread's loads, and the scale bytes between steps: (W row r, W row r + 8,
        scale of row r, of row r + 8, scale stride, x piece j...). Step s adds s times the step's bytes (64 of W, 256
        of x, one scale stride: every scale layout is linear in the step)."""
        cfg = self.cfg
        addr = cute.make_rmem_tensor(cute.make_layout(5 + self.pieces), Int64)
        per_step = STEP_K // SF_VEC if cfg.fmt == "nvfp4" else STEP_K // MX_VEC
        col0 = c * (per_step // 4)
        for h in cutlass.range_constexpr(2):
            addr[h] = w_words.iterator.toint() + Int64(w_words.layout((rows[0, h], 4 * c))) * 4
            addr[2 + h] = sf_address(sf, cfg.fmt, rows[0, h], col0)
        addr[4] = sf_address(sf, cfg.fmt, rows[0, 0], col0 + per_step) - addr[2]
        for j in cutlass.range_constexpr(self.pieces):
            tok = cutlass.min(xpos[0, j], m - 1)
            addr[5 + j] = x_words.iterator.toint() + Int64(x_words.layout((tok, xpos[1, j] // 2))) * 4
        return addr

    @cute.jit
    def store_x(self, stage, slot_base, xpos, m):
        """This thread's x pieces of a stage, paired in PAIRS order, into their B-tile places of a ring slot."""
        cfg = self.cfg
        _, rX, _ = stage
        tile = x_tile_bytes(cfg.tokens_per_cta)
        for j in cutlass.range_constexpr(self.pieces):
            if xpos[0, j] < m:
                u = [rX[e, j] for e in range(4)]
                bs = [prmt(u[a // 2], u[b // 2], x_pair_selector(a, b)) for a, b in PAIRS[cfg.mma_dtype]]
                row = slot_base + xpos[2, j]
                w = xpos[3, j]
                for jj in cutlass.range_constexpr(2):
                    for kc in cutlass.range_constexpr(2):
                        st_shared_u32(row + (2 * w + jj) * tile + kc * CORE_BYTES, bs[2 * jj + kc])

    @cute.jit
    def decode_stage(self, stage):
        """A step's W as the 8 MMAs' A fragments (the same pairs and scale fold as `LinearW4A16.compute_step`)."""
        cfg = self.cfg
        dt = cfg.mma_dtype
        rW, _, rS = stage
        sc = [scale_multipliers(cfg.fmt, dt, rS[h]) for h in range(2)]
        frags = []
        for w in cutlass.range_constexpr(4):
            dec = [scale_codes(cfg.fmt, dt, decode_word(rW[w, h], dt), sc[h][w // 2]) for h in range(2)]
            for jj in cutlass.range_constexpr(2):
                frags.append((dec[0][2 * jj], dec[1][2 * jj], dec[0][2 * jj + 1], dec[1][2 * jj + 1]))
        return frags

    @cute.kernel
    def kernel(self, x_words: cute.Tensor, w_words: cute.Tensor, sf: cute.Tensor, mY: cute.Tensor,
               mGS: cute.Tensor, mBias: cute.Tensor, m: Int32, n: Int32, k: Int32):
        cfg = self.cfg
        depth = cfg.wgmma_depth
        tokens = cfg.tokens_per_cta
        bidx, bidy, split, lane, warp, wr, wk, kq, k_lanes, r, c = self.coordinates()
        wk = cute.arch.make_warp_uniform(wk)  # the warpgroup: its steps and descriptors in uniform registers
        kq = wk if cfg.k_splits == 1 else split * cfg.k_warps + wk
        tidx, _, _ = cute.arch.thread_idx()
        t = tidx % WG_THREADS
        row0 = bidx * cfg.rows_per_cta + wr * 16
        rows = cute.make_rmem_tensor(cute.make_layout((1, 2)), Int32)
        for h in cutlass.range_constexpr(2):
            rows[0, h] = cutlass.min(row0 + 8 * h + r, n - 1)
        # This thread's x pieces: (token, K offset in a step, byte offset in a B tile, word w).
        xpos = cute.make_rmem_tensor(cute.make_layout((4, self.pieces)), Int32)
        for j in cutlass.range_constexpr(self.pieces):
            nn = t // 16 + 8 * j
            cx = (t % 16) // 4
            xpos[0, j] = bidy * tokens + nn
            xpos[1, j] = 32 * cx + 8 * (t % 4)
            xpos[2, j] = (nn // 8) * (2 * CORE_BYTES) + (nn % 8) * 16 + 4 * cx
            xpos[3, j] = t % 4

        smem = SmemAllocator()
        slots = cfg.wgmma_x_steps if cfg.wgmma_x_steps else SLOTS
        ring = smem.allocate_tensor(Uint32, cute.make_layout(slots * slot_bytes(tokens) // 4 * cfg.k_warps), 128)
        red, cta_sums = self.reduction_smem()
        ring_base = Int32(ring.iterator.toint()) + wk * (slots * slot_bytes(tokens))
        for i in cutlass.range(t, slots * slot_bytes(tokens) // 4, WG_THREADS):
            st_shared_u32(ring_base + 4 * i, Uint32(0))
        bar_sync(1 + wk, WG_THREADS)  # the zeros land before any piece of x

        acc = cute.make_rmem_tensor(cute.make_layout((4, 1, cfg.token_tiles)), Float32)
        acc.fill(0.0)
        tile16 = x_tile_bytes(tokens) >> 4
        n_steps = (k + STEP_K - 1) // STEP_K
        my_steps = (n_steps - kq + k_lanes - 1) // k_lanes
        whole = const_expr(cfg.wgmma_x_steps > 0)
        addr = self.load_addresses(x_words, w_words, sf, rows, c, kq, xpos, m)
        if const_expr(whole):
            # x of every step of this warpgroup staged once, before the K loop (my_steps <= wgmma_x_steps).
            for j in cutlass.range(my_steps, unroll=4):
                stage = self.make_stage()
                self.load_x(stage, addr, kq + j * k_lanes, True, xpos, k, m)
                self.store_x(stage, ring_base + j * slot_bytes(tokens), xpos, m)
        stages = [self.make_stage() for _ in range(depth)]
        for d in cutlass.range_constexpr(depth):
            self.load_stage(stages[d], addr, kq + d * k_lanes, d < my_steps, c, xpos, k, m, not whole)
        if const_expr(not whole):
            self.store_x(stages[0], ring_base, xpos, m)
        fence_proxy_async_shared()
        if const_expr(whole):
            bar_sync(1 + wk, WG_THREADS)
        for base in cutlass.range(0, my_steps, depth, unroll=1):
            for d in cutlass.range_constexpr(depth):
                i = base + d
                if i < my_steps:
                    frags = self.decode_stage(stages[d])
                    ahead = i + depth
                    self.load_stage(stages[d], addr, kq + ahead * k_lanes, ahead < my_steps, c, xpos, k, m, not whole)
                    slot = i
                    if const_expr(not whole):
                        slot = i & 1
                        bar_sync(1 + wk, WG_THREADS)
                        if i + 1 < my_steps:
                            self.store_x(stages[(d + 1) % depth], ring_base + ((i + 1) & 1) * slot_bytes(tokens),
                                         xpos, m)
                            fence_proxy_async_shared()
                    desc_lo = Int32(DESC_LO_LBO) + ((ring_base + slot * slot_bytes(tokens)) >> 4)
                    dd = wgmma_step([acc[q] for q in range(4 * cfg.token_tiles)], frags, desc_lo, tile16,
                                    cfg.mma_dtype)
                    for q in cutlass.range_constexpr(4 * cfg.token_tiles):
                        acc[q] = dd[q]

        self.sum_and_store(acc, red, cta_sums, lane, warp, wr, wk, split, (mGS, row0, r, c, bidy, mY, mBias, m, n))
