"""`FP4Linear`: a drop-in for nn.Linear whose weight is fp4 (NVFP4 or MXFP4), computed by `fp4_linear`.

Buffers: `weight` (N, K/2) fp4 codes, `weight_scale`, `global_scale` (NVFP4 only, else None) and `bias`. The
weight buffers are the caller's tensors, views included, never copied; `module.half()` and `.to(dtype)` cast only
the bias (the format's buffers keep their dtypes and move devices bit for bit), and `load_state_dict` copies the
format's buffers bit for bit as well, after checking each key's dtype against the format. A tensor scale is checked
for NaN and infinity once, when the module is built or loads a state dict; one assigned later is not checked. A
module built on the meta device (to be filled by `to_empty` and `load_state_dict`) skips that check until it loads.
"""

from __future__ import annotations

import operator

import torch
from torch import nn

from nvfp4_gemv.linear.formats import ACTIVATION_DTYPES, K_ALIGN, WEIGHT_DTYPES, format_of
from nvfp4_gemv.linear.op import fp4_linear
from nvfp4_gemv.linear.quantize import quantize_mxfp4, quantize_nvfp4
from nvfp4_gemv.linear.validate import check_global_scale_value, scale_shape, validate_linear

_FORMAT_BUFFERS = ("weight", "weight_scale", "global_scale")


def _as_int(v):
    """v as an int where it is an integer (numpy's included, as nn.Linear takes them; not a bool), else None."""
    if isinstance(v, bool):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def _check_dtype(dtype, name: str = "dtype", hint: str = "") -> None:
    if dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"{name}: expected one of {ACTIVATION_DTYPES} (the activations' dtype), got {dtype!r}{hint}")


def _checked(weight, weight_scale, fmt, scale_layout, global_scale, bias, dtype) -> tuple[int, int]:
    """(N, K) of a module's tensors, all checked as `fp4_linear` takes them (x of `dtype`, the bias's where there is
    one) and a tensor scale for NaN and infinity; ValueError naming the tensor otherwise."""
    if bias is not None and isinstance(bias, torch.Tensor):
        _check_dtype(bias.dtype, "bias", "; cast it, e.g. bias.to(torch.bfloat16)")
        dtype = bias.dtype
    _check_dtype(dtype)
    x = torch.empty((0, 2 * weight.shape[1]), dtype=dtype, device=weight.device) \
        if isinstance(weight, torch.Tensor) and weight.dim() == 2 else None
    _, n, k = validate_linear(x, weight, weight_scale, fmt, scale_layout, global_scale, bias)
    check_global_scale_value(global_scale)
    return n, k


def activation_dtype_of(linear: nn.Linear) -> torch.dtype:
    """The activations' dtype an FP4Linear in place of `linear` takes by default: the Linear's own where that is bf16
    or fp16, else bf16."""
    return linear.weight.dtype if linear.weight.dtype in ACTIVATION_DTYPES else torch.bfloat16


