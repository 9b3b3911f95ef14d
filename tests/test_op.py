"""Tests of the `nvfp4_gemv::gemv` custom op: its fake implementation and validation (CPU), torch.compile with
fullgraph=True and Inductor's in-place call (CPU, through the reference kernel), and on a GPU the op under
torch.compile and CUDA-graph capture against custom_kernel, bit for bit."""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from nvfp4_gemv import op
from submission.reference import generate_full_range, generate_input, ref_kernel
from nvfp4_gemv.shapes import TEST_SHAPES

SHAPE = (129, 320, 2)  # ragged M, K a multiple of 64 only, L > 1


def operands(data):
    a, b, _, _, sfa_p, sfb_p, c = data
    return a, b, sfa_p, sfb_p, c


def reference(data):
    d = list(data)
    d[-1] = torch.empty_like(data[-1])
    return ref_kernel(tuple(d))


def bits(t):
    return t.view(torch.int16)


@pytest.fixture
def data():
    return generate_full_range(*SHAPE, seed=5)


# ---------------------------------------------------------------- fake implementation and validation (CPU)


def test_fake_accepts_contest_operands_and_leaves_c_to_the_caller(data):
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in operands(data)]
        assert torch.ops.nvfp4_gemv.gemv(*fake) is None
        assert op.validate_operands(*fake, check_pointers=False) == SHAPE


def _bad(data, name, t):
    ops = list(operands(data))
    ops[op.OPERANDS.index(name)] = t
    return ops


@pytest.mark.parametrize(
    "name,make,match",
    [
        ("c", lambda d: d[6][:128], r"c: expected shape \(129, 1, 2\)"),
        ("c", lambda d: d[6].float(), "c: expected dtype torch.float16"),
        ("c", lambda d: torch.zeros(129, 1, 2, dtype=torch.float16), r"c: expected strides \(1, 1, 129\)"),
        ("sfa_permuted", lambda d: d[2], r"sfa_permuted: expected shape \(32, 4, 2, 4, 5, 2\)"),
        ("sfb_permuted", lambda d: d[4].view(torch.uint8), "sfb_permuted: expected dtype torch.float8_e4m3fn"),
        ("a", lambda d: d[0][:, :80], "a: shape .* K must be a multiple of 64"),
        ("b", lambda d: d[1].view(torch.uint8).contiguous().view(d[1].dtype), r"b: expected strides \(160, 1, 20480\)"),
    ],
)
def test_fake_refuses_what_the_kernel_would_misread(data, name, make, match):
    bad = _bad(data, name, make(data))
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in bad]
        with pytest.raises(ValueError, match=match):
            torch.ops.nvfp4_gemv.gemv(*fake)
    with pytest.raises(ValueError, match=match):  # the same message eagerly
        op.nvfp4_gemv(*bad)


@pytest.mark.parametrize("index", range(5))
@pytest.mark.parametrize("bad", [None, 3, "a"], ids=["None", "int", "str"])
def test_non_tensor_arguments_get_a_value_error_naming_them(data, index, bad):
    args = list(operands(data))
    args[index] = bad
    with pytest.raises(ValueError, match=rf"^{op.OPERANDS[index]}: expected a torch.Tensor"):
        op.nvfp4_gemv(*args)


def test_under_torch_compile_bad_input_is_dynamos_error_holding_the_value_error(data):
    """What the op's docstring promises: Dynamo wraps the fake implementation's ValueError."""
    a, b, sfa_p, sfb_p, c = operands(data)
    torch._dynamo.reset()
    fn = torch.compile(op.nvfp4_gemv, fullgraph=True, backend="aot_eager")
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=r"ValueError\('c: expected dtype torch.float16"):
        fn(a, b, sfa_p, sfb_p, c.float())


def test_misaligned_operand_is_refused_even_with_a_cached_signature(data):
    good = operands(data)
    op.nvfp4_gemv(*good)  # caches this signature
    a = good[0]
    buf = torch.empty(a.numel() + 16, dtype=torch.uint8)
    shifted = buf[1 : 1 + a.numel()].view(torch.float4_e2m1fn_x2).as_strided(a.shape, a.stride())
    with pytest.raises(ValueError, match="a: expected a 16-byte aligned data pointer"):
        op.nvfp4_gemv(shifted, *good[1:])


