"""NVFP4 batched GEMV on CUDA cores, fed through shared memory by TMA: the warp-specialized alternative to
`gemv_simt` on sm_90 (H200). It is correct and tested, but slower than `gemv_simt`, so dispatch does not pick it.

c[m, l] = Σ_k A[m,k,l]·sfa[m,k/16,l]·b[k,l]·sfb[k/16,l], all L in one launch, reading the contest's permuted
`(32,4,rest_m,4,rest_k,L)` scales through `layouts.sf_unit_slices`. The math per 32-element piece is
`decode.accumulate_piece`, shared with `gemv_simt`.

Design. One producer warp per CTA issues TMA copies into a `stages`-deep ring of mbarrier-tracked shared buffers,
so the bytes in flight cost shared memory instead of registers; four consumer warps decode. Work unit: 32 rows of a
128-row slab, rows 8u + rr + 32q (rr < 8, q < 4) for quarter u, whose scales of one 64-element group are one
128-byte run of the permuted buffer. A stage of C = 1024·pieces K elements is seven copies from one thread:

    sA[rr, word, q, s]   four boxes of 8 rows × C/2 bytes (rows past M are zero-filled by TMA)
    sSFA[byte, atom, s]  one box: C/64 atoms × the unit's 128-byte slice
    sSFB[byte, atom, s]  one box: C/64 atoms × 16 bytes of b's scales (row 0's four come first)
    sB[word, s]          one box: C/2 bytes of b

Consumer warp w owns rows rr = 2w, 2w + 1 (all four q); lane j owns piece 32i + j of the chunk: one 128-bit shared
read per row (the lanes read 512 contiguous bytes) and one 128-bit read of four rows' scales per rr. Each thread sums
its pieces in K order and the lanes are added by a fixed butterfly, so runs are bit-identical.

Measured slower than `gemv_simt` on the benchmark shapes, so dispatch does not pick it; with `decode=False` it moves
the same bytes without the math, which measures this data path alone (BENCHMARKS.md: the results table and "Tried,
measured, and the verdict", which also lists the configs tried without gain). It keeps an L2 evict-first policy on
A's copies (`cute_kernels.l2_policy`), which made its contest-timed calls faster.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Float16, Float32, Int32, Int64, Uint8, Uint32, const_expr
from cutlass.cute.nvgpu import cpasync
from cutlass.cutlass_dsl import dsl_user_op

from cute_kernels import decode
from cute_kernels.ptx import inline_ptx
from cute_kernels.l2_policy import evict_first_policy
from cute_kernels.compile import GemvLaunch, SmemAllocator, gemv_fake_tensors
from layouts.constants import ATOM_K
from layouts.sf_cute import sf_unit_slices

UNIT_RR = 8  # rr values per work unit; a unit is UNIT_RR × 4 rows
UNIT_ROWS = 4 * UNIT_RR
CHUNK_K = 1024  # K elements per stage and piece per lane: 32 lanes × one 32-element piece
PIECE_K = 32
SFA_SLICE = UNIT_RR * 16  # bytes of one atom that hold a unit's scales (layouts.sf_unit_slices)
SFB_SLICE = 16  # bytes copied from each atom of b's scales (TMA's smallest box row); row 0's are the first 4
CONSUMER_WARPS = 4  # warp w decodes rows rr = 2w, 2w + 1 of the unit; warp 4 is the producer


@dsl_user_op
def wait_parity(mbar_smem, parity, *, loc=None, ip=None) -> None:
    """Spin until the phase of the mbarrier at shared address `mbar_smem` with this parity has completed
    (`mbarrier.try_wait.parity` without a suspend-time hint, as CUTLASS's C++ barriers wait)."""
    inline_ptx(
        None,
        [Int32(mbar_smem).ir_value(loc=loc, ip=ip), Int32(parity).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .pred p;\n\tLAB_SPIN:\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1;\n\t"
        "@!p bra LAB_SPIN;\n\t}",
        "r,r,~{memory}",
        side_effects=True,
        loc=loc,
        ip=ip,
    )


def unit_coords(unit, units_per_batch):
    """Work unit -> (batch, 128-row block, quarter); units run quarter-fastest, then blocks, then batches."""
    return unit // units_per_batch, (unit % units_per_batch) // 4, unit % units_per_batch % 4


@dataclass(frozen=True)
class GemvTmaConfig:
    """The cache key of one compiled kernel."""

    pieces: int = 1  # 32-element pieces per lane and row in a stage; a stage holds 1024·pieces K elements
    stages: int = 4  # depth of the shared-memory ring (77 KB of shared memory at 4 stages of 1 piece)
    ctas: int = 264  # persistent grid of this many CTAs (H200: 132 SMs × 2); 0: one CTA per unit
    evict_first: bool = True  # read A and its scales with an L2 evict-first policy
    decode: bool = True  # False: move every byte but skip the math (c gets zeros): the data path's own rate

    def __post_init__(self):
        if self.pieces not in (1, 2):
            raise ValueError(f"pieces must be 1 or 2, got {self.pieces}")
        if not 2 <= self.stages <= 8:
            raise ValueError(f"stages must be in 2..8, got {self.stages}")
        if self.ctas < 0:
            raise ValueError(f"ctas must be >= 0, got {self.ctas}")

    @property
    def chunk_k(self) -> int:
        return CHUNK_K * self.pieces


class GemvTma(GemvLaunch):
    def __init__(self, config: GemvTmaConfig, target):
        self.cfg = config
        self.arch = target.family  # decode path, as in gemv_simt

    @staticmethod
    def can_implement(m: int, k: int, l: int) -> bool:
        """M, L >= 1; K a positive multiple of 64; the scale buffer's offsets fit in an int32:
        ceil(M/128)·128 · K/16 · L < 2³¹ (A up to 8 GiB)."""
        return m >= 1 and l >= 1 and k >= 64 and k % 64 == 0 and -(-m // 128) * 128 * (k // 16) * l < 2**31

    @staticmethod
    def fake_operands(config: GemvTmaConfig):
        return gemv_fake_tensors("permuted")

    @cute.jit
    def build(self, mA, mB, mSFA, mSFB, mC):
        """TMA atoms, views and grid shared by every launch path: (kernel call, launch keywords)."""
        cfg = self.cfg
        m, k, l = mA.shape
        cw = cfg.chunk_k // 8  # 32-bit words of one row per stage
        atoms = cfg.chunk_k // ATOM_K
        g2s = cpasync.CopyBulkTensorTileG2SOp()
        # A and b as 32-bit words (8 codes each), with the tensors' own strides (fp4 elements, multiples of 32).
        a_words = cute.make_tensor(
            cute.recast_ptr(mA.iterator, dtype=Uint32),
            cute.make_layout((m, k // 8, l), stride=(mA.stride[0] // 8, 1, mA.stride[2] // 8)),
        )
        b_words = cute.make_tensor(
            cute.recast_ptr(mB.iterator, dtype=Uint32), cute.make_layout((k // 8, l), stride=(1, mB.stride[2] // 8))
        )
        tma_atom_a, tma_a = cpasync.make_tiled_tma_atom(
            g2s, a_words, cute.make_layout((UNIT_RR, cw), stride=(cw, 1)), (UNIT_RR, cw)
        )
        tma_atom_b, tma_b = cpasync.make_tiled_tma_atom(g2s, b_words, cute.make_layout((cw, 1)), (cw, 1))
        # The scales through the layouts/ algebra: each unit's 128-byte slice of each atom, and b's first 16 bytes.
        sfa_units = cute.make_tensor(cute.recast_ptr(mSFA.iterator, dtype=Uint8), sf_unit_slices(m, k, l))
        sfb_units = cute.make_tensor(cute.recast_ptr(mSFB.iterator, dtype=Uint8), sf_unit_slices(128, k, l))
        tma_atom_sfa, tma_sfa = cpasync.make_tiled_tma_atom(
            g2s, sfa_units, cute.make_layout((SFA_SLICE, atoms), stride=(1, SFA_SLICE)), (SFA_SLICE, atoms)
        )
        tma_atom_sfb, tma_sfb = cpasync.make_tiled_tma_atom(
            g2s, sfb_units, cute.make_layout((SFB_SLICE, atoms), stride=(1, SFB_SLICE)), (SFB_SLICE, atoms)
        )
        c_ml = cute.make_tensor(mC.iterator, cute.make_layout((m, l), stride=(1, mC.stride[2])))
        # Units of one batch: 4 per full slab; in the last slab only the quarters with a row < M.
        n_slabs = (m + 127) // 128
        last = m - 128 * (n_slabs - 1)
        units_per_batch = 4 * (n_slabs - 1) + cutlass.min((last + UNIT_RR - 1) // UNIT_RR, 4)
        n_units = units_per_batch * l
        grid = n_units if const_expr(cfg.ctas == 0) else cutlass.min(n_units, cfg.ctas)
        shape = dict(grid=[grid, 1, 1], block=[32 * (CONSUMER_WARPS + 1), 1, 1])
        kernel = self.kernel(
            tma_atom_a, tma_a, tma_atom_b, tma_b, tma_atom_sfa, tma_sfa, tma_atom_sfb, tma_sfb,
            c_ml, m, k, units_per_batch, n_units,
        )
        return kernel, shape

    @cute.kernel
    def kernel(
        self,
        tma_atom_a: cute.CopyAtom,
        tma_a: cute.Tensor,
        tma_atom_b: cute.CopyAtom,
        tma_b: cute.Tensor,
        tma_atom_sfa: cute.CopyAtom,
        tma_sfa: cute.Tensor,
        tma_atom_sfb: cute.CopyAtom,
        tma_sfb: cute.Tensor,
        c_ml: cute.Tensor,
        m: Int32,
        k: Int32,
        units_per_batch: Int32,
        n_units: Int32,
    ):
        cfg = self.cfg
        n_stages = cfg.stages
        cw = cfg.chunk_k // 8
        atoms = cfg.chunk_k // ATOM_K
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        n_ctas, _, _ = cute.arch.grid_dim()
        lane = tidx % 32
        warp = tidx // 32

        smem = SmemAllocator()
        # sA[rr, word, q, stage]: row (q, rr) of the unit; one TMA box per q.
        sA = smem.allocate_tensor(
            Uint32, cute.make_layout((UNIT_RR, cw, 4, n_stages), stride=(cw, 1, UNIT_RR * cw, UNIT_ROWS * cw)), 128
        )
        sB = smem.allocate_tensor(Uint32, cute.make_layout((cw, 1, n_stages)), 128)
        sSFA = smem.allocate_tensor(Uint8, cute.make_layout((SFA_SLICE, atoms, n_stages)), 128)
        sSFB = smem.allocate_tensor(Uint8, cute.make_layout((SFB_SLICE, atoms, n_stages)), 128)
        mbar = smem.allocate_array(Int64, 2 * n_stages, byte_alignment=8)  # full[s], then empty[s]
        lut_slots = smem.allocate_tensor(Uint32, cute.make_layout((2, 32)), 16)

        if tidx == 0:
            for s in cutlass.range_constexpr(n_stages):
                cute.arch.mbarrier_init(mbar + s, 1)  # the producer's arrive, plus the stage's bytes
                cute.arch.mbarrier_init(mbar + n_stages + s, CONSUMER_WARPS)  # one arrive per consumer warp
        cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

        n_chunks = (k + cfg.chunk_k - 1) // cfg.chunk_k
        if warp == CONSUMER_WARPS:
            # Producer: seven TMA copies a stage (A as four 8-row boxes, b, and the two scale slices), issued by
            # one thread. Boxes past M or K are zero-filled and still count their full bytes.
            one_cta = cute.make_layout(1)
            # (box, row tiles of 8, K chunks, L) and friends
            tAsA, tAgA = cpasync.tma_partition(
                tma_atom_a, 0, one_cta, cute.group_modes(sA, 0, 2),
                cute.group_modes(cute.local_tile(tma_a, (UNIT_RR, cw), (None, None, None)), 0, 2),
            )
            tBsB, tBgB = cpasync.tma_partition(
                tma_atom_b, 0, one_cta, cute.group_modes(sB, 0, 2),
                cute.group_modes(cute.local_tile(tma_b, (cw, 1), (None, None)), 0, 2),
            )
            tSsSFA, tSgSFA = cpasync.tma_partition(
                tma_atom_sfa, 0, one_cta, cute.group_modes(sSFA, 0, 2),
                cute.group_modes(cute.local_tile(tma_sfa, (SFA_SLICE, atoms), (None, None, None, None, None)), 0, 2),
            )
            tSsSFB, tSgSFB = cpasync.tma_partition(
                tma_atom_sfb, 0, one_cta, cute.group_modes(sSFB, 0, 2),
                cute.group_modes(cute.local_tile(tma_sfb, (SFB_SLICE, atoms), (None, None, None, None, None)), 0, 2),
            )
            tx_bytes = 4 * (UNIT_ROWS + 1) * cw + atoms * (SFA_SLICE + SFB_SLICE)
            policy = evict_first_policy() if const_expr(cfg.evict_first) else None
            it = Int32(0)
            for unit in cutlass.range(bidx, n_units, n_ctas):
                bl, slab, quarter = unit_coords(unit, units_per_batch)
                for kc in cutlass.range(n_chunks):
                    s = it % n_stages
                    wait_parity((mbar + n_stages + s).toint(), ((it // n_stages) % 2) ^ 1)
                    full = mbar + s
                    if lane == 0:
                        cute.arch.mbarrier_arrive_and_expect_tx(full, tx_bytes)
                    for q in cutlass.range_constexpr(4):
                        # rows slab·128 + 32q + 8·quarter + (0..7): row tile 16·slab + 4q + quarter
                        cute.copy(
                            tma_atom_a, tAgA[(None, 16 * slab + 4 * q + quarter, kc, bl)], tAsA[(None, q, s)],
                            tma_bar_ptr=full, cache_policy=policy,
                        )
                    cute.copy(tma_atom_b, tBgB[(None, kc, bl)], tBsB[(None, s)], tma_bar_ptr=full)
                    cute.copy(
                        tma_atom_sfa, tSgSFA[(None, 0, kc, quarter, slab, bl)], tSsSFA[(None, s)],
                        tma_bar_ptr=full, cache_policy=policy,
                    )
                    cute.copy(tma_atom_sfb, tSgSFB[(None, 0, kc, 0, 0, bl)], tSsSFB[(None, s)], tma_bar_ptr=full)
                    it = it + 1
        else:
            # Consumers.
            luts = decode.lut_registers(self.arch, lut_slots[None, lane])
            pair = warp  # rows rr = 2·pair + i of the unit, all four q
            acc = cute.make_rmem_tensor(cute.make_layout((2, 4)), Float32)
            rA = cute.make_rmem_tensor(cute.make_layout((4, 4, 2)), Uint32)
            rS = cute.make_rmem_tensor(cute.make_layout((4, 2)), Uint32)
            rB = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
            sSFA32 = cute.recast_tensor(sSFA, Uint32)  # (q word of rr, atom, stage): SFA_SLICE // 4 words
            sSFB32 = cute.recast_tensor(sSFB, Uint32)
            it = Int32(0)
            for unit in cutlass.range(bidx, n_units, n_ctas):
                bl, slab, quarter = unit_coords(unit, units_per_batch)
                acc.fill(0.0)
                for kc in cutlass.range(n_chunks):
                    s = it % n_stages
                    wait_parity((mbar + s).toint(), (it // n_stages) % 2)
                    if const_expr(cfg.decode):
                        n_pieces = (k - kc * cfg.chunk_k) // PIECE_K
                        for j in cutlass.range_constexpr(cfg.pieces):
                            piece = j * 32 + lane
                            if piece < n_pieces:
                                cute.autovec_copy(cute.local_tile(sB[None, 0, s], (4,), (piece,)), rB)
                                for i in cutlass.range_constexpr(2):
                                    rr = 2 * pair + i
                                    cute.autovec_copy(
                                        cute.local_tile(sSFA32[None, piece // 2, s], (4,), (rr,)), rS[None, i]
                                    )
                                    for q in cutlass.range_constexpr(4):
                                        cute.autovec_copy(
                                            cute.local_tile(sA[rr, None, q, s], (4,), (piece,)), rA[None, q, i]
                                        )
                                scale_words = [[rS[q, i] for q in range(4)] for i in range(2)]
                                decode.accumulate_piece(
                                    self.arch, rA, scale_words, rB, sSFB32[0, piece // 2, s], acc, piece % 2, luts
                                )
                    cute.arch.sync_warp()
                    if lane == 0:
                        cute.arch.mbarrier_arrive(mbar + n_stages + s)
                    it = it + 1
                self.store_unit(acc, c_ml, lane, pair, slab, quarter, bl, m)

    @cute.jit
    def store_unit(self, acc, c_ml, lane, pair, slab, quarter, bl, m):
        """Sum the unit's rows over the lanes (a fixed butterfly) and write them as fp16."""
        for i in cutlass.range_constexpr(2):
            for q in cutlass.range_constexpr(4):
                v = acc[i, q]
                for sh in cutlass.range_constexpr(5):
                    v = v + cute.arch.shuffle_sync_bfly(v, offset=1 << sh)
                row = slab * 128 + q * 32 + quarter * UNIT_RR + 2 * pair + i
                if lane == 0 and row < m:
                    c_ml[row, bl] = v.to(Float16)
