"""The GEMV as a torch custom op, `nvfp4_gemv::gemv`, for torch.compile and CUDA graphs; eager calls skip it.

`torch.ops.nvfp4_gemv.gemv(a, b, sfa_permuted, sfb_permuted, c)` fills c (M, 1, L) fp16 in place and returns
nothing (`mutates_args=("c",)`): the contest's in-place contract, no allocation per call, and under torch.compile
functionalization turns it into `auto_functionalized`, which Inductor re-inplaces, so a CUDA-graphed region
writes straight into c. (An op returning a new tensor would allocate c every call; one returning c itself is not
allowed, since custom-op outputs may not alias inputs.) The fake implementation checks shapes, dtypes and strides
against docs/contract.md from metadata alone, so a bad input fails while tracing with the same ValueError as at run time.
The CUDA implementation launches the kernel that `nvfp4_gemv.kernel` selects; the CPU one runs the reference.

`nvfp4_gemv(a, b, sfa_permuted, sfb_permuted, c) -> c` is the entry to use: while torch.compile traces it calls the
op; in eager mode it calls the compiled kernel directly (one dict lookup and one launch, no dispatcher).

Bad input (docs/contract.md): eagerly, a ValueError naming the tensor and what was expected, non-tensor arguments
included. Under torch.compile the same check runs in the fake implementation while Dynamo traces, and Dynamo
reports it as `torch._dynamo.exc.TorchRuntimeError` (a RuntimeError) whose message holds the ValueError's
("... got ValueError('c: expected dtype torch.float16, got torch.float32')"); tests/test_op.py pins this.
"""

from __future__ import annotations

import torch

from nvfp4_gemv.validate import B_ROWS, OPERANDS, validate_operands

OP_NAME = "nvfp4_gemv::gemv"
__all__ = ["OPERANDS", "OP_NAME", "gemv", "gemv_eager", "nvfp4_gemv", "validate_operands"]


# ---------------------------------------------------------------- eager path: the library's dispatcher


def gemv_eager(a, b, sfa_permuted, sfb_permuted, c):
    """Fill and return c without the dispatcher: CUDA tensors go straight to nvfp4_gemv.kernel's dispatcher (one
    dict lookup and one launch); other devices go through the op (the CPU implementation runs the reference)."""
    if not isinstance(a, torch.Tensor) or a.device.type != "cuda":
        try:
            torch.ops.nvfp4_gemv.gemv.default(a, b, sfa_permuted, sfb_permuted, c)
        except (TypeError, RuntimeError):
            validate_operands(a, b, sfa_permuted, sfb_permuted, c)  # a ValueError naming a non-tensor argument
            raise
        return c
    from nvfp4_gemv.kernel import DISPATCH

    return DISPATCH.run(
        a, b, sfa_permuted, sfb_permuted, c, "permuted",
        lambda: validate_operands(a, b, sfa_permuted, sfb_permuted, c, require_cuda=True),
    )  # fmt: skip


# ---------------------------------------------------------------- the custom op


@torch.library.custom_op(OP_NAME, mutates_args=("c",), device_types="cuda")
def gemv(
    a: torch.Tensor, b: torch.Tensor, sfa_permuted: torch.Tensor, sfb_permuted: torch.Tensor, c: torch.Tensor
) -> None:
    """c[:, 0, l] = fp16(A[:, :, l] · b[0, :, l]) with NVFP4 block scales (docs/contract.md operands), written in place."""
    gemv_eager(a, b, sfa_permuted, sfb_permuted, c)


@gemv.register_fake
def _gemv_fake(a, b, sfa_permuted, sfb_permuted, c) -> None:
    validate_operands(a, b, sfa_permuted, sfb_permuted, c, check_pointers=False)


@gemv.register_kernel("cpu")
def _gemv_cpu(a, b, sfa_permuted, sfb_permuted, c) -> None:
    from layouts.convert import permuted_to_plain
    from submission.reference import ref_kernel

    m, k, l = validate_operands(a, b, sfa_permuted, sfb_permuted, c)  # noqa: E741
    sfa = permuted_to_plain(sfa_permuted, m, k)
    sfb = permuted_to_plain(sfb_permuted, B_ROWS, k)
    ref_kernel((a, b, sfa, sfb, sfa_permuted, sfb_permuted, c))


def nvfp4_gemv(a, b, sfa_permuted, sfb_permuted, c):
    """Fill c (M, 1, L) fp16 with the NVFP4 GEMV and return it: the custom op under torch.compile, else eager."""
    if torch.compiler.is_compiling():
        torch.ops.nvfp4_gemv.gemv(a, b, sfa_permuted, sfb_permuted, c)
        return c
    return gemv_eager(a, b, sfa_permuted, sfb_permuted, c)
