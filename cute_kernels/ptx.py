"""Inline PTX from CuTe DSL code: one helper for every `asm` statement the kernels use."""

from cutlass import Uint32
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
