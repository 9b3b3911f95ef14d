"""A pure streaming read: the time this GPU needs to read N bytes in one launch, with nothing else to do.

This is the roofline a GEMV can reach in practice, measured rather than assumed: the benchmark times it on a flat
buffer of exactly `shapes.bytes_moved(M, K, L)` bytes for each benchmark shape, under the same contest and graph
timing as the GEMV. It is the ideal access pattern for DRAM: a grid-stride loop in which all threads of the grid
together read one contiguous window with 128-bit loads, unrolled so that each thread has several loads in flight.

`StreamReadConfig(row_chunks=...)` reads the same bytes in the order a GEMV reads its matrix instead: one warp a row
of `row_chunks` 16-byte chunks, every row at once (one CTA of `threads // 32` rows each), each warp walking its row
in 512-byte pieces. It is a diagnostic, not a roofline: it tells how much the row-parallel order itself costs DRAM.

The loaded words are XOR-folded, and a thread stores its fold only if it equals a value no test buffer produces, so
the loads cannot be elided and nothing is written in practice.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32

from cute_kernels.compile import launch, load_atom

SENTINEL = 0x5EEDFACE  # a fold equal to this is stored to out[0]

# Cache qualifiers of the 128-bit loads (keyword arguments of the DSL's G2R copy atom). `L1::no_allocate` is the
# default, as for gemv_simt; `.nc` measured slower under contest timing (BENCHMARKS.md, "Load cache qualifiers").
_NA = cute.nvgpu.CacheEvictionPriority.NO_ALLOCATE
LOAD_QUALIFIERS = {
    "no_allocate": dict(l1c_evict_priority=_NA),  # ld.global.L1::no_allocate, as gemv_simt reads A
    "no_allocate_256b": dict(l1c_evict_priority=_NA, l2_prefetch_size=cute.nvgpu.L2PrefetchSize.SIZE_256B),
    "cs": dict(load_cache_mode=cute.nvgpu.LoadCacheMode.STREAMING),  # ld.global.cs: evict-first in L1 and L2
    "nc": dict(invariant=True),  # ld.global.nc
}


@dataclass(frozen=True)
class StreamReadConfig:
    """The cache key of one compiled kernel."""

    threads: int = 512  # threads per CTA
    ctas_per_sm: int = 4  # grid = ctas_per_sm × SMs (the launch takes the SM count)
    unroll: int = 8  # 16-byte loads in flight per thread
    load: str = "no_allocate"  # the load's cache qualifiers: a key of LOAD_QUALIFIERS
    row_chunks: int = 0  # 0: the grid-stride read; else a warp a row of this many 16-byte chunks (a multiple of 32)
    # Launched programmatically dependent on the stream's previous grid, as the W4A16 linear is: the CTAs start while
    # that grid drains, wait (griddepcontrol.wait) before their first load, and let the next grid launch once past
    # their loop. The read a kernel so launched is held to, when calls follow each other.
    pdl: bool = False

    def __post_init__(self):
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"threads must be a multiple of 32 in 32..1024, got {self.threads}")
        if self.load not in LOAD_QUALIFIERS:
            raise ValueError(f"load must be one of {tuple(LOAD_QUALIFIERS)}, got {self.load!r}")
        if self.ctas_per_sm < 1 or self.unroll < 1:
            raise ValueError(f"ctas_per_sm and unroll must be >= 1, got {self}")
        if self.row_chunks < 0 or self.row_chunks % 32:
            raise ValueError(f"row_chunks must be 0 or a positive multiple of 32, got {self.row_chunks}")


class StreamRead:
    def __init__(self, config: StreamReadConfig, target=None):
        self.cfg = config

    @staticmethod
    def can_implement(nbytes: int, row_chunks: int = 0) -> bool:
        """A positive multiple of 16 bytes whose 16-byte chunk count fits in an int32 (and, read in rows, a whole
        number of rows)."""
        return nbytes >= 16 and nbytes % 16 == 0 and nbytes // 16 < 2**31 and nbytes % (16 * max(row_chunks, 1)) == 0

    @staticmethod
    def fake_operands(config: StreamReadConfig):
        """(src uint32 tensor of N/4 words, out uint32 tensor, SM count), dynamic N."""
        from cutlass.cute.runtime import make_fake_tensor

        n = cute.sym_int(divisibility=4)
        src = make_fake_tensor(Uint32, (n,), stride=(1,), assumed_align=16)
        out = make_fake_tensor(Uint32, (1,), stride=(1,), assumed_align=4)
        return src, out, Int32(1)

    @cute.jit
    def __call__(self, mSrc: cute.Tensor, mOut: cute.Tensor, sms: Int32, stream=None):
        n16 = mSrc.shape[0] // 4
        chunks = cute.make_tensor(mSrc.iterator, cute.make_layout((4, n16), stride=(1, 4)))
        if cutlass.const_expr(self.cfg.row_chunks):
            rows_a_cta = self.cfg.threads // 32
            rows = n16 // self.cfg.row_chunks
            call = self.kernel_rows(chunks, mOut, rows)
            shape = dict(grid=[(rows + rows_a_cta - 1) // rows_a_cta, 1, 1], block=[self.cfg.threads, 1, 1])
        else:
            call = self.kernel(chunks, mOut, n16)
            shape = dict(grid=[sms * self.cfg.ctas_per_sm, 1, 1], block=[self.cfg.threads, 1, 1])
        if cutlass.const_expr(self.cfg.pdl):
            shape["use_pdl"] = True
        launch(call, shape, stream=stream)

    @cute.kernel
    def kernel(self, chunks: cute.Tensor, out: cute.Tensor, n16: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        n_ctas, _, _ = cute.arch.grid_dim()
        total = n_ctas * self.cfg.threads
        g = bidx * self.cfg.threads + tidx
        atom = load_atom(Uint32, 128, **LOAD_QUALIFIERS[self.cfg.load])
        fold = Uint32(0)
        n_full = n16 // total
        self.wait_for_the_grid_before()
        for i in cutlass.range(n_full, unroll=self.cfg.unroll):
            fold = self.fold_in(atom, chunks[None, g + i * total], fold)
        j = g + n_full * total
        if j < n16:
            fold = self.fold_in(atom, chunks[None, j], fold)
        self.let_the_next_grid_launch()
        if fold == Uint32(SENTINEL):
            out[0] = fold

    @cute.kernel
    def kernel_rows(self, chunks: cute.Tensor, out: cute.Tensor, rows: Int32):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        row = bidx * (self.cfg.threads // 32) + tidx // 32
        atom = load_atom(Uint32, 128, **LOAD_QUALIFIERS[self.cfg.load])
        fold = Uint32(0)
        self.wait_for_the_grid_before()
        if row < rows:
            first = row * self.cfg.row_chunks + tidx % 32
            for i in cutlass.range(self.cfg.row_chunks // 32, unroll=self.cfg.unroll):
                fold = self.fold_in(atom, chunks[None, first + i * 32], fold)
        self.let_the_next_grid_launch()
        if fold == Uint32(SENTINEL):
            out[0] = fold

    def wait_for_the_grid_before(self):
        """With `pdl`: the previous grid has finished and its stores are visible before the first load."""
        if cutlass.const_expr(self.cfg.pdl):
            cute.arch.griddepcontrol_wait()

    def let_the_next_grid_launch(self):
        """With `pdl`: the next grid may launch once every CTA is past its loop."""
        if cutlass.const_expr(self.cfg.pdl):
            cute.arch.griddepcontrol_launch_dependents()

    @staticmethod
    def fold_in(atom, chunk, fold):
        """Load one 16-byte chunk with `atom` and XOR its four words into `fold`."""
        r = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
        cute.copy(atom, chunk, r)
        return fold ^ r[0] ^ r[1] ^ r[2] ^ r[3]
