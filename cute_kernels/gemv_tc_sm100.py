"""NVFP4 batched GEMV on Blackwell (sm_100a) block-scaled tensor cores: c[m,0,l] = fp16(sum_k A*SFA * b*SFB).

Data: A (M, K, L) fp4 K-major, b (rows >= 1, K, L) fp4 (row 0 is the vector), scales in the permuted
(32,4,rest_m,4,rest_k,L) layout of docs/contract.md, which is the 32x4x4 atom the MMA reads, so SFA goes
global -> shared (TMA) -> tensor memory (tcgen05.cp) unchanged. c (M, 1, L) fp16.

Design: one tcgen05 `kind::mxf4nvf4` MMA of 128 x N=8 x 64 per K block (N=8 is the smallest legal N with
CtaGroup.ONE; column 0 of the accumulator is the GEMV, columns 1..7 are b's rows 1..7 and are discarded).
Warp roles: warp 5 issues TMA into a `stages`-deep shared ring, warp 4 issues tcgen05.cp + MMA into a
double-buffered fp32 TMEM accumulator, warps 0-3 read it back (tcgen05.ld 32x32b, one row a thread).
The grid is one CTA per SM under the deterministic K-balanced schedule of `tile_scheduler`: a tile split over
several CTAs is finished by the last CTA to arrive (integer arrival counter), which sums the fp32 partials in
CTA order. No float atomics: results are bit-identical run to run.

Shapes: any M >= 1 (TMA zero-fills rows past M; stores are predicated), any K that is a multiple of 64
(a last K tile shorter than `tile_k` is zero-filled by TMA, values and scales alike), any L >= 1.

PREDICTION for a B200 (148 SMs, ~8 TB/s), not a measurement (no B200 was available; nothing here has run):
    (M, K, L)          K tiles/CTA   bytes     SOL      predicted
    (7168, 16384, 1)   24.2          66.1 MB   8.62 us  ~10-11 us: A+SFA flow at ~85% of HBM peak
    (4096, 7168, 8)    48.4         132.2 MB  17.28 us  ~20 us
    (7168, 2048, 4)    12.1          33.1 MB   4.32 us  ~6-7 us: launch + pipeline fill dominate
The schedule balances every shape to within one 256-wide K tile per SM. A fixed split would not: shape 1 as
2 splits x 56 tiles leaves 36 of 148 SMs idle, and shape 2's 256 whole tiles put 2 on 108 SMs (16% over the
balanced 48.4 K tiles). The extra arguments of the compiled function are its workspace: fp32 partials
(num_ctas x 2 x 128) and int32 arrival counters (one per output tile, zero between launches).
"""

from __future__ import annotations

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils.blackwell_helpers as sm100_utils
import cutlass.utils.blockscaled_layout as blockscaled_utils
from cutlass.cute.nvgpu import cpasync, tcgen05

from cute_kernels import tile_scheduler as ts
from cute_kernels.ptx import tcgen05_fence_after_thread_sync, tcgen05_fence_before_thread_sync
from cute_kernels.compile import (
    OperandMajorMode, SmemAllocator, atomic_add_acq_rel_gpu, blockscaled_gemm, blockscaled_tiled_mma, global_ptr,
    launch, load_relaxed_gpu_f32, member_ptr, tmem_allocator,
)
from layouts import sf_cute
from layouts.constants import SF_VEC

MMA_K = 64  # K of one kind::mxf4nvf4 MMA
TILE_M = ts.TILE_M
SM100_SMEM_BYTES = 232448
SM100_NUM_SMS = 148
TMEM_COLUMNS = 512  # tensor memory per SM: 128 lanes x 512 32-bit columns


