"""The fp32 reference of the fp4 W4A16 linear: dequantize W, then one fp32 matmul, rounded once to x's dtype.

`dequantize` decodes the e2m1 codes through the 16-entry table (even k from the low nibble), multiplies each block
of `fmt.block` elements by its decoded scale and then by the tensor scale: e2m1 · scale is exact in fp32 (but at
MXFP4's two largest scales, where code · scale passes fp32's range and is inf: |code| >= 4 at 2^126, >= 2 at
2^127), so the only rounding is the final product with the tensor scale. Swizzled NVFP4 scales are read back to
plain through layouts.convert. Vectorized torch on any device; it is the CPU implementation of the op and the
tests' oracle.
"""

from __future__ import annotations

import torch

from layouts.constants import SF_VEC
from layouts.convert import permuted_shape_stride, permuted_to_plain
from nvfp4_gemv.linear.formats import e2m1_table
from nvfp4_gemv.linear.validate import validate_linear, validate_weight


def swizzled_to_plain(weight_scale: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """(ceil(N/128)*128, K/16) swizzled scale buffer -> (N, K/16) plain scales, same dtype (a copy)."""
    shape, stride = permuted_shape_stride(n, k // SF_VEC, 1)
    atoms = weight_scale.as_strided(shape, stride)  # (32, 4, rest_n, 4, rest_k, 1) over the buffer
    return permuted_to_plain(atoms, n, k)[:, :, 0]


def dequantize(weight, weight_scale, fmt, scale_layout="plain", global_scale=None) -> torch.Tensor:
    """fp32 (N, K) values of an fp4 weight: e2m1 · decoded block scale (· global_scale, for nvfp4).

    weight (N, K/2) uint8 or float4_e2m1fn_x2; weight_scale as validate.scale_shape gives; global_scale None, a
    float or a 1-element fp32 tensor. Any strides and alignment are accepted here.
    """
    if isinstance(weight, torch.Tensor) and isinstance(weight_scale, torch.Tensor):
        weight, weight_scale = weight.contiguous(), weight_scale.contiguous()  # no-ops on the usual input
    n, k, f = validate_weight(weight, weight_scale, fmt, scale_layout, global_scale, check_pointers=False)
    if scale_layout == "swizzled":
        weight_scale = swizzled_to_plain(weight_scale, n, k)
    packed = weight.view(torch.uint8)
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(n, k)  # even k in the low nibble
    values = e2m1_table(packed.device)[codes.int()]
    scales = f.decode_scale(weight_scale)
    w = (values.view(n, k // f.block, f.block) * scales.unsqueeze(-1)).view(n, k)
    if global_scale is not None:
        w = w * (global_scale.reshape(()) if isinstance(global_scale, torch.Tensor) else float(global_scale))
    return w


def linear_reference(x, weight, weight_scale, fmt="nvfp4", global_scale=None, bias=None,
                     scale_layout="plain") -> torch.Tensor:
    """y = x · dequantize(W)ᵀ (+ bias) in fp32, rounded once to x's dtype; y has x's leading dims and last dim N."""
    m, n, k = validate_linear(x, weight, weight_scale, fmt, scale_layout, global_scale, bias, check_pointers=False)
    w = dequantize(weight, weight_scale, fmt, scale_layout, global_scale)
    y = x.reshape(m, k).float() @ w.t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], n)
