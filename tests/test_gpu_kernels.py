"""The kernels on a real GPU (marked `gpu`): contest check on every test, benchmark and odd shape, contest and
full-range data, both scale layouts, bit-exact one-hot probes, determinism, and bad-input refusal, through both call
paths (the library's TVM-FFI one on torch's stream, and the raw-pointer one of GPU MODE's runner); and the same
numbers from the TMA-fed alternative kernel (cute_kernels.gemv_tma), called directly since dispatch does not pick it."""

import pytest
import torch

from layouts.constants import SF_KINDS
from nvfp4_gemv.dispatch import Dispatcher
from nvfp4_gemv.kernel import custom_kernel as library_entry
from submission.reference import (
    check,
    check_fp32_bound,
    generate_full_range,
    generate_input,
    one_hot_probe,
    probe_expected,
    ref_kernel,
)
from nvfp4_gemv.shapes import BENCH_SHAPES, ODD_SHAPES, TEST_SHAPES

pytestmark = pytest.mark.gpu

SHAPES = list(TEST_SHAPES) + [s[:3] for s in BENCH_SHAPES] + list(ODD_SHAPES)
POINTER_ENTRY = Dispatcher("pointers")  # what the generated file uses where apache-tvm-ffi is missing


@pytest.fixture(params=["tvm_ffi", "pointers"])
def custom_kernel(request):
    return library_entry if request.param == "tvm_ffi" else POINTER_ENTRY.__call__


def _run(custom_kernel, data, sf_kind):
    c = data[-1]
    c.fill_(float("nan"))
    out = custom_kernel(data, sf_kind=sf_kind)
    torch.cuda.synchronize()
    assert out.data_ptr() == c.data_ptr()
    return out.clone()


def _ref(data):
    ref_data = list(data)
    ref_data[-1] = torch.empty_like(data[-1])
    return ref_kernel(tuple(ref_data))


@pytest.mark.parametrize("sf_kind", SF_KINDS)
@pytest.mark.parametrize("m,k,l", SHAPES)
def test_contest_data(m, k, l, sf_kind, custom_kernel):
    data = generate_input(m, k, l, seed=1000 + m + k + l, device="cuda")
    out = _run(custom_kernel, data, sf_kind)
    ref = _ref(data)
    ok, msg = check(out, ref)
    assert ok, msg
    # On contest data every fp32 partial sum is exact, so one rounding matches the reference bit for bit.
    assert torch.equal(out, ref)


@pytest.mark.parametrize("sf_kind", SF_KINDS)
def test_batches_past_the_grid_limit(sf_kind, custom_kernel):
    """L = 70003 > 65535: launches of L_CHUNK batches and one of the rest, bit-exact on contest data."""
    data = generate_input(3, 64, 70003, seed=11, device="cuda")
    out = _run(custom_kernel, data, sf_kind)
    assert torch.equal(out, _ref(data))


@pytest.mark.parametrize("sf_kind", SF_KINDS)
@pytest.mark.parametrize("m,k,l", SHAPES)
def test_full_range_data(m, k, l, sf_kind, custom_kernel):
    data = generate_full_range(m, k, l, seed=7 * m + k + l, device="cuda")
    out = _run(custom_kernel, data, sf_kind)
    ok, msg = check(out, _ref(data))
    assert ok, msg