@dataclass(frozen=True)
class GemvTcSm100Config:
    """Compile-time choices; the instance is the compile cache key."""

    tile_k: int = 256  # K elements per pipeline stage (4 MMAs); 128 B of A per row -> 128B swizzle
    stages: int = 8  # shared-memory ring depth: 8 x 21.5 KB; ~147 KB of A+SFA in flight per SM
    mma_n: int = 8  # MMA N: 8 is the smallest legal N for CtaGroup.ONE, M=128; CUTLASS validates 64..256 (below)
    acc_stages: int = 2  # TMEM accumulators, so the epilogue of one segment overlaps the next's MMAs

    def __post_init__(self):
        if self.tile_k % MMA_K or self.tile_k < MMA_K:
            raise ValueError(f"tile_k must be a positive multiple of {MMA_K}, got {self.tile_k}")
        if self.mma_n % 8 or not 8 <= self.mma_n <= 256:
            raise ValueError(f"mma_n must be a multiple of 8 in 8..256, got {self.mma_n}")
        if self.smem_bytes() > SM100_SMEM_BYTES:
            raise ValueError(f"{self}: the shared-memory ring needs {self.smem_bytes()} bytes, more than "
                             f"{SM100_SMEM_BYTES}; use fewer stages")
        if self.tmem_columns() > TMEM_COLUMNS:
            raise ValueError(f"{self}: needs {self.tmem_columns()} TMEM columns, more than {TMEM_COLUMNS}")

    @property
    def sf_tmem_col(self) -> int:
        """First TMEM column of the scales (SFA, then SFB): past the accumulators' N x acc_stages, 32-aligned."""
        return max(32, -(-self.mma_n * self.acc_stages // 32) * 32)

    def tmem_columns(self) -> int:
        """TMEM columns to allocate: accumulators and both scale copies, as a power of two >= 32."""
        cols = self.sf_tmem_col + 2 * (TILE_M // 32) * (self.tile_k // MMA_K)
        n = 32
        while n < cols:
            n *= 2
        return n

    def smem_bytes(self) -> int:
        a = TILE_M * self.tile_k // 2
        b = self.mma_n * self.tile_k // 2
        sf = 128 * (self.tile_k // SF_VEC)  # SFA, and SFB staged as a 128-row block
        return self.stages * (a + b + 2 * sf) + 1024


class GemvTcSm100:
    """Block-scaled tensor-core GEMV for sm_100a; see the module docstring."""

    threads = 192
    epi_warps = 4
    mma_warp = 4
    tma_warp = 5

    def __init__(self, config: GemvTcSm100Config, target):
        if target.family != "sm_100":
            raise ValueError(
                f"gemv_tc_sm100 needs tcgen05 block-scaled MMAs (sm_100a); cannot compile for {target.gpu_arch}"
            )
        self.config = config
        self.mma_tiler = (TILE_M, config.mma_n, config.tile_k)
        self.mma_tiler_sfb = (TILE_M, 128, config.tile_k)  # SF helpers stage B's scales as 128 rows
        self.num_kblocks = config.tile_k // MMA_K

    @staticmethod
    def can_implement(m: int, k: int, l: int) -> bool:
        """M >= 1, K a positive multiple of 64 (one MMA K and one 32-byte TMA row), L >= 1."""
        return m >= 1 and k >= MMA_K and k % MMA_K == 0 and l >= 1

    def _make_tiled_mmas(self):
        def make(n):
            return blockscaled_tiled_mma(
                cutlass.Float4E2M1FN,
                OperandMajorMode.K,
                OperandMajorMode.K,
                cutlass.Float8E4M3FN,
                SF_VEC,
                tcgen05.CtaGroup.ONE,
                (TILE_M, n),
            )

        return make(self.config.mma_n), make(128)

    @staticmethod
    def fake_operands(config: GemvTcSm100Config):
        """Fake (a, b, sfa, sfb, c, partial, arrival, num_ctas) with dynamic M, K, L and b's row count."""
        m, k, l = cute.sym_int(), cute.sym_int(divisibility=MMA_K), cute.sym_int()  # noqa: E741
        args = fake_arguments(m, k, l, rows_b=cute.sym_int(), rest_m=cute.sym_int(), rest_k=cute.sym_int())
        return (*args, cutlass.Int32(SM100_NUM_SMS))

    @staticmethod
    def workspace_shape(config: GemvTcSm100Config, num_ctas: int, m: int, k: int, l: int):  # noqa: E741
        """(fp32 partial elements, int32 counters) that a launch of `num_ctas` CTAs needs."""
        return ts.workspace_elems(num_ctas), ts.num_output_tiles(m, l)

    @staticmethod
    def fake_pointer_extras(config: GemvTcSm100Config):
        """The workspace arguments of the pointer call path: addresses of partial (fp32) and arrival (int32), and
        num_ctas."""
        return (cutlass.Int64(16), cutlass.Int64(16), cutlass.Int32(SM100_NUM_SMS))

    @cute.jit
    def extra_views(self, m, l, partial_addr, arrival_addr, num_ctas):  # noqa: E741
        """The workspace as tensors, from the pointer call path's addresses: (partial, arrival, num_ctas)."""
        partial = cute.make_tensor(global_ptr(cutlass.Float32, partial_addr),
                                   cute.make_layout(ts.workspace_elems(num_ctas)))
        arrival = cute.make_tensor(global_ptr(cutlass.Int32, arrival_addr, 4),
                                   cute.make_layout(ts.num_output_tiles(m, l)))
        return partial, arrival, num_ctas

    @cute.jit
    def __call__(
        self,
        mA: cute.Tensor,
        mB: cute.Tensor,
        mSFA: cute.Tensor,
        mSFB: cute.Tensor,
        mC: cute.Tensor,
        mPartial: cute.Tensor,
        mArrival: cute.Tensor,
        num_ctas: cutlass.Int32,
        stream=None,
    ):
        """Launch on `stream` (None: the default stream)."""
        launch(*self.build(mA, mB, mSFA, mSFB, mC, mPartial, mArrival, num_ctas), stream=stream)

    @staticmethod
    def sfb_layout(b_shape):
        """The layout of b's permuted scales for b of shape (rows, K, L): the buffer always holds 128 rows
        (docs/contract.md), whatever b's row count, so its batch stride is that of one 128-row block."""
        _, k, l = b_shape  # noqa: E741
        return sf_cute.sf_layout_permuted_mkl(TILE_M, k, l)

    @cute.jit
    def build(self, mA, mB, mSFA, mSFB, mC, mPartial, mArrival, num_ctas):
        """Trace-time TMA atoms, shared storage and grid shared by every launch path: (kernel call, keywords)."""
        stages = self.config.stages
        (tiled_mma, tiled_mma_sfb, a_smem, b_smem, sfa_smem, sfb_smem, tma_atom_a, tma_a, tma_atom_b, tma_b,
         tma_atom_sfa, tma_sfa, tma_atom_sfb, tma_sfb) = self.data_path(mA, mB, mSFA, mSFB)
        a_smem_1 = cute.slice_(a_smem, (None, None, None, 0))
        b_smem_1 = cute.slice_(b_smem, (None, None, None, 0))
        sfa_smem_1 = cute.slice_(sfa_smem, (None, None, None, 0))
        sfb_smem_1 = cute.slice_(sfb_smem, (None, None, None, 0))
        self.tx_bytes = (
            cute.size_in_bytes(cutlass.Float4E2M1FN, a_smem_1)
            + cute.size_in_bytes(cutlass.Float4E2M1FN, b_smem_1)
            + cute.size_in_bytes(cutlass.Float8E4M3FN, sfa_smem_1)
            + cute.size_in_bytes(cutlass.Float8E4M3FN, sfb_smem_1)
        )

        @cute.struct
        class SharedStorage:
            ab_mbar: cute.struct.MemRange[cutlass.Int64, stages * 2]
            acc_mbar: cute.struct.MemRange[cutlass.Int64, self.config.acc_stages * 2]
            tmem_base: cutlass.Int32
            arrival: cutlass.Int32
            sA: cute.struct.Align[cute.struct.MemRange[cutlass.Float4E2M1FN, cute.cosize(a_smem.outer)], 1024]
            sB: cute.struct.Align[cute.struct.MemRange[cutlass.Float4E2M1FN, cute.cosize(b_smem.outer)], 1024]
            sSFA: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN, cute.cosize(sfa_smem)], 128]
            sSFB: cute.struct.Align[cute.struct.MemRange[cutlass.Float8E4M3FN, cute.cosize(sfb_smem)], 128]

        self.shared_storage = SharedStorage

        launcher = self.kernel(
            tiled_mma, tiled_mma_sfb,
            tma_atom_a, tma_a, tma_atom_b, tma_b, tma_atom_sfa, tma_sfa, tma_atom_sfb, tma_sfb,
            mC, mPartial, mArrival,
            a_smem, b_smem, sfa_smem, sfb_smem,
            num_ctas,
        )
        shape = dict(grid=(num_ctas, 1, 1), block=(self.threads, 1, 1), cluster=(1, 1, 1),
                     smem=SharedStorage.size_in_bytes())
        return launcher, shape

    @cute.jit
    def data_path(self, mA, mB, mSFA, mSFB):
        """The data path's trace-time objects, shared by `build` and the host emulator (cute_kernels.tc_emulator):
        the tiled MMAs, the shared-memory layouts (all stages) and the four TMA atoms with their global views."""
        tiled_mma, tiled_mma_sfb = self._make_tiled_mmas()
        cluster_vmnk = cute.tiled_divide(cute.make_layout((1, 1, 1)), (tiled_mma.thr_id.shape,))

        # Scale views: the permuted buffers as (((32,4),rest_mn),((16,4),rest_k),(1,L)) over (row, K element, batch).
        sfa_mkl = cute.make_tensor(mSFA.iterator, sf_cute.sf_layout_permuted_mkl(*mA.shape))
        sfb_nkl = cute.make_tensor(mSFB.iterator, self.sfb_layout(mB.shape))

        a_smem, b_smem, sfa_smem, sfb_smem = self.smem_layouts(tiled_mma)
        a_smem_1 = cute.slice_(a_smem, (None, None, None, 0))
        b_smem_1 = cute.slice_(b_smem, (None, None, None, 0))
        sfa_smem_1 = cute.slice_(sfa_smem, (None, None, None, 0))
        sfb_smem_1 = cute.slice_(sfb_smem, (None, None, None, 0))

        g2s = cpasync.CopyBulkTensorTileG2SOp(tcgen05.CtaGroup.ONE)
        tma_atom_a, tma_a = cute.nvgpu.make_tiled_tma_atom_A(
            g2s, mA, a_smem_1, self.mma_tiler, tiled_mma, cluster_vmnk.shape
        )
        tma_atom_b, tma_b = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, mB, b_smem_1, self.mma_tiler, tiled_mma, cluster_vmnk.shape
        )
        tma_atom_sfa, tma_sfa = cute.nvgpu.make_tiled_tma_atom_A(
            g2s, sfa_mkl, sfa_smem_1, self.mma_tiler, tiled_mma, cluster_vmnk.shape,
            internal_type=cutlass.Int16,
        )
        tma_atom_sfb, tma_sfb = cute.nvgpu.make_tiled_tma_atom_B(
            g2s, sfb_nkl, sfb_smem_1, self.mma_tiler_sfb, tiled_mma_sfb, cluster_vmnk.shape,
            internal_type=cutlass.Int16,
        )
        return (tiled_mma, tiled_mma_sfb, a_smem, b_smem, sfa_smem, sfb_smem, tma_atom_a, tma_a, tma_atom_b, tma_b,
                tma_atom_sfa, tma_sfa, tma_atom_sfb, tma_sfb)

    def smem_layouts(self, tiled_mma):
        """The shared-memory layouts of A, b, SFA and SFB, all `stages` stages."""
        stages = self.config.stages
        a_smem = sm100_utils.make_smem_layout_a(tiled_mma, self.mma_tiler, cutlass.Float4E2M1FN, stages)
        b_smem = sm100_utils.make_smem_layout_b(tiled_mma, self.mma_tiler, cutlass.Float4E2M1FN, stages)
        sfa_smem = blockscaled_utils.make_smem_layout_sfa(tiled_mma, self.mma_tiler, SF_VEC, stages)
        sfb_smem = blockscaled_utils.make_smem_layout_sfb(tiled_mma, self.mma_tiler, SF_VEC, stages)
        return a_smem, b_smem, sfa_smem, sfb_smem

    def accumulator_layout(self, tiled_mma):
        """The TMEM accumulators' layout, (MMA, MMA_M, MMA_N, ACC_STAGE), relative to the allocation's base."""
        acc_shape = tiled_mma.partition_shape_C(self.mma_tiler[:2])
        return tiled_mma.make_fragment_C(cute.append(acc_shape, self.config.acc_stages)).layout

    def tmem_scales(self, tiled_mma, acc_ptr, sfa_smem, sfb_smem):
        """The scales' TMEM tensors (MMA, MMA_MN, MMA_K), SFA from column `sf_tmem_col` of the allocation at
        `acc_ptr`, SFB right after it; the MMAs of K block kb read [(None, None, kb)]."""
        # Scales live past the accumulators, from column sf_tmem_col (32-column aligned).
        acc_cols = self.config.sf_tmem_col
        tCtSFA_layout = blockscaled_utils.make_tmem_layout_sfa(
            tiled_mma, self.mma_tiler, SF_VEC, cute.slice_(sfa_smem, (None, None, None, 0))
        )
        tCtSFA = cute.make_tensor(cute.recast_ptr(acc_ptr + acc_cols, dtype=cutlass.Float8E4M3FN), tCtSFA_layout)
        sfa_cols = tcgen05.find_tmem_tensor_col_offset(tCtSFA)
        tCtSFB_layout = blockscaled_utils.make_tmem_layout_sfb(
            tiled_mma, self.mma_tiler, SF_VEC, cute.slice_(sfb_smem, (None, None, None, 0))
        )
        tCtSFB = cute.make_tensor(
            cute.recast_ptr(acc_ptr + acc_cols + sfa_cols, dtype=cutlass.Float8E4M3FN), tCtSFB_layout
        )
        return tCtSFA, tCtSFB

    def epilogue_copy(self, tAcc, tidx):
        """tcgen05.ld (32x32b: one TMEM lane, all N columns, a thread) of the (128, N, STAGE) accumulators `tAcc`:
        (tiled copy, thread tidx's source (T2R, T2R_M, T2R_N, STAGE), its registers' (row, column) coordinates)."""
        t2r = tcgen05.make_tmem_copy(
            cute.make_copy_atom(
                tcgen05.Ld32x32bOp(tcgen05.Repetition(self.config.mma_n), tcgen05.Pack.NONE), cutlass.Float32
            ),
            tAcc[(None, None, 0)],
        )
        thr_t2r = t2r.get_slice(tidx)
        return t2r, thr_t2r.partition_S(tAcc), thr_t2r.partition_D(cute.make_identity_tensor(self.mma_tiler[:2]))

    @staticmethod
    def column0(tTR_cAcc):
        """(register index, tile row) of the thread's one column-0 value, chosen by coordinate at trace time."""
        col0 = [i for i in range(cute.size(tTR_cAcc)) if tTR_cAcc[i][1] == 0]
        assert len(col0) == 1, "each thread must hold exactly one column-0 element"
        return col0[0], tTR_cAcc[col0[0]][0]

    @cute.kernel
    def kernel(
        self,
        tiled_mma: cute.TiledMma,
        tiled_mma_sfb: cute.TiledMma,
        tma_atom_a: cute.CopyAtom,
        mA_mkl: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        mB_nkl: cute.Tensor,
        tma_atom_sfa: cute.CopyAtom,
        mSFA_mkl: cute.Tensor,
        tma_atom_sfb: cute.CopyAtom,
        mSFB_nkl: cute.Tensor,
        mC_mnl: cute.Tensor,
        mPartial: cute.Tensor,
        mArrival: cute.Tensor,
        a_smem: cute.ComposedLayout,
        b_smem: cute.ComposedLayout,
        sfa_smem: cute.Layout,
        sfb_smem: cute.Layout,
        num_ctas: cutlass.Int32,
    ):
        cfg = self.config
        warp_idx = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        tidx, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()

        if warp_idx == self.tma_warp:
            cpasync.prefetch_descriptor(tma_atom_a)
            cpasync.prefetch_descriptor(tma_atom_b)
            cpasync.prefetch_descriptor(tma_atom_sfa)
            cpasync.prefetch_descriptor(tma_atom_sfb)

        smem = SmemAllocator()
        storage = smem.allocate(self.shared_storage)

        ab_pipe = pipeline.PipelineTmaUmma.create(
            barrier_storage=storage.ab_mbar.data_ptr(),
            num_stages=cfg.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 1),
            tx_count=self.tx_bytes,
        )
        acc_pipe = pipeline.PipelineUmmaAsync.create(
            barrier_storage=storage.acc_mbar.data_ptr(),
            num_stages=cfg.acc_stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, 32 * self.epi_warps),
        )
        tmem = tmem_allocator()(
            member_ptr(storage.tmem_base),
            barrier_for_retrieve=pipeline.NamedBarrier(barrier_id=1, num_threads=32 * (self.epi_warps + 1)),
            allocator_warp_id=0,
        )
        epi_barrier = pipeline.NamedBarrier(barrier_id=2, num_threads=32 * self.epi_warps)

        sA = storage.sA.get_tensor(a_smem.outer, swizzle=a_smem.inner)
        sB = storage.sB.get_tensor(b_smem.outer, swizzle=b_smem.inner)
        sSFA = storage.sSFA.get_tensor(sfa_smem)
        sSFB = storage.sSFB.get_tensor(sfb_smem)

        (tAsA, tAgA), (tBsB, tBgB), (tAsSFA, tAgSFA), (tBsSFB, tBgSFB) = self.tma_partitions(
            tiled_mma, tiled_mma_sfb, tma_atom_a, mA_mkl, tma_atom_b, mB_nkl, tma_atom_sfa, mSFA_mkl,
            tma_atom_sfb, mSFB_nkl, sA, sB, sSFA, sSFB,
        )

        tCrA = tiled_mma.make_fragment_A(sA)  # (MMA, MMA_M, MMA_K, STAGE)
        tCrB = tiled_mma.make_fragment_B(sB)  # (MMA, MMA_N, MMA_K, STAGE)
        acc_layout = self.accumulator_layout(tiled_mma)

        # Schedule, in Int64 so cta * total_work cannot overflow.
        m = mC_mnl.shape[0]
        k = mA_mkl.shape[1]
        l = mC_mnl.shape[2]
        m_tiles = cutlass.Int64(ts.num_m_tiles(m))
        k_tiles = cutlass.Int64(ts.num_k_tiles(k, cfg.tile_k))
        total = m_tiles * cutlass.Int64(l) * k_tiles
        g = cutlass.Int64(cta)
        # CTAs past the work count get empty runs and count nowhere, so any num_ctas >= 1 is correct.
        G = ts.effective_ctas(cutlass.Int64(num_ctas), total, cutlass.min)
        w_begin, w_end = ts.cta_run(g, cutlass.Int64(num_ctas), total, cutlass.min)

        if warp_idx == self.tma_warp:
            ab_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, cfg.stages)
            w = w_begin
            while w < w_end:
                tile, k0, k1, w_next = ts.next_segment(w, w_end, k_tiles, cutlass.min)
                m_tile, l_idx = ts.output_tile_coord(tile, m_tiles)
                mt = cutlass.Int32(m_tile)
                li = cutlass.Int32(l_idx)
                tAgA_t = tAgA[(None, mt, None, li)]
                tBgB_t = tBgB[(None, 0, None, li)]
                tAgSFA_t = tAgSFA[(None, mt, None, li)]
                tBgSFB_t = tBgSFB[(None, 0, None, li)]
                for kt in cutlass.range(cutlass.Int32(k0), cutlass.Int32(k1), 1, unroll=1):
                    ab_pipe.producer_acquire(ab_state)
                    bar = ab_pipe.producer_get_barrier(ab_state)
                    cute.copy(tma_atom_a, tAgA_t[(None, kt)], tAsA[(None, ab_state.index)], tma_bar_ptr=bar)
                    cute.copy(tma_atom_b, tBgB_t[(None, kt)], tBsB[(None, ab_state.index)], tma_bar_ptr=bar)
                    cute.copy(tma_atom_sfa, tAgSFA_t[(None, kt)], tAsSFA[(None, ab_state.index)], tma_bar_ptr=bar)
                    cute.copy(tma_atom_sfb, tBgSFB_t[(None, kt)], tBsSFB[(None, ab_state.index)], tma_bar_ptr=bar)
                    ab_state.advance()
                w = w_next
            ab_pipe.producer_tail(ab_state)

        if warp_idx == self.mma_warp:
            tmem.wait_for_alloc()
            tcgen05_fence_after_thread_sync()  # the allocation, ordered after the barrier that announced it
            acc_ptr = tmem.retrieve_ptr(cutlass.Float32)
            tCtAcc_base = cute.make_tensor(acc_ptr, acc_layout)
            tCtSFA, tCtSFB = self.tmem_scales(tiled_mma, acc_ptr, sfa_smem, sfb_smem)
            s2t_sfa, tCsSFA_s2t, tCtSFA_s2t = self._s2t_partition(sSFA, tCtSFA)
            s2t_sfb, tCsSFB_s2t, tCtSFB_s2t = self._s2t_partition(sSFB, tCtSFB)

            ab_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
            acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, cfg.acc_stages)
            w = w_begin
            while w < w_end:
                tile, k0, k1, w_next = ts.next_segment(w, w_end, k_tiles, cutlass.min)
                acc_pipe.producer_acquire(acc_state)
                tcgen05_fence_after_thread_sync()  # the epilogue's reads of this accumulator precede our MMAs
                tCtAcc = tCtAcc_base[(None, None, None, acc_state.index)]
                tiled_mma.set(tcgen05.Field.ACCUMULATE, False)
                for kt in cutlass.range(cutlass.Int32(k0), cutlass.Int32(k1), 1, unroll=1):
                    ab_pipe.consumer_wait(ab_state)
                    s = ab_state.index
                    cute.copy(s2t_sfa, tCsSFA_s2t[(None, None, None, None, s)], tCtSFA_s2t)
                    cute.copy(s2t_sfb, tCsSFB_s2t[(None, None, None, None, s)], tCtSFB_s2t)
                    for kb in cutlass.range_constexpr(self.num_kblocks):
                        blockscaled_gemm(
                            tiled_mma,
                            tCtAcc,
                            tCrA[(None, None, kb, s)],
                            tCtSFA[(None, None, kb)],
                            tCrB[(None, None, kb, s)],
                            tCtSFB[(None, None, kb)],
                        )
                        tiled_mma.set(tcgen05.Field.ACCUMULATE, True)
                    ab_pipe.consumer_release(ab_state)
                    ab_state.advance()
                acc_pipe.producer_commit(acc_state)
                acc_state.advance()
                w = w_next
            acc_pipe.producer_tail(acc_state)

        if warp_idx < self.epi_warps:
            tmem.allocate(cfg.tmem_columns())
            tcgen05_fence_before_thread_sync()
            tmem.wait_for_alloc()
            tcgen05_fence_after_thread_sync()
            acc_ptr = tmem.retrieve_ptr(cutlass.Float32)
            tCtAcc_base = cute.make_tensor(acc_ptr, acc_layout)
            # (128, N, STAGE) accumulator view; one TMEM lane (= output row) per thread
            tAcc = tCtAcc_base[((None, None), 0, 0, None)]
            t2r, tTR_tAcc, tTR_cAcc = self.epilogue_copy(tAcc, tidx)  # tTR_tAcc: (T2R, T2R_M, T2R_N, STAGE)
            tTR_rAcc = cute.make_rmem_tensor(tTR_cAcc.shape, cutlass.Float32)
            sArrival = cute.make_tensor(member_ptr(storage.arrival), cute.make_layout(1))

            acc_state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.acc_stages)
            w = w_begin
            while w < w_end:
                tile, k0, k1, w_next = ts.next_segment(w, w_end, k_tiles, cutlass.min)
                m_tile, l_idx = ts.output_tile_coord(tile, m_tiles)

                acc_pipe.consumer_wait(acc_state)
                cute.copy(t2r, tTR_tAcc[(None, None, None, acc_state.index)], tTR_rAcc)
                cute.arch.fence_view_async_tmem_load()
                tcgen05_fence_before_thread_sync()  # the loads, ordered before the arrive that frees the buffer
                acc_pipe.consumer_release(acc_state)
                acc_state.advance()

                # Column 0 of the accumulator is the GEMV; pick it by coordinate, not by position.
                # The 32x32b copy gives each thread one row and all N columns; the column of each
                # register is static, so the choice is made at trace time.
                reg, row = self.column0(tTR_cAcc)
                acc = tTR_rAcc[reg]
                row_g = cutlass.Int32(m_tile) * TILE_M + row
                li = cutlass.Int32(l_idx)

                first = ts.tile_first_cta(tile, k_tiles, G, total)
                last = ts.tile_last_cta(tile, k_tiles, G, total)
                if first == last:
                    if row_g < m:
                        mC_mnl[row_g, 0, li] = acc.to(cutlass.Float16)
                else:
                    self.store_split_tile(
                        acc, row, row_g, li, m, tile, g, G, first, last, k_tiles, total, tidx,
                        mC_mnl, mPartial, mArrival, sArrival, epi_barrier,
                    )
                w = w_next

            tmem.relinquish_alloc_permit()
            tcgen05_fence_before_thread_sync()
            epi_barrier.arrive_and_wait()
            tcgen05_fence_after_thread_sync()
            tmem.free(acc_ptr)

    @cute.jit
    def tma_partitions(self, tiled_mma, tiled_mma_sfb, tma_atom_a, mA_mkl, tma_atom_b, mB_nkl, tma_atom_sfa,
                       mSFA_mkl, tma_atom_sfb, mSFB_nkl, sA, sB, sSFA, sSFB):
        """(shared, global) TMA partitions of A, b, SFA and SFB: ((atom_v, rest_v), STAGE) and ((atom_v, rest_v),
        RestMN, RestK, RestL), the CTA tiles cut by the MMA tiler. Shared by the kernel and the host emulator."""
        gA = cute.local_tile(mA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gB = cute.local_tile(mB_nkl, cute.slice_(self.mma_tiler, (0, None, None)), (None, None, None))
        gSFA = cute.local_tile(mSFA_mkl, cute.slice_(self.mma_tiler, (None, 0, None)), (None, None, None))
        gSFB = cute.local_tile(mSFB_nkl, cute.slice_(self.mma_tiler_sfb, (0, None, None)), (None, None, None))
        thr_mma = tiled_mma.get_slice(0)
        thr_mma_sfb = tiled_mma_sfb.get_slice(0)
        one_cta = cute.make_layout(1)
        a = cpasync.tma_partition(
            tma_atom_a, 0, one_cta, cute.group_modes(sA, 0, 3), cute.group_modes(thr_mma.partition_A(gA), 0, 3)
        )
        b = cpasync.tma_partition(
            tma_atom_b, 0, one_cta, cute.group_modes(sB, 0, 3), cute.group_modes(thr_mma.partition_B(gB), 0, 3)
        )
        tAsSFA, tAgSFA = cpasync.tma_partition(
            tma_atom_sfa, 0, one_cta, cute.group_modes(sSFA, 0, 3),
            cute.group_modes(thr_mma.partition_A(gSFA), 0, 3),
        )
        tBsSFB, tBgSFB = cpasync.tma_partition(
            tma_atom_sfb, 0, one_cta, cute.group_modes(sSFB, 0, 3),
            cute.group_modes(thr_mma_sfb.partition_B(gSFB), 0, 3),
        )
        sfa = (cute.filter_zeros(tAsSFA), cute.filter_zeros(tAgSFA))
        sfb = (cute.filter_zeros(tBsSFB), cute.filter_zeros(tBgSFB))
        return a, b, sfa, sfb

    @cute.jit
    def store_split_tile(self, acc, row, row_g, li, m, tile, g, G, first, last, k_tiles, total, tidx,
                         mC_mnl, mPartial, mArrival, sArrival, epi_barrier):
        """The epilogue of a tile split over CTAs first..last: leave this CTA's fp32 partial of `row` in the
        workspace, count its arrival on the tile's counter, and if it is the last to arrive, sum every partial of
        the tile in CTA order (a fixed order: bit-stable), store the fp16 row and return the counter to zero."""
        slot = ts.partial_slot(g, tile, k_tiles, G, total, cutlass.min)
        mPartial[cutlass.Int32(ts.partial_offset(g, slot, cutlass.Int64(row)))] = acc
        # Release: each writer fences, then one thread bumps the tile's counter.
        cute.arch.fence_acq_rel_gpu()
        epi_barrier.arrive_and_wait()
        if tidx == 0:
            old = atomic_add_acq_rel_gpu((mArrival.iterator + cutlass.Int32(tile)).llvm_ptr, cutlass.Int32(1))
            sArrival[0] = old
        epi_barrier.arrive_and_wait()
        # The next write of sArrival comes after the next segment's first barrier, which every thread reaches only
        # after this read.
        arrived = sArrival[0]
        if cutlass.Int64(arrived) == last - first:
            # Last to arrive: sum every partial of this tile in CTA order (a fixed order).
            cute.arch.fence_acq_rel_gpu()
            total_acc = cutlass.Float32(0.0)
            # Independent loads (unrolled, so several are in flight), added in CTA order: bit-stable.
            for c in cutlass.range(cutlass.Int32(first), cutlass.Int32(last) + 1, 1, unroll=4):
                c64 = cutlass.Int64(c)
                c_slot = ts.partial_slot(c64, tile, k_tiles, G, total, cutlass.min)
                idx = cutlass.Int32(ts.partial_offset(c64, c_slot, cutlass.Int64(row)))
                total_acc = total_acc + load_relaxed_gpu_f32((mPartial.iterator + idx).llvm_ptr)
            if row_g < m:
                mC_mnl[row_g, 0, li] = total_acc.to(cutlass.Float16)
            if tidx == 0:
                mArrival[cutlass.Int32(tile)] = cutlass.Int32(0)

    @staticmethod
    def _s2t_partition(sSF: cute.Tensor, tSF: cute.Tensor):
        """tcgen05.cp (32x128b, 4 warps' lanes) from the staged shared scales to their TMEM copy."""
        tCsSF = cute.filter_zeros(sSF)  # (MMA, MMA_MN, MMA_K, STAGE)
        tCtSF = cute.filter_zeros(tSF)  # (MMA, MMA_MN, MMA_K)
        atom = cute.make_copy_atom(tcgen05.Cp4x32x128bOp(tcgen05.CtaGroup.ONE), cutlass.Float8E4M3FN)
        tiled = tcgen05.make_s2t_copy(atom, tCtSF)
        thr = tiled.get_slice(0)
        src = tcgen05.get_s2t_smem_desc_tensor(tiled, thr.partition_S(tCsSF))
        return tiled, src, thr.partition_D(tCtSF)


def fake_arguments(m, k, l, rows_b=128, rest_m=None, rest_k=None, num_ctas=SM100_NUM_SMS):
    """Fake tensors (a, b, sfa, sfb, c, partial, arrival) with docs/contract.md's shapes and strides.

    fp4 tensors are in fp4 elements (K wide; torch's float4_e2m1fn_x2 view is K/2 bytes wide). Sizes may be
    ints or `cute.sym_int`s; rest_m, rest_k default to ceil(m/128), ceil(k/64) for int sizes.
    """
    f4, f8 = cutlass.Float4E2M1FN, cutlass.Float8E4M3FN
    rest_m = ts.ceil_div(m, TILE_M) if rest_m is None else rest_m
    rest_k = ts.ceil_div(k, MMA_K) if rest_k is None else rest_k
    sf_order = (2, 1, 4, 0, 3, 5)  # memory order [L][rest_mn][rest_k][32][4][4]
    rt = cute.runtime
    return (
        rt.make_fake_compact_tensor(f4, (m, k, l), stride_order=(1, 0, 2), assumed_align=32),
        rt.make_fake_compact_tensor(f4, (rows_b, k, l), stride_order=(1, 0, 2), assumed_align=32),
        rt.make_fake_compact_tensor(f8, (32, 4, rest_m, 4, rest_k, l), stride_order=sf_order, assumed_align=32),
        rt.make_fake_compact_tensor(f8, (32, 4, 1, 4, rest_k, l), stride_order=sf_order, assumed_align=32),
        rt.make_fake_tensor(cutlass.Float16, (m, 1, l), stride=(1, 1, m), assumed_align=2),
        rt.make_fake_compact_tensor(cutlass.Float32, (ts.workspace_elems(num_ctas),), assumed_align=16)
        if isinstance(m, int)
        else rt.make_fake_compact_tensor(cutlass.Float32, (cute.sym_int(),), assumed_align=16),
        rt.make_fake_compact_tensor(
            cutlass.Int32, (ts.num_output_tiles(m, l) if isinstance(m, int) else cute.sym_int(),), assumed_align=4
        ),
    )
