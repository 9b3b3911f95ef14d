"""Dispatch on the CPU: which kernel and target each compute capability gets, on which call path and stream, and
refusals that never reach a compile."""

import pytest

from cute_kernels import gemv_simt, gemv_tc_sm100
from cute_kernels.compile import Target
from cute_kernels.tc_workspace import TcLauncher
from nvfp4_gemv.dispatch import L_CHUNK, BatchChunks, Dispatcher, simt_config_for


class _Compiled:
    def __tvm_ffi_object__(self):
        return "raw"


def _recording(call="tvm_ffi", stream=None):
    calls = []

    def compile(kernel_cls, config, target, call, stream):
        calls.append((kernel_cls, config, target, call, stream))
        return _Compiled()

    return Dispatcher(call, stream, compile=compile), calls


def test_sm90_takes_the_cuda_core_kernel_with_the_prmt_decode():
    d, calls = _recording()
    assert d.select((9, 0), 7168, 2048, 4) == "raw"
    assert calls == [(gemv_simt.GemvSimt, simt_config_for(7168, 2048, 4), Target("sm_90a"), "tvm_ffi", None)]
    assert calls[0][2].family == "sm_90"


def test_sm100_defaults_to_tensor_cores_and_offers_the_cuda_core_variant(monkeypatch):
    monkeypatch.delenv("NVFP4_GEMV_SM100", raising=False)
    d, calls = _recording(stream="torch")
    tc = d.select((10, 0), 7168, 2048, 4)
    assert isinstance(tc, TcLauncher) and tc.fn == "raw" and not tc.pointers
    assert calls[-1][:4] == (gemv_tc_sm100.GemvTcSm100, gemv_tc_sm100.GemvTcSm100Config(), Target("sm_100a"), "tvm_ffi")
    assert calls[-1][4] == "torch"
    assert d.select((10, 0), 7168, 2048, 4, sm100_variant="simt") == "raw"
    assert calls[-1][0] is gemv_simt.GemvSimt and calls[-1][2].family == "sm_100"
    monkeypatch.setenv("NVFP4_GEMV_SM100", "simt")
    assert d.select((10, 0), 128, 256, 1) == "raw"
    # The tensor-core kernel reads the permuted scales only; plain scales take the CUDA-core variant.
    monkeypatch.delenv("NVFP4_GEMV_SM100")
    assert d.select((10, 0), 128, 256, 1, sf_kind="plain") == "raw"
    assert calls[-1][1].sf_kind == "plain"
    with pytest.raises(ValueError, match="sm100_variant"):
        d.select((10, 0), 128, 256, 1, sm100_variant="wgmma")


