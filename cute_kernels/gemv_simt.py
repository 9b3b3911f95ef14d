"""NVFP4 batched GEMV on CUDA cores: c[m, l] = Σ_k A[m,k,l]·sfa[m,k/16,l]·b[k,l]·sfb[k/16,l], all L in one launch.

One kernel for sm_90 (H200: fp4 decoded with prmt lookups, dp4a) and sm_100 (hardware `cvt.rn.f16x2.e2m1x2`,
fma.rn.f16x2); `decode.py` is the only arch switch. The scales of A and b are read through a `layouts/` layout
in (row, scale column, batch) coordinates, so the contest's permuted `(32,4,rest_m,4,rest_k,L)` buffer and the plain
`(M, K/16, L)` one go through the same code: the layout is a compile-time parameter.

Work split. A thread owns one 32-element K piece (16 bytes of A: one 128-bit load, two scale blocks) for the four
rows r, r+32, r+64, r+96 of a 128-row slab: exactly the rows whose scales of one 64-element group sit in 16
contiguous bytes of the permuted buffer. A warp is r_lanes such r × c_lanes = 32 / r_lanes consecutive pieces:

    lane = c_lanes·ri + c   rows  r = r0 + ri (+ r_lanes·i for i < rows_per_thread), and r + 32q for q < 4
                            piece p = c_lanes·(step·warps + warp) + c  ->  bytes [16p, 16p+16) of each row
    per row and load:       c_lanes lanes read 16·c_lanes contiguous bytes (r_lanes = 2: 256 B, two full lines)
    permuted scales:        r_lanes rows × 16 B contiguous per 64-element group, one 128-bit load a thread

Warps take interleaved K windows; each thread sums its blocks in fp32 in K order, then lanes (butterfly over c) and
warps (in warp order, through shared memory) are added in a fixed order, so the result is bit-identical run to run.
With k_splits > 1 the K windows are shared by the k_splits CTAs of a thread-block cluster (one row block), and rank
0 adds the other ranks' row sums from their shared memory in rank order: still a fixed order, with no atomics and
no workspace in global memory.
The split is chosen per shape and SM count (nvfp4_gemv/dispatch.py: simt_config_for, fitted to an H200 sweep).

With plain scales ptxas (sm_90a) uses 72 registers and spills two values, 8 bytes a thread: an STL of each before
the K loop and an LDL after it, none inside (the SASS summary's `LDL 2 / STL 2`; BENCHMARKS.md, "The plain-scale
spill"). The permuted build uses 64 registers and spills nothing.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32, Int64, Uint8, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T

from cute_kernels import decode
from cute_kernels import tile_scheduler as ts
from cute_kernels.compile import (
    REGISTER_FILE, GemvLaunch, SmemAllocator, cap_registers, gemv_fake_tensors, global_ptr, launch, load_atom,
)
from cute_kernels.ptx import ld_relaxed_gpu_b32, st_relaxed_gpu_b32
from cute_kernels.ptx import cluster_sync, ld_shared_cluster_f32
from layouts.constants import SF_KINDS
from layouts.sf_cute import sf_layout_by_col

PIECE_K = 32  # K elements per thread per step: one 16-byte load of A
# GemvSimtBalanced's empty partial: a NaN no arithmetic makes (the GPU's NaN results are 0x7FFFFFFF), so a partial
# row sum, NaN included, is never taken for it.
PARTIAL_EMPTY = 0x7FBADBAD
PIECE_WORDS = PIECE_K // 8


@dataclass(frozen=True)
class GemvSimtConfig:
    """The cache key of one compiled kernel."""

    sf_kind: str = "permuted"  # layout of sfa and sfb: "permuted" (32,4,rest_m,4,rest_k,L) or "plain" (M,K/16,L)
    warps: int = 8  # warps per CTA, each on its own K windows
    r_lanes: int = 8  # lanes of a warp along r; the other 32 / r_lanes lanes take consecutive K pieces
    rows_per_thread: int = 1  # r values per thread; a CTA covers 4·r_lanes·rows_per_thread rows of one slab
    unroll: int = 2  # unroll of the K-step loop
    k_splits: int = 1  # CTAs of a thread-block cluster that split K for the same rows (their sums meet in shared memory)
    max_registers: int = 0  # GemvSimtBalanced only: 0, as ptxas likes; else a cap (ptxas is told the CTAs an SM holds)

    def __post_init__(self):
        if self.sf_kind not in SF_KINDS:
            raise ValueError(f"sf_kind must be one of {SF_KINDS}, got {self.sf_kind!r}")
        if self.rows_per_thread not in (1, 2, 4):
            raise ValueError(f"rows_per_thread must be 1, 2 or 4, got {self.rows_per_thread}")
        if not 1 <= self.warps <= 32:
            raise ValueError(f"warps must be in 1..32, got {self.warps}")
        if self.r_lanes not in (1, 2, 4, 8) or self.rows_per_thread * self.r_lanes > 32:
            raise ValueError(f"r_lanes must be 1, 2, 4 or 8 with r_lanes·rows_per_thread <= 32, got {self}")
        if self.k_splits not in (1, 2, 4, 8):
            raise ValueError(f"k_splits must be 1, 2, 4 or 8 (a portable cluster), got {self.k_splits}")
        if self.max_registers and (self.max_registers % 8 or not 24 <= self.max_registers <= 248
                                   or REGISTER_FILE // (self.max_registers * 32 * self.warps) < 1):
            raise ValueError(f"max_registers must be 0 or a multiple of 8 in 24..248 at which a CTA fits an SM, "
                             f"got {self}")

    @property
    def c_lanes(self) -> int:
        return 32 // self.r_lanes

    @property
    def rows_per_cta(self) -> int:
        return 4 * self.r_lanes * self.rows_per_thread

    @property
    def ctas_per_slab(self) -> int:
        return 128 // self.rows_per_cta


class GemvSimt(GemvLaunch):
    def __init__(self, config: GemvSimtConfig, target):
        self.cfg = config
        self.arch = target.family  # the decode path: "sm_90" (prmt + dp4a) or "sm_100" (cvt e2m1x2 + fma f16x2)
        self.warps = config.warps
        self.rr = config.rows_per_thread
        self.sf_padded = config.sf_kind == "permuted"  # every row of every 128-row slab exists in the buffer
        if config.max_registers and type(self) is GemvSimt:
            raise ValueError(f"GemvSimt takes no register cap (max_registers is GemvSimtBalanced's), got {config}")

    @staticmethod
    def can_implement(m: int, k: int, l: int) -> bool:
        """M, L >= 1; K a positive multiple of 64; every 32-bit word offset of A and b fits in an int32 (the
        kernel's index arithmetic): max(M, 128) · K/8 · L < 2³¹, i.e. A up to 8 GiB."""
        return m >= 1 and l >= 1 and k >= 64 and k % 64 == 0 and max(m, 128) * (k // 8) * l < 2**31

    @staticmethod
    def fake_operands(config: GemvSimtConfig):
        return gemv_fake_tensors(config.sf_kind)

    @cute.jit
    def build(self, mA, mB, mSFA, mSFB, mC):
        """Trace-time views and grid shared by every launch path: (kernel call, launch keywords)."""
        a_words, b_words, sfa, sfb, c_ml = self.views(mA, mB, mSFA, mSFB, mC)
        m, k, l = mA.shape
        n_slabs = (m + 127) // 128
        splits = self.cfg.k_splits
        shape = dict(grid=[n_slabs * self.cfg.ctas_per_slab * splits, l, 1], block=[32 * self.warps, 1, 1])
        if const_expr(splits > 1):
            shape["cluster"] = [splits, 1, 1]  # consecutive CTAs: one row block, K split over them
        return self.kernel(a_words, b_words, sfa, sfb, c_ml, m, k), shape

    @cute.jit
    def views(self, mA, mB, mSFA, mSFB, mC):
        """The operands as the kernels index them: A and b as 32-bit words, the scales by (row, column, batch)
        through a `layouts/` layout, c as (M, L)."""
        m, k, l = mA.shape
        kw = k // 8
        # Packed fp4 as 32-bit words (8 codes a word, the lowest nibble first), with the tensors' own row and batch
        # strides (in fp4 elements; validation guarantees multiples of 32, i.e. 16 bytes).
        a_words = cute.make_tensor(
            cute.recast_ptr(mA.iterator, dtype=Uint32),
            cute.make_layout((m, kw, l), stride=(mA.stride[0] // 8, 1, mA.stride[2] // 8)),
        )
        b_words = cute.make_tensor(
            cute.recast_ptr(mB.iterator, dtype=Uint32),
            cute.make_layout((1, kw, l), stride=(mB.stride[0] // 8, 1, mB.stride[2] // 8)),
        )
        sfa = cute.make_tensor(
            cute.recast_ptr(mSFA.iterator, dtype=Uint8), sf_layout_by_col(self.cfg.sf_kind, m, k, l)
        )
        sfb = cute.make_tensor(
            cute.recast_ptr(mSFB.iterator, dtype=Uint8), sf_layout_by_col(self.cfg.sf_kind, 128, k, l)
        )
        c_ml = cute.make_tensor(mC.iterator, cute.make_layout((m, l), stride=(1, mC.stride[2])))
        return a_words, b_words, sfa, sfb, c_ml

    @cute.jit
    def load_once(self, src: cute.Tensor, dst: cute.Tensor):
        """A 128-bit load of data read exactly once (A and its scales), with L1::no_allocate so L1 keeps b.

        Chosen over default-cached loads, an L2 evict-first policy, `.L2::256B`, `.cs` and `.nc` loads, all measured
        on the H200 (BENCHMARKS.md, "Load cache qualifiers"). A DSL without CopyG2ROp (4.3) issues it default-cached."""
        atom = load_atom(src.element_type, 128, l1_no_allocate=True)
        if const_expr(cute.rank(src) == 2):
            # The (q, jj) scale slice (4,4):(4,1) is one contiguous 16-byte run: jj-major, then one mode.
            src = cute.make_tensor(src.iterator, cute.coalesce(cute.select(src.layout, mode=[1, 0])))
            dst = cute.make_tensor(dst.iterator, cute.coalesce(cute.select(dst.layout, mode=[1, 0])))
        cute.copy(atom, src, dst)

    def make_buffers(self):
        """Registers for one piece: A words (word, q, i), A scales (q, jj, i), b words, b scales."""
        return (
            cute.make_rmem_tensor(cute.make_layout((PIECE_WORDS, 4, self.rr)), Uint32),
            cute.make_rmem_tensor(cute.make_layout((4, 4, self.rr), stride=(4, 1, 16)), Uint8),
            cute.make_rmem_tensor(cute.make_layout(PIECE_WORDS), Uint32),
            cute.make_rmem_tensor(cute.make_layout(4), Uint8),
        )

    @cute.jit
    def load_piece(self, bufs, a_words, b_words, sfa, sfb, piece, slab, r_first, m, bidl):
        """Issue every load of one 32-element K piece for this thread's 4·rows_per_thread rows."""
        cfg = self.cfg
        rA, rS, rB, rSB = bufs
        grp = piece // 2
        for i in cutlass.range_constexpr(self.rr):
            r = r_first + cfg.r_lanes * i
            for q in cutlass.range_constexpr(4):
                row = cutlass.min(slab * 128 + q * 32 + r, m - 1)
                self.load_once(cute.local_tile(a_words[row, None, bidl], (PIECE_WORDS,), (piece,)), rA[None, q, i])
            if const_expr(self.sf_padded):
                # (q, jj) of one r: 16 contiguous bytes of the permuted buffer, one 128-bit load.
                self.load_once(sfa[((r, None, slab), (None, grp), bidl)], rS[None, None, i])
            else:
                for q in cutlass.range_constexpr(4):
                    row = cutlass.min(slab * 128 + q * 32 + r, m - 1)
                    cute.autovec_copy(
                        sfa[((row % 32, (row // 32) % 4, row // 128), (None, grp), bidl)], rS[q, None, i]
                    )
        cute.autovec_copy(cute.local_tile(b_words[0, None, bidl], (PIECE_WORDS,), (piece,)), rB)
        cute.autovec_copy(sfb[((0, 0, 0), (None, grp), bidl)], rSB)

    @cute.jit
    def compute_piece(self, bufs, acc, piece, luts):
        """Decode and multiply one loaded piece, adding into acc[i, q] (two fp32 roundings per row)."""
        rA, rS, rB, rSB = bufs
        scale_words = [cute.recast_tensor(rS[None, None, i], Uint32) for i in range(self.rr)]
        decode.accumulate_piece(
            self.arch, rA, scale_words, rB, cute.recast_tensor(rSB, Uint32)[0], acc, piece % 2, luts
        )

    def summed_row(self, tidx, bidx, slab):
        """The row whose CTA-wide sum thread `tidx` (< rows_per_cta) adds up and stores: entry tidx of `red`."""
        cfg = self.cfg
        q = tidx // (cfg.r_lanes * self.rr)
        i = (tidx // cfg.r_lanes) % self.rr
        r = (bidx % cfg.ctas_per_slab) * (cfg.rows_per_cta // 4) + tidx % cfg.r_lanes + cfg.r_lanes * i
        return slab * 128 + q * 32 + r

    @cute.jit
    def row_sums_to_smem(self, acc, red, ri, c, warp):
        """Each row's sum over the lanes of this warp (a butterfly over c), into red[row slot, warp]."""
        cfg = self.cfg
        for i in cutlass.range_constexpr(self.rr):
            for q in cutlass.range_constexpr(4):
                v = acc[i, q]
                for sh in cutlass.range_constexpr(cfg.c_lanes.bit_length() - 1):
                    v = v + cute.arch.shuffle_sync_bfly(v, offset=1 << sh)
                if c == 0:
                    red[(q * self.rr + i) * cfg.r_lanes + ri, warp] = v

    def warp_sum(self, red, slot):
        """Row slot `slot` summed over the CTA's warps, in warp order (after a barrier behind row_sums_to_smem)."""
        s = red[slot, 0]
        for w in range(1, self.warps):
            s = s + red[slot, w]
        return s

    @cute.kernel
    def kernel(
        self,
        a_words: cute.Tensor,
        b_words: cute.Tensor,
        sfa: cute.Tensor,
        sfb: cute.Tensor,
        c_ml: cute.Tensor,
        m: Int32,
        k: Int32,
    ):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        bidx, bidl, _ = cute.arch.block_idx()
        splits = cfg.k_splits
        split = 0
        if const_expr(splits > 1):
            split = bidx % splits  # the CTA's rank in its cluster
            bidx = bidx // splits
        lane = tidx % 32
        warp = tidx // 32
        ri = lane // cfg.c_lanes
        c = lane % cfg.c_lanes
        slab = bidx // cfg.ctas_per_slab
        r_first = (bidx % cfg.ctas_per_slab) * (cfg.rows_per_cta // 4) + ri

        # A shift: `//` on the signed Int32 k is a floor-division sequence on the prologue's critical path (k > 0).
        # n_full keeps `//`: written as a shift too, it changed ptxas's schedule of the 4-step loops (61 -> 71
        # registers) and made them 15-20 % slower (BENCHMARKS.md, "The prologue").
        n_pieces = k >> (PIECE_K.bit_length() - 1)
        pieces_per_step = cfg.c_lanes * self.warps * splits
        n_full = n_pieces // pieces_per_step  # steps where every lane has a piece: no guard in the hot loop

        smem = SmemAllocator()
        red = smem.allocate_tensor(Float32, cute.make_layout((cfg.rows_per_cta, self.warps)), 16)
        part = smem.allocate_tensor(Float32, cute.make_layout(cfg.rows_per_cta), 16) if splits > 1 else None
        lut_slots = smem.allocate_tensor(Uint32, cute.make_layout((2, 32)), 16)
        luts = decode.lut_registers(self.arch, lut_slots[None, lane])
        acc = cute.make_rmem_tensor(cute.make_layout((self.rr, 4)), Float32)
        acc.fill(0.0)
        # The loop is unrolled so that ptxas can issue the next step's loads before this step's math. An explicit
        # register double buffer, a per-thread cp.async ring in shared memory and an L2 prefetch of the pieces
        # ahead were all slower on the H200 (BENCHMARKS.md, "Tried, measured, and the verdict").
        piece_stride = pieces_per_step
        piece0 = (warp if splits == 1 else split * self.warps + warp) * cfg.c_lanes + c
        for st in cutlass.range(n_full, unroll=cfg.unroll):
            piece = piece0 + st * piece_stride
            bufs = self.make_buffers()
            self.load_piece(bufs, a_words, b_words, sfa, sfb, piece, slab, r_first, m, bidl)
            self.compute_piece(bufs, acc, piece, luts)
        tail = piece0 + n_full * piece_stride
        if tail < n_pieces:  # the last, partial step: lanes past K idle
            bufs = self.make_buffers()
            self.load_piece(bufs, a_words, b_words, sfa, sfb, tail, slab, r_first, m, bidl)
            self.compute_piece(bufs, acc, tail, luts)

        self.row_sums_to_smem(acc, red, ri, c, warp)
        cute.arch.sync_threads()
        if tidx < cfg.rows_per_cta:
            row = self.summed_row(tidx, bidx, slab)
            s = self.warp_sum(red, tidx)
            if const_expr(splits == 1):
                if row < m:
                    c_ml[row, bidl] = s.to(Float16)
            else:
                part[tidx] = s
        if const_expr(splits > 1):
            # The cluster's CTAs in rank order, read by rank 0 from their shared memory; the second barrier keeps
            # every CTA (and its shared memory) alive until rank 0 has read it.
            cluster_sync()
            if split == 0 and tidx < cfg.rows_per_cta:
                row = self.summed_row(tidx, bidx, slab)
                s = part[tidx]
                addr = (part.iterator + tidx).toint()
                for z in cutlass.range_constexpr(1, splits):
                    s = s + ld_shared_cluster_f32(addr, z)
                if row < m:
                    c_ml[row, bidl] = s.to(Float16)
            cluster_sync()


class GemvSimtBalanced(GemvSimt):
    """The CUDA-core GEMV on a K-balanced schedule: the grid is what the SMs hold at once (`num_ctas`, a launch
    argument), and every CTA reads the same number of K steps, to within one, whatever the shape.

    The work is every (row tile, K step) pair: a row tile is the rows_per_cta rows (and one batch) that a CTA of
    `GemvSimt` owns, a K step the c_lanes x warps pieces its warps read at once. `cute_kernels.tile_scheduler`
    gives CTA g the contiguous run [g·W/G, (g+1)·W/G) of the W pairs, K fastest, so a run is whole tiles plus at
    most a head and a tail of a tile that other CTAs share. A shared tile is finished by the first CTA that shares
    it, at the end of its run, from the fp32 partials the later ones left in the workspace at the start of theirs
    (`finish_shared_tile`); the workspace holds PARTIAL_EMPTY between launches. The order of every sum is fixed by
    the shape and `num_ctas`, so results are bit-identical run to run; there are no atomics, fences or counters.
    Inside a run the loop is `GemvSimt`'s, step for step.

    Why: `GemvSimt`'s grid is one CTA per row tile, so the warps in flight are quantized by the row count
    (7168 x 16384 x 1: 896 tiles of 4 warps fill 85 % of the H200's warp slots; 10240 x 8192 x 1: 61 %), and a
    grid that spills over holds a second, partial wave. This schedule fills the slots on every shape, at the cost of
    a workspace round trip for the tiles that CTAs share. Measured on the H200 it is slower than `GemvSimt` on
    every decode-suite shape, and 5-8 % slower contest-timed (18-21 % graph-timed) even on `GemvSimt`'s own
    split of the work (num_ctas = row tiles): its loop carries the run's state, which takes ptxas to 96 registers
    uncapped, or to spills in the loop at the 63-72 of `GemvSimt`. So dispatch does not pick it (BENCHMARKS.md,
    "A K-balanced schedule").

    The arrival tensor of the launch signature (shared with the tensor-core kernel's SplitLauncher) is unused."""

    PARTIAL_FILL = PARTIAL_EMPTY  # what a new workspace is filled with

    def __init__(self, config: GemvSimtConfig, target):
        if config.k_splits != 1 or config.rows_per_thread != 1:
            raise ValueError(f"GemvSimtBalanced takes k_splits = 1 and rows_per_thread = 1, got {config}")
        super().__init__(config, target)

    @staticmethod
    def fake_operands(config: GemvSimtConfig):
        """Fake (a, b, sfa, sfb, c, partial, arrival, num_ctas): the contest operands and the workspace."""
        from cutlass.cute.runtime import make_fake_compact_tensor

        partial = make_fake_compact_tensor(Float32, (cute.sym_int(),), assumed_align=16)
        arrival = make_fake_compact_tensor(Int32, (cute.sym_int(),), assumed_align=4)
        return (*gemv_fake_tensors(config.sf_kind), partial, arrival, Int32(132))

    @staticmethod
    def fake_pointer_extras(config: GemvSimtConfig):
        """The workspace arguments of the pointer call path: addresses of partial and arrival, and num_ctas."""
        return (Int64(16), Int64(16), Int32(132))

    @staticmethod
    def tiles(config: GemvSimtConfig, m: int, k: int, l: int):  # noqa: E741
        """(row tiles, K steps a tile): the schedule's work is their product. Plain integer arithmetic, so the
        same formula runs on the host (ints) and in the kernel (Int32)."""
        return GemvSimtBalanced.batch_tiles(config, m) * l, GemvSimtBalanced.k_steps(config, k)

    @staticmethod
    def batch_tiles(config: GemvSimtConfig, m):
        """Row tiles of one batch: 128-row slabs of ctas_per_slab tiles each."""
        return ((m + 127) // 128) * config.ctas_per_slab

    @staticmethod
    def k_steps(config: GemvSimtConfig, k):
        """K steps of a row tile, the last one partial where K is not a whole number of steps."""
        per_step = config.c_lanes * config.warps
        return ((k >> (PIECE_K.bit_length() - 1)) + per_step - 1) // per_step

    @classmethod
    def workspace_shape(cls, config: GemvSimtConfig, num_ctas: int, m: int, k: int, l: int):  # noqa: E741
        """(fp32 partial elements, int32 counters) that a launch of `num_ctas` CTAs needs (no counters: one unused
        word); ValueError where the kernel's Int32 schedule arithmetic (CTA index x work items) would overflow."""
        tiles, k_tiles = cls.tiles(config, m, k, l)
        if num_ctas * tiles * k_tiles >= 2**31:
            raise ValueError(f"GemvSimtBalanced: (M, K, L) = ({m}, {k}, {l}) on {num_ctas} CTAs is {tiles * k_tiles} "
                             f"work items; num_ctas x work items must stay under 2^31")
        return ts.workspace_elems(num_ctas, config.rows_per_cta), 1

    @cute.jit
    def extra_views(self, m, l, partial_addr, arrival_addr, num_ctas):  # noqa: E741
        """The workspace as tensors, from the pointer call path's addresses: (partial, arrival, num_ctas)."""
        rows = self.cfg.rows_per_cta
        partial = cute.make_tensor(global_ptr(Float32, partial_addr),
                                   cute.make_layout(ts.workspace_elems(num_ctas, rows)))
        arrival = cute.make_tensor(global_ptr(Int32, arrival_addr, 4), cute.make_layout(1))
        return partial, arrival, num_ctas

    @cute.jit
    def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mSFA: cute.Tensor, mSFB: cute.Tensor, mC: cute.Tensor,
                 mPartial: cute.Tensor, mArrival: cute.Tensor, num_ctas: Int32, stream=None):
        a_words, b_words, sfa, sfb, c_ml = self.views(mA, mB, mSFA, mSFB, mC)
        m, k, l = mA.shape
        call = self.kernel(a_words, b_words, sfa, sfb, c_ml, mPartial, m, k, l, num_ctas)
        shape = dict(grid=[num_ctas, 1, 1], block=[32 * self.warps, 1, 1])
        if const_expr(self.cfg.max_registers > 0):
            # A CTA's shared memory: its row sums and lookup tables, and 1 KB the SM reserves a CTA.
            ctas = REGISTER_FILE // (self.cfg.max_registers * 32 * self.warps)
            cap_registers(shape, ctas, 4 * self.cfg.rows_per_cta * self.warps + 4 * 2 * 32 + 16 + 1024)
        launch(call, shape, stream=stream)

    @cute.kernel
    def kernel(
        self,
        a_words: cute.Tensor,
        b_words: cute.Tensor,
        sfa: cute.Tensor,
        sfb: cute.Tensor,
        c_ml: cute.Tensor,
        mPartial: cute.Tensor,
        m: Int32,
        k: Int32,
        l: Int32,  # noqa: E741
        num_ctas: Int32,
    ):
        cfg = self.cfg
        rows = cfg.rows_per_cta
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        lane = tidx % 32
        warp = tidx // 32
        ri = lane // cfg.c_lanes
        c = lane % cfg.c_lanes

        n_pieces = k >> (PIECE_K.bit_length() - 1)
        pieces_per_step = cfg.c_lanes * self.warps
        n_full = n_pieces // pieces_per_step  # full K steps of a tile; a last, partial one runs guarded
        tiles_per_batch = self.batch_tiles(cfg, m)
        k_tiles = self.k_steps(cfg, k)
        # Int32 schedule arithmetic: workspace_shape refuses a launch where num_ctas x the work would overflow.
        total = tiles_per_batch * l * k_tiles
        g_count = ts.effective_ctas(num_ctas, total, cutlass.min)
        w, w_end = ts.cta_run(cta, num_ctas, total, cutlass.min)

        smem = SmemAllocator()
        red = smem.allocate_tensor(Float32, cute.make_layout((rows, self.warps)), 16)
        lut_slots = smem.allocate_tensor(Uint32, cute.make_layout((2, 32)), 16)
        luts = decode.lut_registers(self.arch, lut_slots[None, lane])
        acc = cute.make_rmem_tensor(cute.make_layout((1, 4)), Float32)
        piece0 = warp * cfg.c_lanes + c
        while w < w_end:
            tile, k0, k1, w_next = ts.next_segment(w, w_end, k_tiles, cutlass.min)
            bidx = tile % tiles_per_batch
            bidl = tile // tiles_per_batch
            slab = bidx // cfg.ctas_per_slab
            r_first = (bidx % cfg.ctas_per_slab) * (rows // 4) + ri
            acc.fill(0.0)
            first_piece = piece0 + k0 * pieces_per_step
            for st in cutlass.range(cutlass.min(k1, n_full) - k0, unroll=cfg.unroll):
                piece = first_piece + st * pieces_per_step
                bufs = self.make_buffers()
                self.load_piece(bufs, a_words, b_words, sfa, sfb, piece, slab, r_first, m, bidl)
                self.compute_piece(bufs, acc, piece, luts)
            tail = piece0 + n_full * pieces_per_step
            if k1 > n_full and tail < n_pieces:  # the tile's last, partial step is in this run: lanes past K idle
                bufs = self.make_buffers()
                self.load_piece(bufs, a_words, b_words, sfa, sfb, tail, slab, r_first, m, bidl)
                self.compute_piece(bufs, acc, tail, luts)

            self.row_sums_to_smem(acc, red, ri, c, warp)
            cute.arch.sync_threads()
            s = Float32(0.0)
            row = self.summed_row(tidx, bidx, slab)
            if tidx < rows:
                s = self.warp_sum(red, tidx)
            first = ts.tile_first_cta(tile, k_tiles, g_count, total)
            last = ts.tile_last_cta(tile, k_tiles, g_count, total)
            if first == last:
                if tidx < rows and row < m:
                    c_ml[row, bidl] = s.to(Float16)
            else:
                self.finish_shared_tile(s, row, bidl, tidx, tile, first, last, cta, k_tiles, g_count, total, c_ml,
                                        mPartial, m)
            cute.arch.sync_threads()  # red is free for the next segment
            w = w_next

    @cute.jit
    def finish_shared_tile(self, s, row, bidl, tidx, tile, first, last, g, k_tiles, g_count, total, c_ml, mPartial, m):
        """A tile shared by CTAs first..last. CTA `first` holds the tile's first K steps at the end of its run; every
        later one holds later steps at the start of its run, so by the time `first` gets here they have long left
        their partials. They store them and go on: no fence, no counter, nothing to wait for. `first` reads each
        partial row as the L2 holds it until it is no longer PARTIAL_EMPTY (each is one 32-bit word, so it is
        either old or whole), adds them in CTA order after its own, stores the rows and puts PARTIAL_EMPTY back,
        which leaves the workspace as the next launch needs it. The wait needs the CTAs first..last resident at
        once, which the grid (what the SMs hold) gives."""
        rows = self.cfg.rows_per_cta
        if tidx < rows:
            if g != first:
                slot = ts.partial_slot(g, tile, k_tiles, g_count, total, cutlass.min)
                st_relaxed_gpu_b32((mPartial.iterator + ts.partial_offset(g, slot, tidx, rows)).llvm_ptr,
                                   llvm.bitcast(T.i32(), s.ir_value()))
            else:
                acc = s
                for cc in cutlass.range(first + 1, last + 1, 1):
                    c_slot = ts.partial_slot(cc, tile, k_tiles, g_count, total, cutlass.min)
                    ptr = (mPartial.iterator + ts.partial_offset(cc, c_slot, tidx, rows)).llvm_ptr
                    bits = ld_relaxed_gpu_b32(ptr)
                    while bits == Int32(PARTIAL_EMPTY):
                        bits = ld_relaxed_gpu_b32(ptr)
                    st_relaxed_gpu_b32(ptr, Int32(PARTIAL_EMPTY))
                    acc = acc + Float32(llvm.bitcast(T.f32(), bits.ir_value()))
                if row < m:
                    c_ml[row, bidl] = acc.to(Float16)