class FP4Linear(nn.Module):
    """y = x · dequant(weight)ᵀ + bias for x (..., in_features) bf16/fp16. A new module holds zero weights; fill it
    with `from_quantized`, `from_linear` or the loaders (nvfp4_gemv.linear.loaders)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, fmt: str = "nvfp4",
                 scale_layout: str = "plain", device=None, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        f = format_of(fmt)
        k, n = _as_int(in_features), _as_int(out_features)
        if k is None or k < 1 or k % K_ALIGN:
            raise ValueError(f"in_features: expected a positive multiple of {K_ALIGN}, got {in_features!r}")
        if n is None or n < 1:
            raise ValueError(f"out_features: expected a positive int, got {out_features!r}")
        in_features, out_features = k, n
        _check_dtype(dtype)
        weight = torch.zeros((out_features, in_features // 2), dtype=torch.uint8, device=device)
        weight_scale = torch.zeros(scale_shape(f, scale_layout, out_features, in_features),
                                   dtype=f.scale_dtypes[0], device=device)
        global_scale = torch.ones((), dtype=torch.float32, device=device) if f.has_global else None
        bias_t = torch.zeros(out_features, dtype=dtype, device=device) if bias else None
        self._set(weight, weight_scale, fmt, scale_layout, global_scale, bias_t, dtype)

    def _set(self, weight, weight_scale, fmt, scale_layout, global_scale, bias, dtype):
        """Check and take the tensors as buffers; `dtype` is the activations' (the bias's, when there is one)."""
        n, k = _checked(weight, weight_scale, fmt, scale_layout, global_scale, bias, dtype)
        if global_scale is not None and not isinstance(global_scale, torch.Tensor):
            global_scale = torch.full((), float(global_scale), dtype=torch.float32, device=weight.device)
        self.in_features, self.out_features = k, n
        self.fmt, self.scale_layout = fmt, scale_layout
        self.register_buffer("weight", weight)
        self.register_buffer("weight_scale", weight_scale)
        self.register_buffer("global_scale", global_scale)
        self.register_buffer("bias", bias)

    @classmethod
    def from_quantized(cls, weight, weight_scale, fmt: str = "nvfp4", global_scale=None, bias=None,
                       scale_layout: str = "plain", dtype: torch.dtype = torch.bfloat16) -> FP4Linear:
        """A module over existing fp4 tensors (no copy; see `fp4_linear` for their formats). `dtype`: the
        activations' dtype where there is no bias to say it."""
        module = cls.__new__(cls)
        nn.Module.__init__(module)
        module._set(weight, weight_scale, fmt, scale_layout, global_scale, bias, dtype)
        return module

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str = "nvfp4", scale_layout: str = "plain",
                    dtype: torch.dtype | None = None) -> FP4Linear:
        """Quantize an nn.Linear (quantize.py); the bias is cast to `dtype`, the activations' dtype, by default the
        linear's own where that is bf16/fp16, else bf16."""
        if dtype is None:
            dtype = activation_dtype_of(linear)
        if format_of(fmt).has_global:
            weight, weight_scale, global_scale = quantize_nvfp4(linear.weight, scale_layout)
        else:
            weight, weight_scale, global_scale = quantize_mxfp4(linear.weight)
        bias = None if linear.bias is None else linear.bias.detach().to(dtype).contiguous()
        return cls.from_quantized(weight, weight_scale, fmt, global_scale, bias, scale_layout, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp4_linear(x, self.weight, self.weight_scale, self.fmt, self.global_scale, self.bias,
                          self.scale_layout)

    def path(self, m: int, dtype: torch.dtype | None = None) -> str:
        """Which kernel serves a call with M rows of x in `dtype` (default: the bias's, else bf16), in words."""
        if dtype is None:
            dtype = self.bias.dtype if self.bias is not None else torch.bfloat16
        device = self.weight.device
        if device.type == "cuda":
            from nvfp4_gemv.linear import kernels

            return kernels.describe(m, self.out_features, self.in_features, self.fmt, dtype, device, self.scale_layout)
        return f"reference ({device.type})"

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # The format's buffers load bit for bit, as _apply moves them: torch's copy_ would convert e8m0, uint8 and
        # e4m3 scales by value and has no fp4 kernel. A key of another dtype than its format allows is refused, a
        # NaN or infinite tensor scale too, and a 1-element tensor scale of any shape loads into this one's.
        f = format_of(self.fmt)
        allowed = {"weight": WEIGHT_DTYPES, "weight_scale": f.scale_dtypes, "global_scale": (torch.float32,)}
        swapped = {}  # name -> (own buffer, its raw view, the state dict's entry)
        try:
            for name, dtypes in allowed.items():
                own, key = self._buffers.get(name), prefix + name
                src = state_dict.get(key)
                if own is None or not isinstance(src, torch.Tensor):
                    continue
                if src.dtype not in dtypes:
                    raise ValueError(f"{key}: expected dtype {' or '.join(str(d) for d in dtypes)} ({f.name}'s "
                                     f"{name}), got {src.dtype}")
                if name == "global_scale" and src.numel() == 1:
                    check_global_scale_value(src, key)
                    src = src.reshape(own.shape)
                raw = torch.int32 if own.element_size() == 4 else torch.uint8
                swapped[name] = (own, own.view(raw), state_dict[key])
                self._buffers[name], state_dict[key] = swapped[name][1], src.view(raw)
            super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                          error_msgs)
        finally:
            for name, (own, raw_view, entry) in swapped.items():
                # Copied into the raw view (the usual load): the buffer itself. Assigned, or swapped into the raw
                # view (torch.__future__.set_swap_module_params_on_conversion): the loaded bytes, in its dtype.
                now = self._buffers[name]
                kept = now is raw_view and now.device == own.device and now.data_ptr() == own.data_ptr()
                self._buffers[name] = own if kept else now.view(own.dtype)
                state_dict[prefix + name] = entry
        if local_metadata.get("assign_to_params_buffers", False):  # the state dict's tensors as they are: check them
            bias = self._buffers.get("bias")
            _checked(self.weight, self.weight_scale, self.fmt, self.scale_layout, self.global_scale, bias,
                     torch.bfloat16 if bias is None else bias.dtype)

    def _apply(self, fn, recurse=True):
        # nn.Module casts every floating-point buffer on .half()/.to(dtype); the format's buffers (fp4, e4m3, e8m0,
        # the fp32 tensor scale) pass through fn as integer views of their bits, so fn moves them and casts nothing.
        saved = {}
        for name in _FORMAT_BUFFERS:
            t = self._buffers.get(name)
            if t is not None and t.is_floating_point():
                saved[name] = t.dtype
                self._buffers[name] = t.view(torch.int32 if t.element_size() == 4 else torch.uint8)
        try:
            return super()._apply(fn, recurse)
        finally:
            for name, dtype in saved.items():
                self._buffers[name] = self._buffers[name].view(dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"fmt={self.fmt}, scale_layout={self.scale_layout}")
