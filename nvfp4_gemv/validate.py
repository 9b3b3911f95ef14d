"""Input validation shared by every GEMV kernel: the contest 7-tuple and the shape rules.

`validate_inputs` checks (a, b, sfa, sfb, sfa_permuted, sfb_permuted, c) against docs/contract.md: dtypes, shapes,
strides, one device, 16-byte aligned base pointers (the kernels issue 16-byte vector loads), K % 64 == 0 and no
empty dimension. M, K, L come from `a`; every other tensor must agree with them. Each failure raises ValueError
naming the tensor, what was expected and what it got. It reads only tensor metadata, never data. A dimension of
extent 1 has no stride that addresses memory, so its stride is not checked.
"""

from __future__ import annotations

import operator

import torch

from layouts.constants import ATOM_K, SF_VEC
from layouts.convert import permuted_shape_stride

NAMES = ("a", "b", "sfa", "sfb", "sfa_permuted", "sfb_permuted", "c")
B_ROWS = 128  # b and sfb are padded to 128 rows for cuBLAS; only row 0 is read
PTR_ALIGN = 16  # bytes

_FP4 = torch.float4_e2m1fn_x2
_FP8 = torch.float8_e4m3fn
_DTYPES = (_FP4, _FP4, _FP8, _FP8, _FP8, _FP8, torch.float16)


def _problem_error(m: int, k: int, l: int) -> str | None:  # noqa: E741
    """The first shape rule that (m, k, l) breaks, as a message, or None."""
    for name, v in (("M", m), ("K", k), ("L", l)):
        if v <= 0:
            return f"{name} must be >= 1, got {name} = {v} (M, K, L = {m}, {k}, {l})"
    if k % ATOM_K:
        return f"K must be a multiple of {ATOM_K}, got K = {k}"
    return None


def validate_problem(m: int, k: int, l: int) -> tuple[int, int, int]:  # noqa: E741
    """Check the shape rules alone (M, K, L >= 1, K % 64 == 0); return (M, K, L) or raise ValueError."""
    try:
        m, k, l = operator.index(m), operator.index(k), operator.index(l)  # noqa: E741
    except TypeError as e:
        raise ValueError(f"M, K, L must be integers, got {m!r}, {k!r}, {l!r}") from e
    err = _problem_error(m, k, l)
    if err is not None:
        raise ValueError(err)
    return m, k, l


def expected_layouts(m: int, k: int, l: int) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:  # noqa: E741
    """The contest's (shape, stride) of each of the 7 tensors, in NAMES order, in elements."""
    kb, kc = k // 2, k // SF_VEC
    return (
        ((m, kb, l), (kb, 1, m * kb)),
        ((B_ROWS, kb, l), (kb, 1, B_ROWS * kb)),
        ((m, kc, l), (kc, 1, m * kc)),
        ((B_ROWS, kc, l), (kc, 1, B_ROWS * kc)),
        permuted_shape_stride(m, kc, l),
        permuted_shape_stride(B_ROWS, kc, l),
        ((m, 1, l), (1, 1, m)),
    )


def validate_inputs(data, *, require_cuda: bool = False) -> tuple[int, int, int]:
    """Check the contest tuple (a, b, sfa, sfb, sfa_permuted, sfb_permuted, c); return (M, K, L).

    Raises ValueError naming the offending tensor. With require_cuda=True the tensors must be on a CUDA device.
    """
    if not isinstance(data, (tuple, list)) or len(data) != len(NAMES):
        got = f"{type(data).__name__} of length {len(data)}" if isinstance(data, (tuple, list)) else type(data).__name__
        raise ValueError(f"data: expected a tuple of 7 tensors {NAMES}, got {got}")
    return _validate(NAMES, data, require_cuda=require_cuda, check_pointers=True)


OPERANDS = ("a", "b", "sfa_permuted", "sfb_permuted", "c")  # what the kernels read, in their argument order


def validate_operands(a, b, sfa_permuted, sfb_permuted, c, *, require_cuda: bool = False,
                      check_pointers: bool = True) -> tuple[int, int, int]:
    """The same checks on the five tensors the kernels read (the torch op's arguments); return (M, K, L).

    check_pointers=False skips the alignment check (fake tensors have no data)."""
    return _validate(OPERANDS, (a, b, sfa_permuted, sfb_permuted, c), require_cuda=require_cuda,
                     check_pointers=check_pointers)


def _validate(names, tensors, *, require_cuda: bool, check_pointers: bool) -> tuple[int, int, int]:
    """Check `tensors`, named by a subset of NAMES that starts with "a", against docs/contract.md."""
    index = [NAMES.index(n) for n in names]
    for name, t, i in zip(names, tensors, index):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dtype != _DTYPES[i]:
            raise ValueError(f"{name}: expected dtype {_DTYPES[i]}, got {t.dtype}")
    a = tensors[0]
    if a.dim() != 3:
        raise ValueError(f"a: expected 3 dimensions (M, K/2, L), got shape {tuple(a.shape)}")
    m, kb, l = a.shape  # noqa: E741
    err = _problem_error(m, 2 * kb, l)
    if err is not None:
        raise ValueError(f"a: shape {tuple(a.shape)} gives {err}")
    k = 2 * kb

    device = a.device
    layouts = expected_layouts(m, k, l)
    for name, t, i in zip(names, tensors, index):
        shape, stride = layouts[i]
        if t.shape != shape:
            raise ValueError(
                f"{name}: expected shape {shape} for M, K, L = {m}, {k}, {l} (from a), got {tuple(t.shape)}"
            )
        got = t.stride()
        if got != stride and any(n != 1 and s != g for n, s, g in zip(shape, stride, got)):
            raise ValueError(f"{name}: expected strides {stride}, got {got}")
        if t.device != device:
            raise ValueError(f"{name}: expected device {device} (the device of a), got {t.device}")
    if require_cuda and device.type != "cuda":
        raise ValueError(f"a: expected a CUDA device (for all {len(names)} tensors), got {device}")
    if check_pointers and device.type != "meta":
        for name, t in zip(names, tensors):
            if t.data_ptr() % PTR_ALIGN:
                raise ValueError(
                    f"{name}: expected a {PTR_ALIGN}-byte aligned data pointer, got address {t.data_ptr():#x} "
                    f"(storage offset {t.storage_offset()})"
                )
    return m, k, l
