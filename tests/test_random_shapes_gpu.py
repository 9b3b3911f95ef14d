"""Shapes that no other file names, drawn at random with fixed seeds (marked `gpu`): the dispatched GEMV on contest and
full-range data, the fp4 linear over formats, scale layouts, x dtypes, bias and global scale, and the routed experts
over expert counts, token counts, top_k and id dtypes, against their references. Dispatch chooses kernels and splits from (M, K, L) or (M, N, K); these draws land between the shapes it was
fitted on, at token counts, row counts and K that the fixed-shape tests skip.

Other draws: `NVFP4_GEMV_DRAW_SEED=<int>` moves every seed here by that much, and `NVFP4_GEMV_DRAWS=<n>` multiplies
the number of draws, so a GPU can check shapes that no run has seen:
`NVFP4_GEMV_DRAW_SEED=$RANDOM NVFP4_GEMV_DRAWS=4 python -m pytest -q -m gpu tests/test_random_shapes_gpu.py`."""

import os
import random

import pytest
import torch

from nvfp4_gemv.kernel import custom_kernel
from nvfp4_gemv.linear import FP4Linear, fp4_experts_linear, fp4_linear, quantize_mxfp4, quantize_nvfp4
from nvfp4_gemv.linear.experts import EXPERTS_MAX_TOKENS
from submission.reference import check, generate_full_range, generate_input, ref_kernel
from test_linear_experts import _assert_close as _assert_experts_close
from test_linear_experts import operands as experts_operands
from test_linear_op import LAYOUTS, _assert_kernel_close, _cuda, module_args, operands

pytestmark = pytest.mark.gpu

GEMV_BYTES = 48 << 20  # A's bytes at most, so that a draw runs in a second or two
LINEAR_BYTES = 32 << 20
SEED = int(os.environ.get("NVFP4_GEMV_DRAW_SEED", "0"))
DRAWS = int(os.environ.get("NVFP4_GEMV_DRAWS", "1"))


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(lo * (hi / lo) ** rng.random()))


def gemv_shapes(count: int, seed: int = 20261202):
    rng = random.Random(seed + SEED)
    shapes = []
    while len(shapes) < count:
        m, k, l = log_uniform(rng, 1, 30000), 64 * log_uniform(rng, 1, 450), rng.choice([1, 1, 2, 3, 4, 5, 8])
        if m * k * l // 2 <= GEMV_BYTES:
            shapes.append((m, k, l))
    return shapes