def test_opcheck_fake_autograd_and_aot_dispatch(data):
    # test_schema is left out: its mutation check calls allclose, which torch has no kernel for on fp4.
    result = torch.library.opcheck(
        torch.ops.nvfp4_gemv.gemv.default,
        tuple(t.clone() for t in operands(data)),
        test_utils=("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"),
    )
    assert set(result.values()) == {"SUCCESS"}, result


# ---------------------------------------------------------------- eager and compiled on the CPU (reference kernel)


def test_eager_cpu_fills_c_in_place_bit_exact(data):
    c = data[-1]
    c.fill_(float("nan"))
    out = op.nvfp4_gemv(*operands(data))
    assert out is c
    assert torch.equal(bits(out), bits(reference(data)))


@pytest.mark.parametrize("m,k,l", [SHAPE, (128, 256, 1)])
def test_compile_fullgraph_aot_eager_bit_exact(m, k, l):
    data = generate_full_range(m, k, l, seed=m + k)
    torch._dynamo.reset()
    fn = torch.compile(op.nvfp4_gemv, fullgraph=True, backend="aot_eager")
    c = data[-1]
    c.fill_(float("nan"))
    out = fn(*operands(data))
    assert out.data_ptr() == c.data_ptr()
    assert torch.equal(bits(c), bits(reference(data)))


@pytest.mark.slow
def test_inductor_calls_the_op_in_place_on_c():
    from torch._inductor.utils import run_and_get_code

    data = generate_input(128, 256, 1, seed=3)
    torch._dynamo.reset()
    fn = torch.compile(op.nvfp4_gemv, fullgraph=True)
    out, (code, *_) = run_and_get_code(fn, *operands(data))
    calls = [ln.strip() for ln in code.splitlines() if "torch.ops.nvfp4_gemv.gemv" in ln]
    # auto_functionalized was re-inplaced: one call writing the graph input c, no copy of c.
    assert calls == ["torch.ops.nvfp4_gemv.gemv.default(arg0_1, arg1_1, arg2_1, arg3_1, arg4_1)"], calls
    body = code[code.index("def call(") : code.index("return (arg4_1, )")]
    assert "copy_" not in body and "empty_strided" not in body and "alloc" not in body  # nothing allocated, no copy
    assert torch.equal(bits(data[-1]), bits(reference(data)))


# ---------------------------------------------------------------- on a GPU, against custom_kernel


def _cuda_pair(m, k, l, seed):
    """The same contest data twice on the GPU: one for custom_kernel, one for the op."""
    return generate_input(m, k, l, seed=seed, device="cuda"), generate_input(m, k, l, seed=seed, device="cuda")


def _custom_kernel_out(data):
    from nvfp4_gemv.kernel import custom_kernel

    out = custom_kernel(data).clone()
    torch.cuda.synchronize()
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,l", TEST_SHAPES)
def test_gpu_eager_matches_custom_kernel(m, k, l):
    ref_data, data = _cuda_pair(m, k, l, seed=m + l)
    expected = _custom_kernel_out(ref_data)
    data[-1].fill_(float("nan"))
    out = op.nvfp4_gemv(*operands(data))
    torch.cuda.synchronize()
    assert out is data[-1]
    assert torch.equal(bits(out), bits(expected))


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,l", [(128, 256, 1), (2432, 4608, 2), (4096, 7168, 8)])
def test_gpu_compile_fullgraph_matches_custom_kernel(m, k, l):
    ref_data, data = _cuda_pair(m, k, l, seed=k)
    expected = _custom_kernel_out(ref_data)
    torch._dynamo.reset()
    fn = torch.compile(op.nvfp4_gemv, fullgraph=True)
    data[-1].fill_(float("nan"))
    out = fn(*operands(data))
    torch.cuda.synchronize()
    assert out.data_ptr() == data[-1].data_ptr()
    assert torch.equal(bits(out), bits(expected))


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["eager", "op"])
def test_gpu_cuda_graph_replay_matches_custom_kernel(path):
    m, k, l = 512, 4096, 2
    data = generate_input(m, k, l, seed=1, device="cuda")
    call = op.nvfp4_gemv if path == "eager" else torch.ops.nvfp4_gemv.gemv
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile, validate) off the capture
        call(*operands(data))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(*operands(data))
    for seed in (2, 3):
        new = generate_input(m, k, l, seed=seed, device="cuda")
        for dst, src in zip(data[:-1], new[:-1]):
            dst.copy_(src)  # same buffers, new values
        data[-1].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(bits(data[-1]), bits(_custom_kernel_out(new)))
