"""Dispatch on the CPU: which kernel each compute capability gets, and refusals that never reach a compile."""

import pytest

from cute_kernels import gemv_simt, gemv_tc_sm100
from submission.dispatch import DEFAULT_QUEUE, Dispatcher, Launchers, simt_config_for


def _recording():
    calls = []
    launchers = Launchers(simt=lambda cfg: calls.append(("simt", cfg)) or _Compiled(), tc=lambda *a: calls.append("tc"))
    return Dispatcher(launchers), calls


class _Compiled:
    def __tvm_ffi_object__(self):
        return "raw"


def test_sm90_takes_the_cuda_core_kernel_with_the_prmt_decode():
    d, calls = _recording()
    assert d.select((9, 0), 7168, 2048, 4) == "raw"
    assert calls == [("simt", simt_config_for(7168, 2048, 4, "sm_90"))]
    assert calls[0][1].arch == "sm_90"


def test_sm100_defaults_to_tensor_cores_and_offers_the_cuda_core_variant(monkeypatch):
    monkeypatch.delenv("NVFP4_GEMV_SM100", raising=False)
    d, calls = _recording()
    assert d.select((10, 0), 7168, 2048, 4) is d.launchers.tc
    assert d.select((10, 0), 7168, 2048, 4, sm100_variant="simt") == "raw"
    assert calls[-1][1].arch == "sm_100"
    monkeypatch.setenv("NVFP4_GEMV_SM100", "simt")
    assert d.select((10, 3), 128, 256, 1) == "raw"
    # The tensor-core kernel reads the permuted scales only; plain scales take the CUDA-core variant.
    monkeypatch.delenv("NVFP4_GEMV_SM100")
    assert d.select((10, 0), 128, 256, 1, sf_kind="plain") == "raw"
    with pytest.raises(ValueError, match="sm100_variant"):
        d.select((10, 0), 128, 256, 1, sm100_variant="wgmma")


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


def test_the_contest_entry_compiles_on_the_default_queue():
    assert DEFAULT_QUEUE.simt is gemv_simt.compile and DEFAULT_QUEUE.tc is gemv_tc_sm100.gemv_tc_sm100


def test_known_signature_calls_the_cached_kernel_and_names_a_refused_operand(monkeypatch):
    """The per-call path: a signature seen before goes straight to its compiled function with the operands the
    layout picks; if that function refuses them, the error is the validator's, naming the tensor."""
    from submission import dispatch
    from submission.reference import generate_input

    d = generate_input(128, 256, 1, seed=0, device="cpu")
    a, b, sfa, sfb, sfa_p, sfb_p, c = d
    disp = Dispatcher(DEFAULT_QUEUE)
    seen = []
    disp.kernels[(a.shape, sfa_p.shape, "permuted")] = lambda *ops: seen.append(("permuted", ops))
    disp.kernels[(a.shape, sfa.shape, "plain")] = lambda *ops: seen.append(("plain", ops))
    assert disp(d) is c and disp(d, sf_kind="plain") is c
    assert [kind for kind, _ in seen] == ["permuted", "plain"] and all(len(ops) == 5 for _, ops in seen)
    assert all(x is y for x, y in zip(seen[0][1], (a, b, sfa_p, sfb_p, c)))
    assert all(x is y for x, y in zip(seen[1][1], (a, b, sfa, sfb, c)))

    def refuse(*ops):
        raise RuntimeError("argument check failed")

    disp.kernels[(a.shape, sfa_p.shape, "permuted")] = refuse
    with pytest.raises(ValueError, match=r"^a: expected a CUDA device"):
        disp(d)
    # Operands the validator accepts: the kernel's own error is not swallowed.
    monkeypatch.setattr(dispatch, "validate_inputs", lambda data, require_cuda: (128, 256, 1))
    with pytest.raises(RuntimeError, match="argument check failed"):
        disp(d)
