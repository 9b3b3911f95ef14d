"""Inline PTX from CuTe DSL code: one helper for every `asm` statement the kernels use."""

from cutlass import Float32, Int32, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def inline_ptx(result_type, operands, asm: str, constraints: str, side_effects: bool = False, loc=None, ip=None):
    """`llvm.inline_asm` with AT&T dialect: `operands` are IR values, `result_type` an LLVM type or None."""
    return llvm.inline_asm(
        result_type,
        operands,
        asm,
        constraints,
        has_side_effects=side_effects,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


def asm_u32(args, asm: str, constraints: str, loc=None, ip=None) -> Uint32:
    """One 32-bit result from `asm` on 32-bit operands (each converted to Uint32)."""
    operands = [Uint32(a).ir_value(loc=loc, ip=ip) for a in args]
    return Uint32(inline_ptx(T.i32(), operands, asm, constraints, loc=loc, ip=ip))


@dsl_user_op
def tcgen05_fence_before_thread_sync(*, loc=None, ip=None) -> None:
    """`tcgen05.fence::before_thread_sync`: orders this thread's earlier tcgen05 operations (alloc, ld, mma) before
    the thread synchronization that follows (a barrier or an mbarrier arrive). Every DSL release lacks a stable
    wrapper for it, so it is inline PTX."""
    inline_ptx(None, [], "tcgen05.fence::before_thread_sync;", "~{memory}", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def tcgen05_fence_after_thread_sync(*, loc=None, ip=None) -> None:
    """`tcgen05.fence::after_thread_sync`: orders the tcgen05 operations that follow after the thread
    synchronization just passed."""
    inline_ptx(None, [], "tcgen05.fence::after_thread_sync;", "~{memory}", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def cluster_sync(*, loc=None, ip=None) -> None:
    """`barrier.cluster.arrive` (release) then `barrier.cluster.wait` (acquire): every thread of the cluster."""
    inline_ptx(None, [], "barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;",
               "~{memory}", side_effects=True, loc=loc, ip=ip)


@dsl_user_op
def ld_shared_cluster_f32(smem_addr, rank, *, loc=None, ip=None) -> Float32:
    """The fp32 at this CTA's shared address `smem_addr` in the shared memory of cluster CTA `rank` (mapa, then
    ld.shared::cluster)."""
    v = inline_ptx(
        T.f32(), [Int32(smem_addr).ir_value(loc=loc, ip=ip), Int32(rank).ir_value(loc=loc, ip=ip)],
        "{\n\t.reg .b32 a;\n\tmapa.shared::cluster.u32 a, $1, $2;\n\tld.shared::cluster.f32 $0, [a];\n\t}",
        "=f,r,r,~{memory}", side_effects=True, loc=loc, ip=ip,
    )
    return Float32(v)


@dsl_user_op
def ld_relaxed_gpu_b32(ptr, *, loc=None, ip=None) -> Int32:
    """`ld.relaxed.gpu.global.b32` at `ptr` (an LLVM global pointer): a 32-bit word as the L2 holds it now."""
    asm = "ld.relaxed.gpu.global.b32 $0, [$1];"
    return Int32(inline_ptx(T.i32(), [ptr], asm, "=r,l,~{memory}", side_effects=True, loc=loc, ip=ip))


@dsl_user_op
def st_relaxed_gpu_b32(ptr, value, *, loc=None, ip=None) -> None:
    """`st.relaxed.gpu.global.b32` of `value` (32 bits) at `ptr` (an LLVM global pointer)."""
    operands = [ptr, Int32(value).ir_value(loc=loc, ip=ip)]
    inline_ptx(None, operands, "st.relaxed.gpu.global.b32 [$0], $1;", "l,r,~{memory}", side_effects=True, loc=loc,
               ip=ip)