def linear_draw(rng: random.Random, n_max: int, k_max: int, tokens, max_bytes: int):
    """(M, N, K, format, scale layout) of one linear draw (N and K/64 log-uniform), or None where the weight's codes
    pass max_bytes."""
    n, k = log_uniform(rng, 1, n_max), 64 * log_uniform(rng, 1, k_max // 64)
    m = rng.choice(tokens)
    fmt, layout = rng.choice(LAYOUTS)
    return (m, n, k, fmt, layout) if n * k // 2 <= max_bytes else None


def linear_cases(count: int, seed: int = 20261203):
    rng = random.Random(seed + SEED)
    cases = []
    while len(cases) < count:
        draw = linear_draw(rng, 30000, 64 * 450, [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 15, 16, 17, 24], LINEAR_BYTES)
        if draw:
            cases.append((*draw, rng.choice([torch.bfloat16, torch.float16]), rng.random() < 0.5,
                          rng.randrange(1 << 30)))
    return cases


def _run(data, sf_kind):
    c = data[-1]
    c.fill_(float("nan"))
    out = custom_kernel(data, sf_kind=sf_kind).clone()
    ref_data = list(data)
    ref_data[-1] = torch.empty_like(c)
    return out, ref_kernel(tuple(ref_data))


@pytest.mark.parametrize("m,k,l", gemv_shapes(24 * DRAWS), ids=lambda v: str(v))
def test_gemv_random_shape(m, k, l):
    for sf_kind in ("permuted", "plain"):
        out, ref = _run(generate_input(m, k, l, seed=m + 3 * k + l, device="cuda"), sf_kind)
        assert torch.equal(out, ref), f"{sf_kind} scales: contest data not bit-exact"
        out, ref = _run(generate_full_range(m, k, l, seed=m + k + 5 * l, device="cuda"), sf_kind)
        ok, msg = check(out, ref)
        assert ok, f"{sf_kind} scales, full-range data: {msg}"


@pytest.mark.parametrize("m,n,k,fmt,layout,dtype,bias,seed", linear_cases(32 * DRAWS), ids=lambda v: str(v))
def test_linear_random_shape(m, n, k, fmt, layout, dtype, bias, seed):
    a = _cuda(operands(fmt, layout, n=n, k=k, lead=(m,), dtype=dtype, bias=bias, seed=seed % 10000)[0])
    y = fp4_linear(**a)
    assert y.shape == (m, n) and y.dtype == dtype
    _assert_kernel_close(y, a)


def checkpoint_like(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    """A weight as models have them, before quantization: rows of magnitudes from 2^-10 to 2^4, a few outliers 50x
    their row, and a few all-zero 32-element blocks (an amax rule gives them the least scale: e8m0 byte 0, e4m3 0)."""
    w = torch.randn(n, k, generator=g) * torch.exp2(torch.rand(n, 1, generator=g) * 14 - 10)
    outliers = torch.rand(n, k, generator=g) < 1e-3
    w[outliers] *= 50
    w.view(n, k // 32, 32)[torch.rand(n, k // 32, generator=g) < 0.01] = 0
    return w


def quantized_cases(count: int, seed: int = 20261206):
    rng = random.Random(seed + SEED)
    cases = []
    while len(cases) < count:
        draw = linear_draw(rng, 20000, 64 * 300, [1, 1, 2, 3, 4, 6, 8, 10, 16, 20, 32, 33, 64, 127, 200],
                           LINEAR_BYTES // 2)
        if draw:
            cases.append((*draw, rng.choice([torch.bfloat16, torch.float16]), rng.randrange(1 << 30)))
    return cases


@pytest.mark.parametrize("m,n,k,fmt,layout,dtype,seed", quantized_cases(24 * DRAWS), ids=lambda v: str(v))
def test_linear_random_quantized(m, n, k, fmt, layout, dtype, seed):
    """The path users take: a checkpoint-like weight quantized with the amax rules (zero blocks and outliers
    included), at token counts up to the dequantize-and-GEMM path, through the module; against the fp32 reference,
    and the same bits on a second call."""
    g = torch.Generator().manual_seed(seed)
    w = checkpoint_like(n, k, g).cuda()
    weight, scale, global_scale = (quantize_nvfp4(w, layout) if fmt == "nvfp4" else quantize_mxfp4(w))
    bias = (torch.randn(n, generator=g) * 0.1).to(dtype).cuda() if seed % 2 else None
    layer = FP4Linear.from_quantized(weight, scale, fmt, global_scale, bias, layout, dtype)
    x = torch.randn(m, k, generator=g).to(dtype).cuda()
    y = layer(x)
    assert y.shape == (m, n) and y.dtype == dtype
    _assert_kernel_close(y, module_args(layer, x))
    assert torch.equal(y, layer(x)), layer.path(m, dtype)


def experts_cases(count: int, seed: int = 20261207):
    """(E, N, K, T, top_k, format, x dtype, ids dtype, bad ids, seed): E up to 1,023 (both side-by-side tiers of the
    run table), T to past EXPERTS_MAX_TOKENS (the host's grouping), a router's distinct experts a token; sizes capped
    so that the CPU reference (every expert dequantized, every slot's row of W in float64) stays small."""
    rng = random.Random(seed + SEED)
    cases = []
    while len(cases) < count:
        e, n, k = log_uniform(rng, 1, 1023), log_uniform(rng, 1, 3000), 64 * log_uniform(rng, 1, 64)
        t = rng.choice([1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 24, 33, 64, 100, 200, EXPERTS_MAX_TOKENS + 3])
        top_k = rng.choice([1, 2, 4, 6, 8, 10])
        if len(cases) % 3 == 2:  # a third of the draws: many experts and slots, small experts (the run table's range)
            e, n, t = log_uniform(rng, 200, 1023), log_uniform(rng, 1, 48), rng.choice([24, 33, 64, 100, 200, 256])
        if e * n * k > 6_000_000 or t * top_k * n * k > 12_000_000:
            continue
        cases.append((e, n, k, t, top_k, rng.choice(["nvfp4", "mxfp4"]), rng.choice([torch.bfloat16, torch.float16]),
                      rng.choice([torch.int32, torch.int64]), rng.random() < 0.3, rng.randrange(1 << 30)))
    return cases


@pytest.mark.parametrize("e,n,k,t,top_k,fmt,dtype,ids_dtype,bad,seed", experts_cases(24 * DRAWS),
                         ids=lambda v: str(v))
def test_experts_random_shape(e, n, k, t, top_k, fmt, dtype, ids_dtype, bad, seed):
    """The dispatched routed call (whichever of one slot a CTA row, the scanned runs or the table's runs it takes)
    against the reference; with some ids out of range (up to EXPERTS_MAX_TOKENS tokens, where the launch takes
    them), those slots NaN and the others the same bits."""
    a = experts_operands(fmt, e, n, k, t, top_k, dtype, ids_dtype, fmt == "nvfp4" and seed % 2 == 0, seed % 3 == 0,
                         seed=seed % 10000, device="cuda")
    y = fp4_experts_linear(**a)
    assert y.shape == (t, top_k, n) and y.dtype == dtype
    _assert_experts_close(y, a)
    if bad and t <= EXPERTS_MAX_TOKENS:
        g = torch.Generator().manual_seed(seed)
        out = torch.rand(t, top_k, generator=g) < 0.1
        ids = a["expert_ids"].cpu().clone()
        ids[out] = torch.where(torch.rand(t, top_k, generator=g) < 0.5, -1, e)[out].to(ids.dtype)
        yb = fp4_experts_linear(**{**a, "expert_ids": ids.cuda()})
        out = out.cuda()
        assert yb[out].isnan().all() and torch.equal(yb[~out], y[~out])
