"""The many-token path of the W4A16 linear: W dequantized to x's dtype in row chunks (`cute_kernels.dequant_fp4`), then
cuBLAS on each chunk.

The fp4 kernel decodes W once per 16 tokens, so its time grows with M; from PREFILL_MIN_TOKENS tokens a GEMM on a
16-bit copy of the rows is faster (BENCHMARKS.md, "Many tokens"). The copy is a transient chunk of at most
CHUNK_BYTES (128-row multiples, so a chunk of the swizzled scale buffer is a contiguous slice of it), allocated per
call from torch's caching allocator; the checkpoint's weights are never copied or kept.

Rounding: each dequantized value is exact in bf16 (and, for NVFP4, in fp16), cuBLAS sums in fp32 into fp32
(`torch.mm(..., out_dtype=torch.float32)`), and the global scale and bias apply to those sums before the one rounding
to x's dtype, as in the reference. MXFP4 with fp16 x stays on the fp4 kernel (e8m0 scales exceed fp16's range).
"""

from __future__ import annotations

import torch

from cute_kernels.compile import compile_kernel, raw_function
from cute_kernels.dequant_fp4 import MAX_ROWS, DequantFp4, DequantFp4Config
from cute_kernels.targets import target
from cute_kernels.tc_workspace import capability

# Graph-timed on the H200 (`nvfp4-gemv sweep --linear --many-tokens`, docs/linear_h200_many_tokens.csv, NVFP4, bf16
# x, seven shapes, M = 33-512): this path beats the fp4 kernel from M = 64-96 on 4096 x 4096, 5760 x 2880, 2880 x 2880
# and 4096 x 14336, from 128 on 8192 x 28672 and 28672 x 4096, and from 192 on 2048 x 768; at 128 it loses only
# there (11.0 against 9.9 µs).
PREFILL_MIN_TOKENS = 128
CHUNK_BYTES = 64 << 20
_OUT_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_SF_DTYPES = {torch.uint8: "u8", torch.float8_e4m3fn: "e4m3"}
_SF_KINDS = {"plain": "plain", "swizzled": "permuted"}


def takes(m: int, fmt: str, x_dtype) -> bool:
    """Whether a call of M tokens goes this way (x_dtype: a torch dtype or "bf16"/"fp16")."""
    return m >= PREFILL_MIN_TOKENS and not (fmt == "mxfp4" and x_dtype in (torch.float16, "fp16"))


def chunk_rows(n: int, k: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Rows of W dequantized at a time: a multiple of 128 with at most `chunk_bytes` of 16-bit values (at least 128
    rows), and no more than the dequantizer's grid takes."""
    rows = max(128, chunk_bytes // (2 * k) // 128 * 128)
    return min(rows, MAX_ROWS // 128 * 128, -(-n // 128) * 128)


EPILOGUES = ("separate", "fused")


def bind(n, k, device, x_dtype, scale_dtype, fmt, scale_layout, chunk_bytes: int = CHUNK_BYTES,
         epilogue: str = "fused"):
    """`run(out2d, x2d, weight_u8, scale, global_scale, bias)` for one call signature (everything but M); W is
    dequantized in chunks of at most `chunk_bytes` (chunk_rows). `epilogue`: how a chunk's fp32 sums get the global
    scale and bias and reach y: "fused", one elementwise kernel writing y's columns (addcmul, mul or add with y's
    slice as its out); "separate", in place and then copied (up to three kernels a chunk). The two give the same
    values to within an fp32 rounding before the one rounding to x's dtype. Graph-timed on the H200
    (bench.chunk_bytes_sweep; docs/linear_h200_ab_chunk_bytes.csv; BENCHMARKS.md, "The A/B runs of 2026-12-05"; NVFP4
    with a global scale, 7 shapes, M = 128-512): fused took 0.77-0.94 of separate's time at every chunk size; and
    chunks under 64 MB were slower at every point where they made more chunks (8 MB: 1.4-3.1 x), so CHUNK_BYTES
    stays."""
    if epilogue not in EPILOGUES:
        raise ValueError(f"epilogue: expected one of {EPILOGUES}, got {epilogue!r}")
    cfg = DequantFp4Config(fmt=fmt, sf_kind=_SF_KINDS[scale_layout], out_dtype=_OUT_DTYPES[x_dtype],
                           sf_dtype=_SF_DTYPES[scale_dtype])
    dequant = raw_function(compile_kernel(DequantFp4, cfg, target(capability(device)), stream="torch"))
    rows = chunk_rows(n, k, chunk_bytes)

    def run(out2d, x2d, weight_u8, scale, global_scale, bias):
        for n0 in range(0, n, rows):
            n1 = min(n, n0 + rows)
            sf_rows = n1 - n0 if cfg.sf_kind == "plain" else -(-(n1 - n0) // 128) * 128
            w16 = torch.empty(n1 - n0, k, dtype=x2d.dtype, device=x2d.device)
            dequant(weight_u8[n0:n1], scale[n0:n0 + sf_rows], w16)
            y = torch.mm(x2d, w16.t(), out_dtype=torch.float32)  # fp32 sums, whatever cuBLAS's reduction setting
            if epilogue == "fused":
                _epilogue(y, global_scale, None if bias is None else bias[n0:n1], out2d[:, n0:n1])
                continue
            if global_scale is not None:
                y.mul_(global_scale)
            if bias is not None:
                y.add_(bias[n0:n1])
            out2d[:, n0:n1].copy_(y)

    return run


def _epilogue(y, global_scale, bias, out):
    """out = y · global_scale + bias in one elementwise kernel (fp32 arithmetic, one rounding to out's dtype)."""
    if global_scale is not None and bias is not None:
        torch.addcmul(bias, y, global_scale, out=out)
    elif global_scale is not None:
        torch.mul(y, global_scale, out=out)
    elif bias is not None:
        torch.add(y, bias, out=out)
    else:
        out.copy_(y)
