"""L2 cache policies for loads of data that is read exactly once.

The contest's L2 flush (a 4 GiB `torch.randn`) leaves the 50 MB L2 full of dirty lines. A kernel whose loads
allocate normally evicts them, and their write-back competes with its reads. Marked evict-first, the kernel's own
lines are the ones replaced, and most of the dirty lines stay put until after it. It pays on the TMA kernel's
copies under contest timing and loses on `gemv_simt`'s loads (BENCHMARKS.md, "Tried, measured, and the verdict").
"""

from cutlass import Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels.ptx import inline_ptx


@dsl_user_op
def evict_first_policy(*, loc=None, ip=None) -> Int64:
    """An L2 cache policy (`createpolicy`) marking every line it covers evict-first, for data read once."""
    return Int64(
        inline_ptx(T.i64(), [], "createpolicy.fractional.L2::evict_first.b64 $0, 1.0;", "=l", loc=loc, ip=ip)
    )


@dsl_user_op
def load_v4_with_policy(addr, policy, *, loc=None, ip=None):
    """Four 32-bit words at the 16-byte aligned global address `addr`, in one
    `ld.global.L1::no_allocate.L2::cache_hint.v4.u32` under the L2 cache policy `policy` (from `createpolicy`)."""
    res = inline_ptx(
        llvm.StructType.get_literal([T.i32()] * 4),
        [Int64(addr).ir_value(loc=loc, ip=ip), Int64(policy).ir_value(loc=loc, ip=ip)],
        "ld.global.L1::no_allocate.L2::cache_hint.v4.u32 {$0, $1, $2, $3}, [$4], $5;",
        "=r,=r,=r,=r,l,l",
        loc=loc,
        ip=ip,
    )
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]