@pytest.mark.parametrize("sf_kind", SF_KINDS)
@pytest.mark.parametrize("m,k,l", [(128, 256, 1), (129, 320, 2), (1000, 1024, 3)])
def test_one_hot_probes_bit_exact(m, k, l, sf_kind, custom_kernel):
    for col in sorted({0, 1, 15, 16, 17, 31, 32, 63, k // 2 + 1, k - 1}):
        data = one_hot_probe(m, k, l, col, seed=col, device="cuda")
        out = _run(custom_kernel, data, sf_kind)
        exp = probe_expected(data, col).to(out.device)
        assert torch.equal(out.view(torch.int16), exp.view(torch.int16)), f"col {col}"


def test_nonfinite_scales_propagate(custom_kernel):
    data = generate_full_range(256, 1024, 2, seed=3, device="cuda", nonfinite=True)
    out = _run(custom_kernel, data, "permuted")
    ok, msg = check(out, _ref(data))
    assert ok, msg
    assert torch.isnan(out).any()


@pytest.mark.parametrize("m,k,l", [(7168, 2048, 4), (127, 4096, 8)])
def test_bit_identical_across_100_runs(m, k, l, custom_kernel):
    data = generate_full_range(m, k, l, seed=11, device="cuda")
    first = _run(custom_kernel, data, "permuted")
    for _ in range(99):
        custom_kernel(data)
    torch.cuda.synchronize()
    assert torch.equal(data[-1].view(torch.int16), first.view(torch.int16))


def _tuple_with(data, index, tensor):
    data = list(data)
    data[index] = tensor
    return tuple(data)


def test_bad_input_on_first_call_names_the_tensor(custom_kernel):
    # A shape no other test uses, so this is the first call for its signature: the whole tuple is validated.
    data = generate_input(384, 320, 3, seed=0, device="cuda")
    with pytest.raises(ValueError, match="^sfa:"):
        custom_kernel(_tuple_with(data, 2, data[2].view(torch.uint8)))


@pytest.mark.parametrize(
    "index,make,name",
    [
        (4, lambda t: t.view(torch.uint8), "sfa_permuted"),  # wrong dtype of an operand the kernel reads
        (6, lambda t: t.cpu(), "c"),  # wrong device
        (0, lambda t: t[:, :64, :], "a"),  # a K that b, the scales and the strides disagree with
    ],
)
def test_bad_operand_after_a_good_call_names_the_tensor(index, make, name, custom_kernel):
    data = generate_input(128, 256, 1, seed=0, device="cuda")
    custom_kernel(data)
    with pytest.raises(ValueError, match=f"^{name}:"):
        custom_kernel(_tuple_with(data, index, make(data[index])))


def test_misaligned_operand_is_refused_after_a_good_call(custom_kernel):
    data = generate_input(128, 256, 1, seed=0, device="cuda")
    custom_kernel(data)
    a = data[0]
    raw = torch.empty(a.numel() + 8, dtype=torch.uint8, device="cuda")
    shifted = raw[8 : 8 + a.numel()].view(a.shape).view(a.dtype)
    with pytest.raises(ValueError, match="^a:"):
        custom_kernel(_tuple_with(data, 0, shifted))


# ---- the TMA-fed alternative (sm_90 only; permuted scales) ----

TMA_CONFIGS = {"default": dict(), "2 pieces, 2 stages, one CTA per unit": dict(pieces=2, stages=2, ctas=0)}


def _tma(name):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("gemv_tma is built and measured for sm_90")
    from cute_kernels import gemv_tma
    from nvfp4_gemv.bench import on_permuted, on_torch_stream

    return _direct(on_permuted(on_torch_stream(gemv_tma.GemvTma, gemv_tma.GemvTmaConfig(**TMA_CONFIGS[name]))))


def _direct(fn):
    """run(data) -> c for a compiled kernel called on the contest tuple: c filled with NaN first, read back after."""

    def run(data):
        c = data[-1]
        c.fill_(float("nan"))
        fn(data)
        torch.cuda.synchronize()
        return c.clone()

    return run


@pytest.mark.parametrize("config", TMA_CONFIGS)
@pytest.mark.parametrize("m,k,l", SHAPES)
def test_tma_kernel_contest_and_full_range(m, k, l, config):
    _contest_and_full_range(_tma(config), m, k, l, seeds=(2000 + m + k + l, 3 * m + k + l))


def _contest_and_full_range(run, m, k, l, seeds):  # noqa: E741
    """A direct kernel call: bit-exact on contest data, within the exact sum's fp32 bound on full-range data (whose
    sums cancel, so the fp32 reference's own order error can exceed the checker's 1e-3)."""
    data = generate_input(m, k, l, seed=seeds[0], device="cuda")
    assert torch.equal(run(data), _ref(data))
    data = generate_full_range(m, k, l, seed=seeds[1], device="cuda")
    ok, msg = check_fp32_bound(run(data), data)
    assert ok, msg


@pytest.mark.parametrize("config", TMA_CONFIGS)
@pytest.mark.parametrize("m,k,l", [(128, 256, 1), (129, 320, 2), (1000, 1088, 3)])
def test_tma_kernel_one_hot_probes_bit_exact(m, k, l, config):
    _probes_bit_exact(_tma(config), m, k, l)


def test_tma_kernel_bit_identical_across_runs_and_nan_scales():
    _bit_identical_with_nan_scales(_tma("default"), (7168, 2048, 4), seed=11, runs=20)


def _probes_bit_exact(run, m, k, l):  # noqa: E741
    """One-hot probes at the block edges and past K's middle: each output bit-exact (a direct kernel call)."""
    for col in sorted({0, 1, 15, 16, 17, 31, 32, 63, k // 2 + 1, k - 1}):
        data = one_hot_probe(m, k, l, col, seed=col, device="cuda")
        out = run(data)
        assert torch.equal(out.view(torch.int16), probe_expected(data, col).to(out.device).view(torch.int16)), col


def _bit_identical_with_nan_scales(run, mkl, seed, runs):
    """Full-range data with non-finite scales: within the fp32 bound, NaN where a scale is, and the same bits on
    every one of `runs` repeats."""
    data = generate_full_range(*mkl, seed=seed, device="cuda", nonfinite=True)
    first = run(data)
    ok, msg = check_fp32_bound(first, data)
    assert ok, msg
    assert torch.isnan(first).any()
    for _ in range(runs):
        assert torch.equal(run(data).view(torch.int16), first.view(torch.int16))


# The CUDA-core kernel with K split over the CTAs of a cluster (GemvSimtConfig.k_splits), called directly: every
# split dispatch can choose, and odd ones (rows_per_thread 2, plain scales, 8 CTAs of 8 warps); and the 16-warp config
# without unroll, which dispatch picks where no test shape reaches it.
SPLIT_CONFIGS = {
    "w16s2": dict(warps=16, r_lanes=2, unroll=4, k_splits=2),
    "w4s4": dict(warps=4, r_lanes=2, k_splits=4),
    "w2s8": dict(warps=2, r_lanes=2, k_splits=8),
    "w8s8": dict(warps=8, r_lanes=2, unroll=4, k_splits=8),
    "w2s2r4t2": dict(warps=2, r_lanes=4, rows_per_thread=2, k_splits=2),
    "w16u1": dict(warps=16, r_lanes=2, unroll=1),  # not a split: the 16-warp config without unroll
    "w2r1": dict(warps=2, r_lanes=1, unroll=2),  # 512-byte row pieces
    "w8r1u4": dict(warps=8, r_lanes=1, unroll=4),
    "w4r1s2": dict(warps=4, r_lanes=1, unroll=2, k_splits=2),
    "w3": dict(warps=3, r_lanes=2, unroll=2),  # dispatched where 3-warp CTAs make one wave (1057-1188 CTAs on 132 SMs)
}


def _split(name, sf_kind="permuted"):
    from cute_kernels.gemv_simt import GemvSimt, GemvSimtConfig
    from nvfp4_gemv.bench import on_torch_stream

    fn = on_torch_stream(GemvSimt, GemvSimtConfig(sf_kind=sf_kind, **SPLIT_CONFIGS[name]))
    sf = (4, 5) if sf_kind == "permuted" else (2, 3)
    return _direct(lambda d: fn(d[0], d[1], d[sf[0]], d[sf[1]], d[6]))


@pytest.mark.parametrize("config", SPLIT_CONFIGS)
@pytest.mark.parametrize("m,k,l", SHAPES)
def test_k_split_kernel_contest_and_full_range(m, k, l, config):
    _contest_and_full_range(_split(config), m, k, l, seeds=(4000 + m + k + l, 5 * m + k + l))


@pytest.mark.parametrize("config", ["w4s4", "w2s2r4t2", "w16u1", "w2r1", "w3"])
@pytest.mark.parametrize("m,k,l", list(ODD_SHAPES) + [(576, 7168, 1)])
def test_k_split_kernel_plain_scales(m, k, l, config):
    run = _split(config, "plain")
    data = generate_input(m, k, l, seed=6000 + m + k + l, device="cuda")
    assert torch.equal(run(data), _ref(data))


@pytest.mark.parametrize("config", ["w4s4", "w8s8", "w2r1"])
@pytest.mark.parametrize("m,k,l", [(128, 256, 1), (129, 320, 2), (1000, 1088, 3)])
def test_k_split_kernel_one_hot_probes_bit_exact(m, k, l, config):
    _probes_bit_exact(_split(config), m, k, l)


@pytest.mark.parametrize("config", ["w4s4", "w16u1"])
def test_k_split_kernel_bit_identical_across_runs_and_nan_scales(config):
    _bit_identical_with_nan_scales(_split(config), (576, 7168, 2), seed=12, runs=50)


@pytest.mark.parametrize("nbytes, row_chunks, pdl", [(16, 0, False), (4096, 0, False), (1 << 20, 0, False),
                                                     ((33_071_104 // 16 + 3) * 16, 0, False), (512, 32, False),
                                                     (7 * 224 * 16, 224, False), (7168 * 512 * 16, 512, False),
                                                     ((33_071_104 // 16 + 3) * 16, 0, True), (7 * 224 * 16, 224, True)])
def test_stream_read_reads_every_word(nbytes, row_chunks, pdl):
    """The roofline kernel of `nvfp4-gemv bench` (and its read a warp a row, and either launched programmatically
    dependent) must read every 16-byte chunk: a buffer of zeros with the sentinel in one word folds to the sentinel
    (and is stored) only if that word was loaded."""
    from cute_kernels import stream_read
    from nvfp4_gemv.bench import on_torch_stream

    fn = on_torch_stream(stream_read.StreamRead, stream_read.StreamReadConfig(row_chunks=row_chunks, pdl=pdl))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    buf = torch.zeros(nbytes // 4, dtype=torch.int32, device="cuda")
    out = torch.zeros(1, dtype=torch.int32, device="cuda")

    def read():
        fn(buf.view(torch.uint32), out.view(torch.uint32), sms)
        return out.item()

    assert read() == 0
    gen = torch.Generator().manual_seed(nbytes)
    words = nbytes // 4
    positions = {0, words - 1, words // 2} | set(torch.randint(0, words, (5,), generator=gen).tolist())
    for pos in sorted(positions):
        buf[pos] = stream_read.SENTINEL  # < 2**31: the same bits in int32
        out.zero_()
        assert read() == stream_read.SENTINEL, f"word {pos} of {words} was not read"
        buf[pos] = 0


# ---------------------------------------------------------------- the K-balanced schedule (GemvSimtBalanced)


def _balanced(cfg, num_ctas, pointers=False):
    """A call taking the contest tuple: GemvSimtBalanced with `cfg` on a grid of `num_ctas` CTAs (None: dispatch's
    grid), through the library's TVM-FFI path or the pointer path."""
    import functools

    from cute_kernels.compile import compile_kernel, raw_function, target
    from cute_kernels.gemv_simt import GemvSimtBalanced
    from cute_kernels.tc_workspace import SplitLauncher
    from nvfp4_gemv.dispatch import balanced_num_ctas

    tgt = target(torch.cuda.get_device_capability())
    call = "pointers" if pointers else "tvm_ffi"
    compiled = compile_kernel(GemvSimtBalanced, cfg, tgt, call=call, stream=None if pointers else "torch")
    grid = functools.partial(balanced_num_ctas, cfg) if num_ctas is None else (lambda m, k, l, sms: num_ctas)
    fn = SplitLauncher(compiled if pointers else raw_function(compiled), GemvSimtBalanced, cfg, grid,
                       pointers=pointers)

    def run(data, sf_kind="permuted"):
        a, b, sfa, sfb, sfa_p, sfb_p, c = data
        sa, sb = (sfa_p, sfb_p) if sf_kind == "permuted" else (sfa, sfb)
        fn(a, b, sa, sb, c)
        return c

    return run


def _balanced_configs():
    from nvfp4_gemv.dispatch import BALANCED_CONFIGS, balanced_config

    return [balanced_config("permuted", *c) for c in BALANCED_CONFIGS]


BALANCED_GRIDS = [None, 7, 1]  # dispatch's grid; few CTAs (long runs, tiles shared at odd places); one CTA


@pytest.mark.parametrize("num_ctas", BALANCED_GRIDS)
@pytest.mark.parametrize("cfg", _balanced_configs(), ids=lambda c: f"w{c.warps}u{c.unroll}r{c.max_registers}")
@pytest.mark.parametrize("m,k,l", SHAPES)
def test_balanced_contest_data_bit_exact(m, k, l, cfg, num_ctas):
    if num_ctas is not None and m * k * l > 2**27:
        pytest.skip("a grid of a few CTAs on a large shape: minutes of one SM")
    data = generate_input(m, k, l, seed=3000 + m + k + l, device="cuda")
    out = _run(_balanced(cfg, num_ctas), data, "permuted")
    assert torch.equal(out, _ref(data))


@pytest.mark.parametrize("sf_kind", SF_KINDS)
@pytest.mark.parametrize("pointers", [False, True], ids=["tvm_ffi", "pointers"])
@pytest.mark.parametrize("m,k,l", [(129, 320, 2), (1000, 1024, 3), (5760, 2880, 1), (6144, 4096, 1), (384, 7168, 2)])
def test_balanced_full_range(m, k, l, sf_kind, pointers):
    import dataclasses

    for cfg in _balanced_configs()[:3]:
        cfg = dataclasses.replace(cfg, sf_kind=sf_kind)
        for num_ctas in (None, 5):
            data = generate_full_range(m, k, l, seed=5 * m + k + l, device="cuda")
            out = _run(_balanced(cfg, num_ctas, pointers), data, sf_kind)
            ok, msg = check(out, _ref(data))
            assert ok, f"{cfg} num_ctas={num_ctas}: {msg}"


def test_balanced_bit_identical_across_runs_and_counters_return_to_zero():
    cfg = _balanced_configs()[1]
    run = _balanced(cfg, 37)
    data = generate_full_range(1000, 4096, 3, seed=17, device="cuda")
    first = _run(run, data, "permuted")
    for _ in range(49):
        run(data)
    torch.cuda.synchronize()
    assert torch.equal(data[-1].view(torch.int16), first.view(torch.int16))
