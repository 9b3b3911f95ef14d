"""Input checks of the fp4 W4A16 linear, from tensor metadata alone: each failure is a ValueError naming the tensor.

`validate_linear` checks x, weight, weight_scale, global_scale and bias against the formats (formats.py): dtypes,
shapes (K from weight, K % 64 == 0, scale shapes per format and layout), row-contiguous weight and scales (no copy
of a weight is ever made), 16-byte aligned weight and scale pointers on CUDA (the kernels issue 16-byte loads), one
device.
It never reads tensor data, so it costs no device sync. The one value check, a NaN or infinite tensor scale, needs
the data: `check_global_scale_value` runs where the scale becomes known (module construction, the loaders) rather
than per call, because reading a CUDA scalar synchronizes; a python float scale is checked here, per call.
"""

from __future__ import annotations

import math
import numbers

import torch

from layouts.closed_form import rest_mk
from layouts.constants import ATOM_ROWS, ATOM_SF_COLS
from nvfp4_gemv.linear.formats import ACTIVATION_DTYPES, K_ALIGN, WEIGHT_DTYPES, Fp4Format, format_of

PTR_ALIGN = 16  # bytes


def _tensor(name: str, t, dtypes, why: str = "") -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = dtypes[0] if len(dtypes) == 1 else " or ".join(str(d) for d in dtypes)
        raise ValueError(f"{name}: expected dtype {want}{why}, got {t.dtype}")
    return t


def _rows(name: str, t: torch.Tensor, why: str = "; fp4 weights and scales are read in place, never copied") -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected contiguous rows (row-major strides), got shape {tuple(t.shape)} with "
                         f"strides {t.stride()}{why}")


def _device(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name}: expected device {device} (the device of weight), got {t.device}")


def _aligned(name: str, t: torch.Tensor, check_pointers: bool | None) -> None:
    if check_pointers is None:
        check_pointers = t.device.type == "cuda"
    if check_pointers and t.device.type != "meta" and t.data_ptr() % PTR_ALIGN:
        raise ValueError(f"{name}: expected a {PTR_ALIGN}-byte aligned data pointer, got address {t.data_ptr():#x} "
                         f"(storage offset {t.storage_offset()})")


def scale_shape(fmt: Fp4Format, scale_layout: str, n: int, k: int) -> tuple[int, int]:
    """The shape of weight_scale for an (N, K) weight: (N, K/block) plain, or the 128x4-atom padded 2-D buffer
    (ceil(N/128)*128, ceil(K/64)*4) swizzled."""
    if scale_layout == "swizzled":
        rest_n, rest_k = rest_mk(n, k)
        return rest_n * ATOM_ROWS, rest_k * ATOM_SF_COLS
    return n, k // fmt.block


def check_global_scale(fmt: Fp4Format, global_scale, device: torch.device | None = None) -> None:
    """global_scale is None, a finite python float, or a 1-element fp32 tensor on `device`; and None for mxfp4."""
    if global_scale is None:
        return
    if not fmt.has_global:
        raise ValueError(f"global_scale: {fmt.name} has no tensor scale; expected None, got "
                         f"{type(global_scale).__name__}")
    if isinstance(global_scale, numbers.Real) and not isinstance(global_scale, bool):
        try:
            finite = math.isfinite(float(global_scale))
        except OverflowError:  # an int or Fraction past fp64's range
            finite = False
        if not finite:
            raise ValueError(f"global_scale: expected a finite value, got {global_scale!r}")
        return
    if not isinstance(global_scale, torch.Tensor):
        raise ValueError(f"global_scale: expected None, a float or a torch.Tensor, got {type(global_scale).__name__}")
    _tensor("global_scale", global_scale, (torch.float32,))
    if global_scale.numel() != 1:
        raise ValueError(f"global_scale: expected 1 element, got shape {tuple(global_scale.shape)}")
    if device is not None:
        _device("global_scale", global_scale, device)


def check_global_scale_value(global_scale, name: str = "global_scale") -> None:
    """A NaN or infinite tensor scale raises ValueError naming `name`. Reads the value: a device sync for a CUDA
    tensor; a meta tensor has none and passes (its module is checked again where its scale is loaded)."""
    if isinstance(global_scale, torch.Tensor) and global_scale.device.type != "meta":
        value = float(global_scale.detach().reshape(()).float().cpu())
        if not math.isfinite(value):
            raise ValueError(f"{name}: expected a finite value, got {value!r}")


def validate_weight(weight, weight_scale, fmt, scale_layout="plain", global_scale=None, *,
                    check_pointers: bool | None = None) -> tuple[int, int, Fp4Format]:
    """Check a quantized weight (weight, weight_scale, global_scale) in format `fmt`; return (N, K, format)."""
    f = format_of(fmt)
    if scale_layout not in f.scale_layouts:
        raise ValueError(f"scale_layout: expected one of {f.scale_layouts} for {f.name}, got {scale_layout!r}")
    _tensor("weight", weight, WEIGHT_DTYPES)
    if weight.dim() != 2:
        raise ValueError(f"weight: expected 2 dimensions (N, K/2), got shape {tuple(weight.shape)}")
    n, k = weight.shape[0], 2 * weight.shape[1]
    if n < 1 or k < 1 or k % K_ALIGN:
        raise ValueError(f"weight: expected shape (N, K/2) with N >= 1 and K a positive multiple of {K_ALIGN}, "
                         f"got {tuple(weight.shape)} (K = {k})")
    _rows("weight", weight)
    _tensor("weight_scale", weight_scale, f.scale_dtypes)
    want = scale_shape(f, scale_layout, n, k)
    if tuple(weight_scale.shape) != want:
        raise ValueError(f"weight_scale: expected shape {want} ({f.name}, {scale_layout}) for N, K = {n}, {k} "
                         f"(from weight), got {tuple(weight_scale.shape)}")
    _rows("weight_scale", weight_scale)
    device = weight.device
    _device("weight_scale", weight_scale, device)
    check_global_scale(f, global_scale, device)
    _aligned("weight", weight, check_pointers)
    _aligned("weight_scale", weight_scale, check_pointers)
    return n, k, f


def validate_linear(x, weight, weight_scale, fmt, scale_layout="plain", global_scale=None, bias=None, *,
                    check_pointers: bool | None = None) -> tuple[int, int, int]:
    """Check the operands of y = x · dequant(weight)ᵀ (+ bias); return (M, N, K), M the rows of x flattened.

    x: (..., K) bf16/fp16 on weight's device, any strides (activations may be copied). bias: None or (N,) in x's
    dtype, contiguous. check_pointers: whether to check the 16-byte alignment of weight and weight_scale; None
    (the default) checks CUDA tensors only, as the kernels need it and the CPU reference does not (safetensors'
    default mmap loader hands out CPU tensors at any offset); False for fake tensors, which have no data.
    """
    n, k, _ = validate_weight(weight, weight_scale, fmt, scale_layout, global_scale, check_pointers=check_pointers)
    _tensor("x", x, ACTIVATION_DTYPES)
    if x.dim() < 1 or x.shape[-1] != k:
        raise ValueError(f"x: expected shape (..., K) with K = {k} (from weight), got {tuple(x.shape)}")
    _device("x", x, weight.device)
    if bias is not None:
        _tensor("bias", bias, (x.dtype,), " (x's dtype)")
        if tuple(bias.shape) != (n,):
            raise ValueError(f"bias: expected shape ({n},) (N, from weight), got {tuple(bias.shape)}")
        _rows("bias", bias, "; pass bias.contiguous()")
        _device("bias", bias, weight.device)
    m = x.numel() // k
    return m, n, k
