"""Inline PTX from CuTe DSL code: one helper for every `asm` statement the kernels use."""

from cutlass._mlir.dialects import llvm


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
