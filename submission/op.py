"""The GEMV as a torch custom op, `nvfp4_gemv::gemv`, for torch.compile and CUDA graphs; eager calls skip it.

`torch.ops.nvfp4_gemv.gemv(a, b, sfa_permuted, sfb_permuted, c)` fills c (M, 1, L) fp16 in place and returns
nothing (`mutates_args=("c",)`): the contest's in-place contract, no allocation per call, and under torch.compile
functionalization turns it into `auto_functionalized`, which Inductor re-inplaces, so a CUDA-graphed region
writes straight into c. (An op returning a new tensor would allocate c every call; one returning c itself is not
allowed, since custom-op outputs may not alias inputs.) The fake implementation checks shapes, dtypes and strides
against CONTRACT.md from metadata alone, so a bad input fails while tracing with the same ValueError as at run time.
The CUDA implementation launches the kernel that `submission.kernel` selects; the CPU one runs the reference.

`nvfp4_gemv(a, b, sfa_permuted, sfb_permuted, c) -> c` is the entry to use: while torch.compile traces it calls the
op; in eager mode it calls the compiled kernel directly (one dict lookup and one launch, no dispatcher).
"""

from __future__ import annotations

import torch

from submission.validate import B_ROWS, NAMES, PTR_ALIGN, expected_layouts, validate_problem

OP_NAME = "nvfp4_gemv::gemv"
OPERANDS = ("a", "b", "sfa_permuted", "sfb_permuted", "c")
_CONTEST_INDEX = tuple(NAMES.index(n) for n in OPERANDS)  # where each operand sits in the contest tuple
_DTYPES = (torch.float4_e2m1fn_x2, torch.float4_e2m1fn_x2, torch.float8_e4m3fn, torch.float8_e4m3fn, torch.float16)


def validate_operands(a, b, sfa_permuted, sfb_permuted, c, *, require_cuda=False, check_pointers=True):
    """Check the op's five tensors against CONTRACT.md; return (M, K, L) or raise ValueError naming the tensor.

    Reads metadata only. check_pointers=False skips the 16-byte alignment check (fake tensors have no data).
    """
    tensors = (a, b, sfa_permuted, sfb_permuted, c)
    for name, t, dtype in zip(OPERANDS, tensors, _DTYPES):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise ValueError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if a.dim() != 3:
        raise ValueError(f"a: expected 3 dimensions (M, K/2, L), got shape {tuple(a.shape)}")
    m, kb, l = a.shape  # noqa: E741
    try:
        m, k, l = validate_problem(m, 2 * kb, l)  # noqa: E741
    except ValueError as e:
        raise ValueError(f"a: shape {tuple(a.shape)} gives {e}") from None
    layouts = expected_layouts(m, k, l)
    for name, t, idx in zip(OPERANDS, tensors, _CONTEST_INDEX):
        shape, stride = layouts[idx]
        if tuple(t.shape) != shape:
            raise ValueError(
                f"{name}: expected shape {shape} for M, K, L = {m}, {k}, {l} (from a), got {tuple(t.shape)}"
            )
        if any(n != 1 and s != g for n, s, g in zip(shape, stride, t.stride())):
            raise ValueError(f"{name}: expected strides {stride}, got {t.stride()}")
        if t.device != a.device:
            raise ValueError(f"{name}: expected device {a.device} (the device of a), got {t.device}")
    if require_cuda and a.device.type != "cuda":
        raise ValueError(f"a: expected a CUDA device, got {a.device}")
    if check_pointers and a.device.type != "meta":
        for name, t in zip(OPERANDS, tensors):
            if t.data_ptr() % PTR_ALIGN:
                raise ValueError(f"{name}: expected a {PTR_ALIGN}-byte aligned data pointer, got {t.data_ptr():#x}")
    return m, k, l


# ---------------------------------------------------------------- eager path: one dict lookup, one launch

_LAUNCHERS: dict[tuple, object] = {}


def _signature(a, b, sfa_p, sfb_p, c) -> tuple:
    return (a.shape, a.stride(), a.dtype, a.device, b.stride(), b.dtype, sfa_p.shape, sfa_p.stride(), sfa_p.dtype,
            sfb_p.stride(), sfb_p.dtype, c.stride(), c.dtype)  # fmt: skip


def _op_call(a, b, sfa_p, sfb_p, c):
    torch.ops.nvfp4_gemv.gemv.default(a, b, sfa_p, sfb_p, c)


def _launcher(a, b, sfa_p, sfb_p, c):
    """The callable for this signature: validates once, then the compiled kernel (CUDA) or the op (other devices)."""
    m, k, l = validate_operands(a, b, sfa_p, sfb_p, c)  # noqa: E741
    if a.device.type != "cuda":
        return _op_call
    from submission.kernel import select_kernel

    return select_kernel(torch.cuda.get_device_capability(a.device), m, k, l)


def gemv_eager(a, b, sfa_permuted, sfb_permuted, c):
    """Fill and return c without the dispatcher: the launch of the kernel compiled for this signature."""
    key = _signature(a, b, sfa_permuted, sfb_permuted, c)
    fn = _LAUNCHERS.get(key)
    if fn is None:
        fn = _LAUNCHERS[key] = _launcher(a, b, sfa_permuted, sfb_permuted, c)
    if (
        a.data_ptr() | b.data_ptr() | sfa_permuted.data_ptr() | sfb_permuted.data_ptr() | c.data_ptr()
    ) % PTR_ALIGN or not (b.device == sfa_permuted.device == sfb_permuted.device == c.device):
        validate_operands(a, b, sfa_permuted, sfb_permuted, c)  # raises, naming the tensor
    fn(a, b, sfa_permuted, sfb_permuted, c)
    return c


# ---------------------------------------------------------------- the custom op


@torch.library.custom_op(OP_NAME, mutates_args=("c",), device_types="cuda")
def gemv(
    a: torch.Tensor, b: torch.Tensor, sfa_permuted: torch.Tensor, sfb_permuted: torch.Tensor, c: torch.Tensor
) -> None:
    """c[:, 0, l] = fp16(A[:, :, l] · b[0, :, l]) with NVFP4 block scales (CONTRACT.md operands), written in place."""
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