@pytest.mark.parametrize(
    "mkl, sms, expected",
    [
        ((7168, 16384, 1), 132, (4, 2, 2, 1)),  # 896 CTAs: 4 warps each are the most in one resident wave
        ((4096, 7168, 8), 132, (4, 2, 2, 1)),  # 3.9 waves; 2- and 4-warp CTAs tie (1.060, 1.059 x the read, contest)
        ((7168, 2048, 4), 132, (1, 2, 2, 1)),  # 3584 CTAs of 1 warp: 0.97 of a wave (2 warps: 1.7 waves)
        ((7168, 2048, 8), 132, (1, 2, 2, 1)),  # 1.94 waves, the last one full
        ((28672, 4096, 1), 132, (1, 2, 2, 1)),  # 3584 CTAs: as 7168 x 2048 x 4
        ((1536, 2048, 8), 132, (4, 2, 2, 1)),  # the model's worst suite pick: 1.11 x the read, 2 warps 1.07
        ((9216, 4096, 1), 132, (3, 2, 2, 1)),  # 1152 CTAs: 3 warps (27 an SM at 72 registers) fit one wave, 4 do not
        ((10240, 8192, 1), 132, (2, 2, 2, 1)),  # 1280 CTAs: 3 warps would make 1.08 waves
        ((4096, 2048, 1), 132, (4, 2, 2, 1)),  # 64 K pieces: an 8-warp CTA's last 4 warps would have none
        ((3584, 3584, 1), 132, (8, 2, 4, 1)),  # 112 pieces: 7 of 8 warps busy, still the most busy warps
        ((4096, 7168, 1), 132, (8, 2, 4, 1)),  # 512 CTAs: K split over 8 warps a CTA
        ((576, 7168, 1), 132, (16, 2, 2, 1)),  # 80 CTAs, no more than SMs: the most warps a CTA takes
        ((4096, 7168, 1), 66, (4, 2, 2, 1)),  # half the SMs hold half the warps
        ((1536, 7168, 1), 132, (16, 2, 1, 1)),  # 192 CTAs: 16 warps without unroll (56 registers), two an SM
        ((576, 7168, 2), 132, (16, 2, 1, 1)),  # 160 CTAs: likewise
        ((2304, 7168, 1), 132, (8, 2, 2, 1)),  # 288 CTAs: more than two an SM, 8-warp CTAs
        ((768, 2048, 1), 132, (8, 2, 2, 1)),  # 4 K steps: 16 warps would leave 12 idle
        ((256, 16384, 1), 132, (16, 2, 2, 1)),  # 32 CTAs, 32 K steps: too little K for a split to pay
        ((256, 28672, 1), 132, (8, 2, 2, 8)),  # 56 steps: K over a cluster of 8, 7 steps a CTA
        ((384, 28672, 1), 132, (8, 2, 2, 8)),  # 48 CTAs, 56 steps: still split
        ((1024, 28672, 1), 132, (16, 2, 2, 1)),  # 128 CTAs: most SMs have a CTA, no split
        ((512, 16384, 1), 132, (16, 2, 2, 1)),  # 64 CTAs: likewise
        ((1, 64, 1), 132, (8, 2, 2, 1)),
    ],
)
def test_config_model_fills_the_gpu_with_warps(mkl, sms, expected):
    from nvfp4_gemv.dispatch import WARPS_PER_SM, simt_config_for, simt_configs

    cfg = simt_config_for(*mkl, sms=sms)
    assert (cfg.warps, cfg.r_lanes, cfg.unroll, cfg.k_splits) == expected and cfg in simt_configs()
    m, k, l = mkl
    ctas = -(-m // 128) * cfg.ctas_per_slab * l
    warps = cfg.warps * cfg.k_splits
    # Enough warps, or the most that make sense: twice as many would leave some without a K piece of 32 elements.
    assert ctas * warps >= WARPS_PER_SM * sms or warps >= 8 or 2 * warps * cfg.c_lanes * 32 > k


@pytest.mark.parametrize("sf_kind", ["permuted", "plain"])
def test_every_shape_and_gpu_size_gets_a_config_the_compile_checks_build(sf_kind):
    """Over a grid of shapes (M 1 to 65536, K 64 to 65536, L 1 to 16) and SM counts of real parts, the model only
    returns configs in simt_configs() (what the CPU and runner-stack compile checks build), every unsplit one of them
    is returned somewhere, and a split cluster never holds more CTAs than K has steps to share. (A cluster of 2 is
    listed for both scale layouts; with permuted scales, whose split configs take fewer registers, the model always
    has room for 4 instead.)"""
    from nvfp4_gemv.dispatch import simt_config_for, simt_configs

    allowed = set(simt_configs(sf_kind))
    seen = set()
    for sms in (66, 78, 108, 114, 132, 148):
        for m in (1, 127, 128, 129, 256, 384, 576, 1024, 1536, 2304, 4096, 7168, 28672, 65536):
            for k in (64, 192, 1024, 2048, 2880, 4096, 7168, 16384, 28672, 65536):
                for l in (1, 2, 8, 16):  # noqa: E741
                    cfg = simt_config_for(m, k, l, sf_kind=sf_kind, sms=sms)
                    assert cfg in allowed, (m, k, l, sms, cfg)
                    assert cfg.k_splits <= max(1, k // 512), (m, k, l, sms, cfg)
                    seen.add(cfg)
    assert {c for c in allowed if c.k_splits == 1} <= seen and any(c.k_splits > 1 for c in seen)


def test_pointer_path_wraps_the_compiled_function():
    d, calls = _recording(call="pointers")
    run = d.select((9, 0), 128, 256, 1)
    assert callable(run) and run != "raw" and calls[-1][3] == "pointers"
    tc = d.select((10, 0), 128, 256, 1)
    assert isinstance(tc, TcLauncher) and tc.pointers and isinstance(tc.fn, _Compiled)


@pytest.mark.parametrize("cap", [(10, 3), (10, 1), (11, 0)])
def test_blackwell_parts_without_an_sm100a_build_are_refused(cap):
    """sm_100a code does not load on compute capability 10.3 (B300) and others: refused, not dispatched."""
    d, calls = _recording()
    with pytest.raises(RuntimeError, match=rf"this device is {cap[0]}\.{cap[1]}"):
        d.select(cap, 128, 256, 1, sm100_variant="simt")
    assert calls == []


@pytest.mark.parametrize("cap", [(8, 0), (8, 9), (12, 0)])
def test_other_devices_are_refused_clearly(cap):
    d, calls = _recording()
    with pytest.raises(RuntimeError, match="compute capability 9.0"):
        d.select(cap, 128, 256, 1)
    assert calls == []


def test_shapes_past_int32_indexing_are_refused_before_compiling():
    d, calls = _recording()
    # 16384 × 2^17 / 8 × 1 = 2^28 words is fine; × 8 batches = 2^31 is one past the int32 range.
    assert gemv_simt.GemvSimt.can_implement(16384, 1 << 17, 1)
    assert not gemv_simt.GemvSimt.can_implement(16384, 1 << 17, 8)
    assert not gemv_simt.GemvSimt.can_implement(1, 1 << 17, 1 << 17)  # b's 128 padded rows count
    with pytest.raises(ValueError, match=r"^a: \(M, K, L\) = \(16384, 131072, 8\)"):
        d.select((9, 0), 16384, 1 << 17, 8)
    assert calls == []
    assert gemv_tc_sm100.GemvTcSm100.can_implement(16384, 1 << 17, 8)


def test_the_contest_entry_uses_the_default_stream_and_the_available_call_path():
    from cute_kernels.compile import has_tvm_ffi
    from submission import contest

    assert contest.DISPATCH.call == ("tvm_ffi" if has_tvm_ffi() else "pointers")
    assert contest.DISPATCH.compile.keywords == {"call": contest.DISPATCH.call, "stream": None}


def test_the_library_entry_follows_torchs_current_stream():
    from nvfp4_gemv import kernel

    assert kernel.DISPATCH.compile.keywords == {"call": "tvm_ffi", "stream": "torch"}


@pytest.mark.parametrize("data", [None, (), (1, 2, 3), [object()] * 7, tuple(range(6)), tuple(range(8))],
                         ids=["None", "empty", "3-tuple", "7-non-tensors", "6-tuple", "8-tuple"])
@pytest.mark.parametrize("entry", ["submission.contest", "nvfp4_gemv.kernel"])
def test_malformed_tuples_get_the_validators_error(data, entry):
    import importlib

    custom_kernel = importlib.import_module(entry).custom_kernel
    with pytest.raises(ValueError, match=r"^(data: expected a tuple of 7 tensors|a: expected a torch.Tensor)"):
        custom_kernel(data)


def test_known_signature_calls_the_cached_kernel_and_names_a_refused_operand(monkeypatch):
    """The per-call path: a signature seen before goes straight to its compiled function with the operands the
    layout picks; if that function refuses them, the error is the validator's, naming the tensor."""
    from nvfp4_gemv import dispatch
    from submission.reference import generate_input

    d = generate_input(128, 256, 1, seed=0, device="cpu")
    a, b, sfa, sfb, sfa_p, sfb_p, c = d
    disp = Dispatcher()
    seen = []
    disp.kernels[disp.key(a, b, sfa_p, sfb_p, c, "permuted")] = lambda *ops: seen.append(("permuted", ops))
    disp.kernels[disp.key(a, b, sfa, sfb, c, "plain")] = lambda *ops: seen.append(("plain", ops))
    assert disp(d) is c and disp(d, sf_kind="plain") is c
    assert [kind for kind, _ in seen] == ["permuted", "plain"] and all(len(ops) == 5 for _, ops in seen)
    assert all(x is y for x, y in zip(seen[0][1], (a, b, sfa_p, sfb_p, c)))
    assert all(x is y for x, y in zip(seen[1][1], (a, b, sfa, sfb, c)))

    def refuse(*ops):
        raise RuntimeError("argument check failed")

    disp.kernels[disp.key(a, b, sfa_p, sfb_p, c, "permuted")] = refuse
    with pytest.raises(ValueError, match=r"^a: expected a CUDA device"):
        disp(d)
    # Operands the validator accepts: the kernel's own error is not swallowed.
    monkeypatch.setattr(dispatch, "validate_inputs", lambda data, require_cuda: (128, 256, 1))
    with pytest.raises(RuntimeError, match="argument check failed"):
        disp(d)


# ---------------------------------------------------------------- the first-contact guard on Blackwell (CPU)


def _guarded(monkeypatch, behaviours):
    """A Dispatcher on a pretend compute capability 10.0 whose variants are the given stub launchers."""
    from nvfp4_gemv import dispatch, validate

    monkeypatch.setattr(dispatch, "validate_inputs", lambda data, require_cuda: validate.validate_inputs(data))
    monkeypatch.delenv("NVFP4_GEMV_SM100", raising=False)
    disp = Dispatcher()
    monkeypatch.setattr(disp, "capability", lambda device: (10, 0))
    picked = []

    def select(cap, m, k, l, sf_kind="permuted", sm100_variant=None):  # noqa: E741
        picked.append(sm100_variant)
        return behaviours[sm100_variant]

    monkeypatch.setattr(disp, "select", select)
    return disp, picked


def _right(a, b, sa, sb, c):
    """A correct launcher: the reference of the tuple under test (`_last_data`)."""
    from submission.reference import ref_kernel

    c.copy_(ref_kernel(_last_data[0][:6] + (c.clone(),)))


def _wrong(a, b, sa, sb, c):
    c.zero_()


def _broken(a, b, sa, sb, c):
    raise RuntimeError("illegal instruction")


_last_data = []


def test_first_contact_keeps_the_first_variant_that_matches_and_says_so_once(monkeypatch, capsys):
    from submission.reference import generate_full_range

    data = generate_full_range(256, 512, 2, seed=4)
    _last_data[:] = [data]
    disp, picked = _guarded(monkeypatch, {"tc": _wrong, "tc128": _broken, "simt": _right})
    out = disp(data)
    assert picked == ["tc", "tc128", "simt"] and out is data[-1]
    from submission.reference import check, ref_kernel

    assert check(out, ref_kernel(data[:6] + (out.clone(),)))[0]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'tc' failed" in err[0] and "'tc128' failed" in err[0] and "using 'simt'" in err[0]
    disp(data)  # the kept launcher, no second check
    assert picked == ["tc", "tc128", "simt"] and capsys.readouterr().err == ""


def test_first_contact_is_silent_when_the_default_matches(monkeypatch, capsys):
    from submission.reference import generate_input

    data = generate_input(128, 256, 1, seed=1)
    _last_data[:] = [data]
    disp, picked = _guarded(monkeypatch, {"tc": _right, "tc128": _wrong, "simt": _wrong})
    disp(data)
    assert picked == ["tc"] and capsys.readouterr().err == ""


def test_first_contact_refuses_when_no_variant_matches(monkeypatch):
    from submission.reference import generate_input

    data = generate_input(128, 256, 1, seed=2)
    disp, picked = _guarded(monkeypatch, {"tc": _wrong, "tc128": _wrong, "simt": _broken})
    with pytest.raises(RuntimeError, match="no Blackwell variant matched"):
        disp(data)
    assert picked == ["tc", "tc128", "simt"] and not disp.kernels


def test_first_contact_starts_from_the_chosen_variant(monkeypatch):
    from submission.reference import generate_input

    data = generate_input(128, 256, 1, seed=3)
    _last_data[:] = [data]
    disp, picked = _guarded(monkeypatch, {"tc": _wrong, "tc128": _wrong, "simt": _right})
    monkeypatch.setenv("NVFP4_GEMV_SM100", "simt")
    disp(data)
    assert picked == ["simt"]


def test_batches_past_the_grid_limit_go_in_chunks_of_aligned_views():
    """L > 65535 (the grid's y) runs as launches of L_CHUNK batches and one of the rest, each compiled for its own L,
    on views that keep the operands' strides and start 16-byte aligned."""
    import torch

    d, calls = _recording()
    n = 2 * L_CHUNK + 5
    fn = d.select((9, 0), 3, 64, n)
    assert isinstance(fn, BatchChunks) and fn.full == "raw" and fn.rest == "raw"
    assert [c[1] for c in calls] == [simt_config_for(3, 64, L_CHUNK), simt_config_for(3, 64, 5)]
    assert d.select((9, 0), 3, 64, L_CHUNK) == "raw" and L_CHUNK % 8 == 0 and L_CHUNK <= 65535
    got = []
    chunks = BatchChunks(lambda *t: got.append(("full", t)), lambda *t: got.append(("rest", t)))
    m, kb, kc = 3, 32, 4
    ops = (torch.empty(m * kb * n, dtype=torch.uint8).as_strided((m, kb, n), (kb, 1, m * kb)),
           torch.empty(128 * kb * n, dtype=torch.uint8).as_strided((128, kb, n), (kb, 1, 128 * kb)),
           torch.empty(512 * n, dtype=torch.uint8).as_strided((32, 4, 1, 4, 1, n), (16, 4, 512, 1, 512, 512)),
           torch.empty(512 * n, dtype=torch.uint8).as_strided((32, 4, 1, 4, 1, n), (16, 4, 512, 1, 512, 512)),
           torch.empty(m * n, dtype=torch.float16).as_strided((m, 1, n), (1, 1, m)))
    chunks(*ops)
    assert [(which, t[0].shape[-1]) for which, t in got] == [("full", L_CHUNK), ("full", L_CHUNK), ("rest", 5)]
    for i, (_, views) in enumerate(got):
        for whole, view in zip(ops, views):
            assert view.stride() == whole.stride() and view.shape[:-1] == whole.shape[:-1]
            offset = view.data_ptr() - whole.data_ptr()
            assert offset == i * L_CHUNK * whole.stride()[-1] * whole.element_size() and offset % 16 == 0
