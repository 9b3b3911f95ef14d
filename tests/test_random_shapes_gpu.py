"""Shapes that no other file names, drawn at random with fixed seeds (marked `gpu`): the dispatched GEMV on contest and
full-range data, and the fp4 linear over formats, scale layouts, x dtypes, bias and global scale, against their
references. Dispatch chooses kernels and splits from (M, K, L) or (M, N, K); these draws land between the shapes it was
fitted on, at token counts, row counts and K that the fixed-shape tests skip."""

import random

import pytest
import torch

from nvfp4_gemv.kernel import custom_kernel
from nvfp4_gemv.linear import fp4_linear
from submission.reference import check, generate_full_range, generate_input, ref_kernel
from test_linear_op import LAYOUTS, _assert_kernel_close, _cuda, operands

pytestmark = pytest.mark.gpu

GEMV_BYTES = 48 << 20  # A's bytes at most, so that a draw runs in a second or two
LINEAR_BYTES = 32 << 20


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return int(round(lo * (hi / lo) ** rng.random()))


def gemv_shapes(count: int, seed: int = 20261202):
    rng = random.Random(seed)
    shapes = []
    while len(shapes) < count:
        m, k, l = log_uniform(rng, 1, 30000), 64 * log_uniform(rng, 1, 450), rng.choice([1, 1, 2, 3, 4, 5, 8])
        if m * k * l // 2 <= GEMV_BYTES:
            shapes.append((m, k, l))
    return shapes


def linear_cases(count: int, seed: int = 20261203):
    rng = random.Random(seed)
    cases = []
    while len(cases) < count:
        n, k = log_uniform(rng, 1, 30000), 64 * log_uniform(rng, 1, 450)
        m = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 15, 16, 17, 24])
        fmt, layout = rng.choice(LAYOUTS)
        if n * k // 2 <= LINEAR_BYTES:
            cases.append((m, n, k, fmt, layout, rng.choice([torch.bfloat16, torch.float16]), rng.random() < 0.5,
                          rng.randrange(1 << 30)))
    return cases


def _run(data, sf_kind):
    c = data[-1]
    c.fill_(float("nan"))
    out = custom_kernel(data, sf_kind=sf_kind).clone()
    ref_data = list(data)
    ref_data[-1] = torch.empty_like(c)
    return out, ref_kernel(tuple(ref_data))


@pytest.mark.parametrize("m,k,l", gemv_shapes(24), ids=lambda v: str(v))
def test_gemv_random_shape(m, k, l):
    for sf_kind in ("permuted", "plain"):
        out, ref = _run(generate_input(m, k, l, seed=m + 3 * k + l, device="cuda"), sf_kind)
        assert torch.equal(out, ref), f"{sf_kind} scales: contest data not bit-exact"
        out, ref = _run(generate_full_range(m, k, l, seed=m + k + 5 * l, device="cuda"), sf_kind)
        ok, msg = check(out, ref)
        assert ok, f"{sf_kind} scales, full-range data: {msg}"


@pytest.mark.parametrize("m,n,k,fmt,layout,dtype,bias,seed", linear_cases(32), ids=lambda v: str(v))
def test_linear_random_shape(m, n, k, fmt, layout, dtype, bias, seed):
    a = _cuda(operands(fmt, layout, n=n, k=k, lead=(m,), dtype=dtype, bias=bias, seed=seed % 10000)[0])
    y = fp4_linear(**a)
    assert y.shape == (m, n) and y.dtype == dtype
    _assert_kernel_close(y, a)
