"""The linear past 32 tokens: the fp4 kernel's token-tiles-fastest grid (m_major) and, from PREFILL_MIN_TOKENS, the
dequantize-and-GEMM path (cute_kernels/dequant_fp4.py, nvfp4_gemv/linear/prefill.py). On the CPU: the routing,
the chunking, the dequantizer's config checks and its PTX for sm_90a and sm_100a. On a GPU: the dequantized values
bit for bit against the fp32 reference's, and the path's output against the fp32 reference (error at most twice
the reference's own rounding) on full-range data, both formats and layouts, chunked and not, and repeatable."""

import itertools

import pytest
import torch

from nvfp4_gemv.linear import kernels, prefill
from nvfp4_gemv.linear.reference import dequantize
from registers import compiled_ptx
from test_linear_kernel import DTYPES, LAYOUTS, _check, _operands, _run


def test_prefill_takes_many_tokens_except_mxfp4_with_fp16():
    m0 = prefill.PREFILL_MIN_TOKENS
    for fmt in ("nvfp4", "mxfp4"):
        assert not prefill.takes(m0 - 1, fmt, torch.bfloat16) and prefill.takes(m0, fmt, torch.bfloat16)
        assert prefill.takes(10**6, fmt, "bf16")
    assert prefill.takes(m0, "nvfp4", torch.float16)
    assert not prefill.takes(10**6, "mxfp4", torch.float16) and not prefill.takes(10**6, "mxfp4", "fp16")


