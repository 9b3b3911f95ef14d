"""Inline PTX from CuTe DSL code: one helper for every `asm` statement the kernels use."""

from cutlass import Int32, Int64, Uint32
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


@dsl_user_op
def bulk_copy_g2s(dst_smem, src_gmem, size, mbar_smem, policy=None, *, loc=None, ip=None) -> None:
    """`cp.async.bulk` of `size` bytes (a multiple of 16; both addresses 16-byte aligned) from global to shared
    memory, completing its bytes on the mbarrier at shared address `mbar_smem`; with an L2 cache `policy`
    (`createpolicy`), `.L2::cache_hint`."""
    operands = [Int32(dst_smem).ir_value(loc=loc, ip=ip), Int64(src_gmem).ir_value(loc=loc, ip=ip),
                Int32(size).ir_value(loc=loc, ip=ip), Int32(mbar_smem).ir_value(loc=loc, ip=ip)]
    op = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
    if policy is None:
        asm, constraints = f"{op} [$0], [$1], $2, [$3];", "r,l,r,r,~{memory}"
    else:
        operands.append(Int64(policy).ir_value(loc=loc, ip=ip))
        asm, constraints = f"{op}.L2::cache_hint [$0], [$1], $2, [$3], $4;", "r,l,r,r,l,~{memory}"
    inline_ptx(None, operands, asm, constraints, side_effects=True, loc=loc, ip=ip)
