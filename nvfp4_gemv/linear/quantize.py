"""Quantize a bf16/fp16/fp32 weight (N, K) to NVFP4 or MXFP4, in the layouts the linear reads.

NVFP4 follows ModelOpt: global = amax / (6·448); block scale = e4m3(block_amax / (6·global)); codes = e2m1 of
w / (scale·global). MXFP4 follows the OCP microscaling rule: the shared exponent is floor(log2(block_amax)) - 2
(2 being e2m1's emax), clamped to e8m0's range. Codes round to nearest, ties to even, and saturate at ±6; the sign
bit follows the input's (so -0.0 stays code 8). Vectorized torch on any device.
"""

from __future__ import annotations

import torch

from layouts.convert import to_blocked
from nvfp4_gemv.linear.formats import (
    E2M1_EMAX,
    E2M1_MAX,
    E2M1_VALUES,
    E4M3_MAX,
    E8M0_BIAS,
    K_ALIGN,
    MXFP4,
    NVFP4,
    SCALE_LAYOUTS,
)
from nvfp4_gemv.linear.validate import scale_shape

_MAGNITUDES = E2M1_VALUES[:8]  # codes 0..7, increasing
# Between codes c and c+1 a tie goes to the even code: to c (strictly above the midpoint to move up) when c is
# even, else to c+1 (at or above the midpoint).
_MIDPOINTS = tuple(((a + b) / 2, c % 2 == 0) for c, (a, b) in enumerate(zip(_MAGNITUDES, _MAGNITUDES[1:])))


def e2m1_codes(q: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes (0..15) of fp32 values `q`: round to nearest, ties to even, saturate at ±6."""
    a = q.abs()
    mag = torch.zeros(q.shape, dtype=torch.uint8, device=q.device)
    for mid, tie_down in _MIDPOINTS:
        mag += (a > mid) if tie_down else (a >= mid)
    return mag | (torch.signbit(q).to(torch.uint8) << 3)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) codes -> (N, K/2) uint8, the even k in the low nibble."""
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def _blocks(weight, block: int) -> torch.Tensor:
    """fp32 (N, K/block, block) view of a checked weight (N, K)."""
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"weight: expected a torch.Tensor, got {type(weight).__name__}")
    if weight.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"weight: expected dtype torch.bfloat16, torch.float16 or torch.float32, got {weight.dtype}")
    if weight.dim() != 2 or weight.shape[0] < 1 or weight.shape[1] < 1 or weight.shape[1] % K_ALIGN:
        raise ValueError(f"weight: expected shape (N, K) with N >= 1 and K a positive multiple of {K_ALIGN}, "
                         f"got {tuple(weight.shape)}")
    if weight.device.type == "meta":
        raise ValueError("weight: expected a tensor with data to quantize, got one on the meta device")
    w = weight.detach().float()
    if not bool(torch.isfinite(w).all()):
        raise ValueError("weight: expected finite values, found NaN or infinity")
    n, k = w.shape
    return w.reshape(n, k // block, block)


def quantize_nvfp4(weight, scale_layout: str = "plain"):
    """weight (N, K) -> (weight uint8 (N, K/2), weight_scale float8_e4m3fn, global_scale fp32 0-dim tensor).

    weight_scale is (N, K/16) for scale_layout "plain", or the 128x4-atom swizzled buffer for "swizzled".
    """
    if scale_layout not in SCALE_LAYOUTS:
        raise ValueError(f"scale_layout: expected one of {SCALE_LAYOUTS}, got {scale_layout!r}")
    w = _blocks(weight, NVFP4.block)
    amax = w.abs().amax()
    global_scale = torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax))
    block_amax = w.abs().amax(dim=-1)
    scale = (block_amax / (E2M1_MAX * global_scale)).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
    denom = (NVFP4.decode_scale(scale) * global_scale).unsqueeze(-1)
    q = torch.where(denom > 0, w / denom, w * 0)  # a block whose scale is 0 decodes to 0 whatever its codes
    weight_u8 = pack_codes(e2m1_codes(q).flatten(1))
    if scale_layout == "swizzled":
        n, blocks = scale.shape
        scale = to_blocked(scale).view(scale_shape(NVFP4, "swizzled", n, blocks * NVFP4.block))
    return weight_u8, scale, global_scale


def quantize_mxfp4(weight):
    """weight (N, K) -> (weight uint8 (N, K/2), weight_scale uint8 (N, K/32) e8m0 bytes, None)."""
    w = _blocks(weight, MXFP4.block)
    block_amax = w.abs().amax(dim=-1)
    _, exp = torch.frexp(block_amax)  # block_amax = m · 2^exp with m in [0.5, 1): floor(log2) = exp - 1
    shared = torch.where(block_amax > 0, exp - 1 - E2M1_EMAX, -E8M0_BIAS).clamp(-E8M0_BIAS, E8M0_BIAS)
    scale = (shared + E8M0_BIAS).to(torch.uint8)
    q = w / MXFP4.decode_scale(scale).unsqueeze(-1)
    return pack_codes(e2m1_codes(q).flatten(1)), scale, None
