"""The CUDA side of the W4A16 linear: pick a `cute_kernels.linear_w4a16` config for (M, N, K, format, dtype) and the
device's SM count, compile it once (TVM-FFI, torch's current stream), and launch it.

The caller (`nvfp4_gemv.linear.op`) has validated the operands; this module trusts them.
"""

from __future__ import annotations

import torch

from cute_kernels.tc_workspace import sm_count

SCALE_LAYOUTS = {"plain": "plain", "swizzled": "permuted"}  # the linear's names -> the kernel's sf_kind
_X_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
H200_SMS = 132

# One warp's share of a CTA: `groups` 16-row MMA groups; `row_warps` warps on different rows share x through L1;
# `k_warps` warps split K inside the CTA. Chosen from an H200 sweep (BENCHMARKS.md, "The W4A16 linear").
WARPS_PER_SM_TARGET = 24


def config_for(m: int, n: int, k: int, fmt: str, scale_layout: str, x_dtype: str, bias: bool, global_scale: bool,
               sms: int = H200_SMS, **override):
    """The kernel config for one call shape."""
    from cute_kernels.linear_w4a16 import LinearW4A16Config

    token_tiles = 1 if m <= 8 else 2
    groups, row_warps = 2, 2
    rows_per_cta = 16 * groups * row_warps
    ctas = -(-n // rows_per_cta)
    # Enough warps in flight: split K inside the CTA until the GPU holds about WARPS_PER_SM_TARGET warps an SM,
    # keeping at least two 128-K steps per warp.
    k_warps = 1
    while (row_warps * k_warps * 2 <= 16 and ctas * row_warps * k_warps * 2 <= WARPS_PER_SM_TARGET * sms
           and k // 128 >= 4 * k_warps):
        k_warps *= 2
    cfg = dict(fmt=fmt, sf_kind=SCALE_LAYOUTS[scale_layout], x_dtype=x_dtype, token_tiles=token_tiles, groups=groups,
               row_warps=row_warps, k_warps=k_warps, bias=bias, global_scale=global_scale)
    cfg.update(override)
    return LinearW4A16Config(**cfg)


_DUMMIES: dict = {}


def _dummy(device, dtype):
    key = (device, dtype)
    t = _DUMMIES.get(key)
    if t is None:
        t = _DUMMIES[key] = torch.zeros(1, dtype=dtype, device=device)
    return t


_FNS: dict = {}


def _function(cfg, capability):
    key = (cfg, capability)
    fn = _FNS.get(key)
    if fn is None:
        from cute_kernels.compile import compile_kernel, raw_function
        from cute_kernels.linear_w4a16 import LinearW4A16
        from cute_kernels.targets import target

        fn = _FNS[key] = raw_function(compile_kernel(LinearW4A16, cfg, target(capability), stream="torch"))
    return fn


_CAPS: dict = {}


def _capability(device) -> tuple[int, int]:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    cap = _CAPS.get(idx)
    if cap is None:
        cap = _CAPS[idx] = torch.cuda.get_device_capability(idx)
    return idx, cap


def run(out2d, x2d, weight_u8, scale_u8, fmt, scale_layout, global_scale, bias, **override) -> None:
    """out2d[M, N] = x2d · dequant(W)ᵀ (+ bias), on torch's current stream. Operands already validated."""
    m, k = x2d.shape
    n = weight_u8.shape[0]
    idx, cap = _capability(x2d.device)
    cfg = config_for(m, n, k, fmt, scale_layout, _X_DTYPES[x2d.dtype], bias is not None, global_scale is not None,
                     sm_count(idx), **override)
    fn = _function(cfg, cap)
    gs = global_scale if global_scale is not None else _dummy(x2d.device, torch.float32)
    b = bias if bias is not None else _dummy(x2d.device, x2d.dtype)
    fn(x2d, weight_u8, scale_u8, out2d, gs, b)


def describe(m: int, n: int, k: int, fmt: str, x_dtype, device=None, scale_layout: str = "plain") -> str:
    """Which kernel and config serve this call (for users and logs)."""
    xd = _X_DTYPES.get(x_dtype, x_dtype)
    sms = H200_SMS
    if device is not None and torch.device(device).type == "cuda":
        sms = sm_count(torch.device(device).index or 0)
    cfg = config_for(m, n, k, fmt, scale_layout, xd, False, False, sms)
    path = "tensor cores (mma.sync m16n8k16)" + (", x as bf16 hi+lo" if cfg.split_x else "")
    tiles = -(-m // cfg.tokens_per_cta)
    note = "" if m <= 16 else f"; M > 16: {tiles} token tiles of {cfg.tokens_per_cta}, W read once per tile"
    return (f"linear_w4a16 {fmt} {xd}: {path}, {cfg.mma_dtype} MMA, groups={cfg.groups} row_warps={cfg.row_warps} "
            f"k_warps={cfg.k_warps} token_tiles={cfg.token_tiles}{note}")