@pytest.mark.parametrize("n,k", [(1, 64), (200, 2880), (8192, 28672), (70000, 64), (4096, 4096), (300, 2**20)])
@pytest.mark.parametrize("chunk_bytes", [prefill.CHUNK_BYTES, 16 << 20, 1 << 20])
def test_chunk_rows(n, k, chunk_bytes):
    rows = prefill.chunk_rows(n, k, chunk_bytes)
    assert rows % 128 == 0 and 128 <= rows <= 65535
    assert rows * 2 * k <= chunk_bytes or rows == 128
    assert rows <= -(-n // 128) * 128  # a small W is one chunk, no larger than its 128-row blocks
    chunks = -(-n // rows)
    assert chunks == 1 or (chunks - 1) * rows < n <= chunks * rows


def test_bind_routes_by_token_count(monkeypatch):
    """The bound launch sends M >= PREFILL_MIN_TOKENS to the dequantize-and-GEMM path (bound once), fewer tokens,
    MXFP4 with fp16 x and explicit kernel configs to the fp4 kernel, with one plan per token class."""
    calls = []

    def fake_prefill_bind(*args):
        calls.append(("bind prefill", args[-2]))
        return lambda out, x, *rest: calls.append(("prefill", x.shape[0]))

    def fake_plan_for(m, *args, **override):
        calls.append(("plan", m))
        return (lambda x, *rest: calls.append(("kernel", x.shape[0]))), None, None, False

    monkeypatch.setattr(prefill, "bind", fake_prefill_bind)
    monkeypatch.setattr(kernels, "plan_for", fake_plan_for)
    m0 = prefill.PREFILL_MIN_TOKENS

    def launch(fmt, dtype, ms, **override):
        go = kernels.bind(256, 1024, torch.device("cpu"), dtype, torch.uint8, fmt, "plain", False, False, **override)
        for m in ms:
            go(None, torch.empty(m, 1024), None, None, None, None)

    launch("nvfp4", torch.bfloat16, [1, m0, m0 - 1, 5000, 33, 40, 49])
    assert calls == [("plan", 1), ("kernel", 1), ("bind prefill", "nvfp4"), ("prefill", m0), ("plan", m0 - 1),
                     ("kernel", m0 - 1), ("prefill", 5000), ("plan", 33), ("kernel", 33), ("kernel", 40),
                     ("kernel", 49)]  # 127 and 49 tokens: four 16-token tiles; 33 and 40: three
    calls.clear()
    launch("mxfp4", torch.float16, [m0, 4000])
    assert calls == [("plan", m0), ("kernel", m0), ("kernel", 4000)]
    calls.clear()
    launch("nvfp4", torch.bfloat16, [m0], k_warps=4)
    assert calls == [("plan", m0), ("kernel", m0)]


def test_m_major_past_32_tokens_on_weights_the_l2_cannot_hold():
    big = [(8192, 28672), (28672, 4096)]
    small = [(4096, 14336), (4096, 4096), (2880, 2880)]
    for n, k in big + small:
        for m in (1, 16, 17, 32):
            assert not kernels.config_for(m, n, k, "nvfp4", "plain", "bf16", False, True).m_major, (n, k, m)
        cfg = kernels.config_for(33, n, k, "nvfp4", "plain", "bf16", False, True)
        assert cfg.m_major == ((n, k) in big), (n, k)
        assert ("m_major" in kernels.describe(100, n, k, "nvfp4", "bf16")) == ((n, k) in big)
    # Row tiles go on the grid's y then: at most 65535 of them.
    assert not kernels.m_major_for(40, 65536 * 16 + 1, 4096, 16)
    from cute_kernels.linear_w4a16 import LinearW4A16Config

    with pytest.raises(ValueError, match="m_major"):
        LinearW4A16Config(m_major=True, k_splits=2)


def test_dequant_config_checks():
    from cute_kernels.dequant_fp4 import DequantFp4, DequantFp4Config

    for bad in (dict(fmt="mxfp4", out_dtype="fp16"), dict(fmt="mxfp4", sf_kind="permuted"), dict(fmt="fp8"),
                dict(out_dtype="fp32"), dict(fmt="mxfp4", sf_dtype="e4m3"), dict(sf_kind="tiled")):
        with pytest.raises(ValueError):
            DequantFp4Config(**bad)
    assert DequantFp4.can_implement(65535, 64) and not DequantFp4.can_implement(65536, 64)
    assert not DequantFp4.can_implement(10, 96) and not DequantFp4.can_implement(0, 64)


DEQUANT_PTX = [dict(), dict(sf_kind="permuted", sf_dtype="e4m3"), dict(out_dtype="fp16"), dict(fmt="mxfp4")]


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("kw", DEQUANT_PTX, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_dequant_ptx(tmp_path, kw, arch):
    text = compiled_ptx("dequant_fp4", "DequantFp4", kw, arch, tmp_path)
    # Four 128-bit stores a thread (one per 8-code word), the W words as 32-bit loads, one scale byte a word.
    assert text.count("st.global.v4") == 4
    assert text.count("ld.global.nc.u8") == 4
    # NVFP4 scales through the hardware e4m3 conversion; fp16 decodes codes through it too.
    assert ("cvt.rn.f16x2.e4m3x2" in text) == (kw.get("fmt", "nvfp4") == "nvfp4")
    assert ("mul.rn.bf16x2" in text) == (kw.get("out_dtype", "bf16") == "bf16")
    # Deterministic: no atomics.
    assert "atom." not in text and "red." not in text


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("n,k", [(77, 64), (300, 2880), (129, 4096)])
def test_dequant_is_exact(fmt, layout, dtype, n, k):
    """Every dequantized value equals the fp32 reference's (full-range codes and scales, subnormal e4m3 included)."""
    from cute_kernels.compile import compile_kernel, raw_function
    from cute_kernels.dequant_fp4 import DequantFp4, DequantFp4Config
    from cute_kernels.targets import target
    from cute_kernels.tc_workspace import capability

    if fmt == "mxfp4" and dtype == torch.float16:
        pytest.skip("MXFP4 into fp16 is refused (range)")
    w, scale, plain = _operands(n, k, fmt, layout)
    cfg = DequantFp4Config(fmt=fmt, sf_kind="permuted" if layout == "swizzled" else "plain",
                           out_dtype="bf16" if dtype == torch.bfloat16 else "fp16")
    fn = raw_function(compile_kernel(DequantFp4, cfg, target(capability(torch.device("cuda"))), stream="torch"))
    out = torch.full((n, k), float("nan"), dtype=dtype, device="cuda")
    fn(w.cuda(), scale.view(torch.uint8).cuda(), out)
    ref = dequantize(w, plain, fmt, "plain", None)
    assert torch.equal(out.float().cpu(), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("m,n,k", [(128, 300, 2880), (130, 17, 64), (200, 1300, 28672)],
                         ids=["one chunk", "tiny", "two chunks"])
def test_many_tokens_against_reference(fmt, layout, dtype, m, n, k):
    """The dispatched path at M >= PREFILL_MIN_TOKENS (the fp4 kernel for MXFP4 with fp16 x), with a global scale
    and bias; 1300 rows of K = 28672 take two chunks, the second one a partial 128-row block."""
    assert m >= prefill.PREFILL_MIN_TOKENS
    w, scale, plain = _operands(n, k, fmt, layout)
    x = torch.randn(m, k).to(dtype).cuda()
    gs = torch.tensor([0.37], device="cuda") if fmt == "nvfp4" else None
    bias = torch.randn(n).to(dtype).cuda()
    assert (prefill.chunk_rows(n, k) < n) == (n == 1300)
    y = _run(x, w.cuda(), scale.cuda(), fmt, layout, gs, bias)
    _check(y, x, w.cuda(), plain, fmt, gs, bias)
    assert torch.equal(y, _run(x, w.cuda(), scale.cuda(), fmt, layout, gs, bias))  # repeatable



@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout", LAYOUTS)
def test_small_chunks_against_reference(fmt, layout):
    """The path with chunks of 1 MB (`chunk_bytes`, as `bench.chunk_bytes_sweep` times them): 1300 rows of K = 2880
    in 128-row chunks, the last one partial, against the reference, as the default chunks are (cuBLAS may sum a
    narrower GEMM in another order, so the two need not agree bit for bit); both epilogues."""
    m, n, k = 130, 1300, 2880
    w, scale, plain = _operands(n, k, fmt, layout)
    w, scale = w.cuda(), scale.cuda()
    x = torch.randn(m, k).to(torch.bfloat16).cuda()
    gs = torch.tensor([0.37], device="cuda") if fmt == "nvfp4" else None
    bias = torch.randn(n).to(torch.bfloat16).cuda()
    for chunk_bytes, epilogue in itertools.product((1 << 20, prefill.CHUNK_BYTES), prefill.EPILOGUES):
        run = prefill.bind(n, k, x.device, x.dtype, torch.uint8, fmt, layout, chunk_bytes, epilogue)
        y = torch.empty(m, n, dtype=x.dtype, device="cuda")
        run(y, x, w.view(torch.uint8), scale.view(torch.uint8), gs, bias)
        _check(y, x, w, plain, fmt, gs, bias)
    assert prefill.chunk_rows(n, k, 1 << 20) == 128 and prefill.chunk_rows(n, k) >= n


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k", [(33, 200, 2048), (100, 1000, 4096), (127, 129, 192)])
def test_m_major_grid_against_reference(fmt, layout, m, n, k):
    """The token-tiles-fastest grid on shapes small enough for a test (the rule takes it on large W only)."""
    w, scale, plain = _operands(n, k, fmt, layout)
    x = torch.randn(m, k).to(torch.bfloat16).cuda()
    gs = torch.tensor([0.37], device="cuda") if fmt == "nvfp4" else None
    y = _run(x, w.cuda(), scale.cuda(), fmt, layout, gs, None, m_major=True, k_splits=1)
    _check(y, x, w.cuda(), plain, fmt, gs)
    assert torch.equal(y, _run(x, w.cuda(), scale.cuda(), fmt, layout, gs, None, m_major=False, k_splits=1))


def test_chunk_bytes_sweep_rows(monkeypatch):
    """The chunk-size sweep's rows, with the timer stubbed: one a (shape, M, chunk size), its chunk's rows named."""
    from nvfp4_gemv.linear import bench

    monkeypatch.setattr(bench, "_time", lambda factory: 2.0)
    rows = bench.chunk_bytes_sweep(shapes=((8192, 28672), (2880, 2880)), tokens=(128, 512), chunk_mb=(16, 64),
                                   log=lambda *a: None)
    assert len(rows) == 2 * 2 * 2 * 2 and {r["epilogue"] for r in rows} == set(prefill.EPILOGUES)
    by = {(r["n"], r["m"], r["chunk_mb"]): r["chunk_rows"] for r in rows}
    assert by[(8192, 128, 16)] == 256 and by[(8192, 512, 64)] == prefill.chunk_rows(8192, 28672)
    assert by[(2880, 128, 16)] == 2816 and by[(2880, 128, 64)] == 2944  # one chunk: the 128-row blocks of W


@pytest.mark.parametrize("gs,bias", [(True, True), (True, False), (False, True), (False, False)])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_fused_epilogue_matches_the_separate_one(gs, bias, dtype):
    """The fused epilogue (one kernel a chunk) writes the separate one's values into y's column slice, to within one
    fp32 rounding before the rounding to x's dtype, and nothing outside the slice."""
    torch.manual_seed(0)
    y = torch.randn(7, 40) * 300
    g = torch.tensor([0.37]) if gs else None
    b = torch.randn(40).to(dtype) if bias else None
    separate = y.clone()
    if g is not None:
        separate.mul_(g)
    if b is not None:
        separate.add_(b)
    out = torch.full((7, 100), 7.0, dtype=dtype)
    prefill._epilogue(y, g, b, out[:, 30:70])
    want = separate.to(dtype)
    assert (out[:, 30:70].float() - want.float()).abs().le(want.float().abs() * 2.0**-7).all()
    assert (out[:, :30] == 7).all() and (out[:, 70:] == 7).all()
    with pytest.raises(ValueError, match="^epilogue: expected one of"):
        prefill.bind(8, 64, torch.device("cpu"), dtype, torch.uint8, "nvfp4", "plain", epilogue="inplace")
