"""L2 cache policies for loads of data that is read exactly once.

The contest's L2 flush (a 4 GiB `torch.randn`) leaves the 50 MB L2 full of dirty lines. A kernel whose loads
allocate normally evicts them, and their write-back competes with its reads. Marked evict-first, the kernel's own
lines are the ones replaced, and most of the dirty lines stay put until after it. It pays on the TMA kernel's
copies under contest timing and loses on `gemv_simt`'s loads (BENCHMARKS.md, "Tried, measured, and the verdict").
"""

from cutlass import Int64
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels.ptx import inline_ptx


@dsl_user_op
def evict_first_policy(*, loc=None, ip=None) -> Int64:
    """An L2 cache policy (`createpolicy`) marking every line it covers evict-first, for data read once."""
    return Int64(
        inline_ptx(T.i64(), [], "createpolicy.fractional.L2::evict_first.b64 $0, 1.0;", "=l", loc=loc, ip=ip)
    )
