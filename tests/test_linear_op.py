"""The fp4 linear's op, eager path and module: numbers against the reference, torch.compile and opcheck, bad input.

The CUDA kernel's eager path (`EagerLinear`) runs here on CPU tensors with a stand-in launcher that records what it
was handed, so its caching, copies and pointer checks are tested without a GPU. Tests marked `gpu` run the kernels.
"""

import math
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch

from nvfp4_gemv.linear import (
    FP4Linear,
    dequantize,
    fp4_linear,
    linear_reference,
    quantize_mxfp4,
    quantize_nvfp4,
    validate_linear,
)
from nvfp4_gemv.linear.op import EagerLinear
from test_linear_reference import np_dequantize, swizzle, u8

LAYOUTS = [("nvfp4", "plain"), ("nvfp4", "swizzled"), ("mxfp4", "plain")]


def operands(fmt="nvfp4", scale_layout="plain", n=130, k=128, lead=(3,), dtype=torch.bfloat16, bias=True,
             global_scale=0.8125, seed=0):
    """Keyword arguments of fp4_linear: random codes, moderate scales, and the plain scales (for numpy)."""
    torch.manual_seed(seed)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    if fmt == "nvfp4":
        plain = torch.randint(0x20, 0x48, (n, k // 16), dtype=torch.uint8).view(torch.float8_e4m3fn)
        scale = swizzle(plain) if scale_layout == "swizzled" else plain
    else:
        plain = scale = torch.randint(118, 132, (n, k // 32), dtype=torch.uint8)
        global_scale = None
    args = dict(x=torch.randn(*lead, k).to(dtype), weight=w, weight_scale=scale, fmt=fmt,
                global_scale=global_scale, bias=torch.randn(n).to(dtype) if bias else None, scale_layout=scale_layout)
    return args, plain


def op_args(a):
    g = a["global_scale"]
    if g is not None and not isinstance(g, torch.Tensor):
        g = torch.tensor([g], dtype=torch.float32, device=a["weight"].device)
    return (a["x"], a["weight"], a["weight_scale"], a["fmt"], a["scale_layout"], g, a["bias"])


def assert_close_to_numpy(y, a, plain):
    n, k = a["weight"].shape[0], a["x"].shape[-1]
    wd = np_dequantize(u8(a["weight"]), u8(plain), a["fmt"], "plain", float(a["global_scale"] or 1.0))
    x64 = a["x"].double().reshape(-1, k).numpy()
    y64 = x64 @ wd.T + (a["bias"].double().numpy() if a["bias"] is not None else 0)
    ulp = 2.0 ** -(8 if a["x"].dtype == torch.bfloat16 else 11)
    bound = 1e-6 * (np.abs(x64) @ np.abs(wd).T) + ulp * np.abs(y64) + 1e-30
    assert (np.abs(y.double().reshape(-1, n).numpy() - y64) <= bound).all()


# ---------------------------------------------------------------- eager CPU, the op, torch.compile


@pytest.mark.parametrize("fmt,scale_layout", LAYOUTS)
@pytest.mark.parametrize("lead", [(1,), (2, 3), (16,)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_eager_and_op_match_reference(fmt, scale_layout, lead, dtype):
    a, plain = operands(fmt, scale_layout, lead=lead, dtype=dtype)
    y = fp4_linear(**a)
    assert y.shape == (*lead, 130) and y.dtype == dtype
    assert torch.equal(y, linear_reference(**a))
    assert torch.equal(torch.ops.nvfp4_gemv.fp4_linear(*op_args(a)), y)
    assert_close_to_numpy(y, a, plain)


def test_global_scale_float_and_tensor_agree():
    a, _ = operands()
    y = fp4_linear(**a)
    for g in (torch.tensor(0.8125), torch.tensor([0.8125])):
        assert torch.equal(fp4_linear(**{**a, "global_scale": g}), y)
    assert not torch.equal(fp4_linear(**{**a, "global_scale": 0.5}), y)


@pytest.mark.parametrize("lead", [(0,), (2, 0)])
def test_empty_x(lead):
    a, _ = operands(lead=lead)
    for y in (fp4_linear(**a), torch.ops.nvfp4_gemv.fp4_linear(*op_args(a))):
        assert y.shape == (*lead, 130) and y.dtype == torch.bfloat16


@pytest.mark.parametrize("fmt,scale_layout", LAYOUTS)
@pytest.mark.parametrize("bias", [True, False])
def test_opcheck(fmt, scale_layout, bias):
    # opcheck's test_schema compares the inputs before and after with torch.allclose, which has no CPU kernel for
    # float8_e4m3fn; NVFP4's e4m3 scales skip that one check (MXFP4's uint8 scales run every check).
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    for lead, grad in (((2, 3), False), ((0,), False), ((2, 3), True)):  # with grad: the autograd formula too
        a, _ = operands(fmt, scale_layout, n=33, k=64, lead=lead, bias=bias)
        a["x"].requires_grad_(grad)
        kw = {} if fmt == "mxfp4" else {"test_utils": utils}
        torch.library.opcheck(torch.ops.nvfp4_gemv.fp4_linear.default, op_args(a), **kw)


def _grads(y, x, bias, dy):
    return torch.autograd.grad(y, (x, bias), dy)


@pytest.mark.parametrize("fmt,scale_layout", LAYOUTS)
@pytest.mark.parametrize("chunk_bytes", [None, 4 * 128 * 128])
def test_op_backward(fmt, scale_layout, chunk_bytes, monkeypatch):
    """The op's autograd formula: dx = dy · dequant(W) with fp32 sums, one rounding (W in row chunks, here one chunk
    or 128-row chunks with a short last one), and dbias = dy summed; against the float64 decode."""
    from nvfp4_gemv.linear import op as op_module

    if chunk_bytes:
        monkeypatch.setattr(op_module, "GRAD_CHUNK_BYTES", chunk_bytes)
    a, plain = operands(fmt, scale_layout, n=300, k=128, lead=(2, 3))
    x, bias = a["x"].requires_grad_(), a["bias"].requires_grad_()
    dy = torch.randn(2, 3, 300).to(torch.bfloat16)
    dx, db = _grads(torch.ops.nvfp4_gemv.fp4_linear(*op_args(a)), x, bias, dy)
    wd = np_dequantize(u8(a["weight"]), u8(plain), fmt, "plain", float(a["global_scale"] or 1.0))
    dx64 = dy.double().reshape(-1, 300).numpy() @ wd
    bound = 1e-6 * (np.abs(dy.double().reshape(-1, 300).numpy()) @ np.abs(wd)) + 2.0**-8 * np.abs(dx64)
    assert dx.shape == x.shape and dx.dtype == x.dtype and db.dtype == bias.dtype
    assert (np.abs(dx.double().reshape(-1, 128).numpy() - dx64) <= bound).all()
    assert torch.allclose(db.float(), dy.float().sum((0, 1)), rtol=2**-8, atol=0)
    # The same as autograd through the reference (dx in fp32 then rounded once), to an fp32 summation order.
    rx, rb = _grads(linear_reference(**a), x, bias, dy)
    assert torch.allclose(dx.float(), rx.float(), rtol=2**-7, atol=1e-5) and torch.equal(db, rb)


def test_backward_under_compile_and_the_module():
    a, _ = operands(n=64, k=128, lead=(4,))
    w, s = a["weight"], a["weight_scale"]
    x = a["x"].requires_grad_()
    g = torch.tensor(0.8125, requires_grad=True)  # a tensor global scale that is trained gets its gradient too
    torch._dynamo.reset()
    f = torch.compile(lambda x, g: fp4_linear(x * 2, w, s, "nvfp4", g), fullgraph=True, backend="aot_eager")
    dx, dg = torch.autograd.grad(f(x, g).float().sum(), (x, g))
    rx, rg = torch.autograd.grad(linear_reference(x * 2, w, s, "nvfp4", g).float().sum(), (x, g))
    assert torch.allclose(dx.float(), rx.float(), rtol=2**-7, atol=1e-5) and torch.allclose(dg, rg, rtol=1e-4)
    dx, dg = torch.autograd.grad(torch.ops.nvfp4_gemv.fp4_linear(x, w, s, "nvfp4", "plain", g.reshape(1), None)
                                 .float().square().sum(), (x, g))
    rx, rg = torch.autograd.grad(linear_reference(x, w, s, "nvfp4", g).float().square().sum(), (x, g))
    assert torch.allclose(dx.float(), rx.float(), rtol=2**-6, atol=1e-4) and torch.allclose(dg, rg, rtol=1e-3)
    # A trained adapter beside a frozen fp4 layer, compiled (so the op's formula runs): gradients reach the adapter
    # and x, the same as through the reference on the CPU.
    layer = FP4Linear.from_linear(torch.nn.Linear(128, 64).to(torch.bfloat16))
    adapter = torch.nn.Linear(128, 64, bias=False).to(torch.bfloat16)
    step = torch.compile(lambda x: (layer(x) + adapter(x)).float().square().mean(), fullgraph=True,
                         backend="aot_eager")
    da, dx = torch.autograd.grad(step(x), (adapter.weight, x))
    ra, rx = torch.autograd.grad((layer(x) + adapter(x)).float().square().mean(), (adapter.weight, x))
    assert torch.allclose(da.float(), ra.float(), rtol=2**-6, atol=1e-4)
    assert torch.allclose(dx.float(), rx.float(), rtol=2**-6, atol=1e-4)
    assert all(not b.requires_grad for b in layer.buffers())


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("fmt,scale_layout", LAYOUTS)
def test_compile_fullgraph_matches_eager(backend, fmt, scale_layout):
    a, _ = operands(fmt, scale_layout, n=64, k=128, lead=(2, 5))
    w, s, g, b = a["weight"], a["weight_scale"], a["global_scale"], a["bias"]

    def f(x):
        return torch.relu(fp4_linear(x * 2, w, s, fmt, g, b, scale_layout)) + 1  # a float global_scale, too

    compiled = torch.compile(f, fullgraph=True, backend=backend)
    torch._dynamo.reset()
    assert torch.equal(compiled(a["x"]), f(a["x"]))
    x2 = torch.randn(7, 128).to(torch.bfloat16)  # another M: a recompile or a dynamic shape, same numbers
    assert torch.equal(compiled(x2), f(x2))


def test_compile_module():
    lin = torch.nn.Linear(128, 48).to(torch.bfloat16)
    m = FP4Linear.from_linear(lin, "nvfp4", "swizzled")
    x = torch.randn(4, 128, dtype=torch.bfloat16)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(m, fullgraph=True, backend="aot_eager")(x), m(x))


def _autocast_checks(device: str):
    """Under torch.autocast for `device`, fp32 x (and the module's bf16 bias) are cast to autocast's dtype, as
    nn.Linear's inputs are: the numbers of the explicit cast, eager and compiled; without autocast fp32 x is refused."""
    layer = FP4Linear.from_linear(torch.nn.Linear(128, 40).to(torch.bfloat16), "nvfp4").to(device)
    x = torch.randn(3, 128, device=device)
    for dtype in (torch.bfloat16, torch.float16):
        want = fp4_linear(x.to(dtype), layer.weight, layer.weight_scale, "nvfp4", layer.global_scale,
                          layer.bias.to(dtype))
        torch._dynamo.reset()
        compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
        with torch.autocast(device, dtype=dtype):
            y, yc = layer(x), compiled(x)
            assert torch.equal(layer(x.to(dtype)), want)  # already in autocast's dtype: unchanged
        assert y.dtype == dtype and torch.equal(y, want) and torch.equal(yc, want)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=False):
        with pytest.raises(ValueError, match="^x: expected dtype"):
            layer(x)


def test_autocast_casts_x_and_bias_as_nn_linear():
    _autocast_checks("cpu")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_torch_export_with_dynamic_tokens(device, fmt):
    """torch.export of the module (the op as one node, M dynamic) runs as the module does, at other token counts."""
    layer = FP4Linear.from_linear(torch.nn.Linear(128, 40).to(torch.bfloat16), fmt).to(device)
    x = torch.randn(3, 128, device=device).to(torch.bfloat16)
    ep = torch.export.export(layer, (x,), dynamic_shapes=({0: torch.export.Dim("m", max=4096)},))
    nodes = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert nodes == [torch.ops.nvfp4_gemv.fp4_linear.default]
    for m in (3, 1, 16, 200):
        x = torch.randn(m, 128, device=device).to(torch.bfloat16)
        assert torch.equal(ep.module()(x), layer(x))


def test_compile_reports_bad_input():
    a, _ = operands()
    w, s = a["weight"], a["weight_scale"]
    torch._dynamo.reset()
    f = torch.compile(lambda x: fp4_linear(x, w, s, "nvfp4", None, None), fullgraph=True, backend="aot_eager")
    with pytest.raises(Exception, match=r"x: expected shape \(\.\.\., K\) with K = 128"):
        f(torch.randn(3, 64, dtype=torch.bfloat16))
    with pytest.raises(Exception, match="x: expected dtype"):
        f(torch.randn(3, 128))


def test_import_is_light():
    code = ("import sys, nvfp4_gemv.linear; "
            "print(sorted(m for m in sys.modules if m == 'cutlass' or m.startswith(('cutlass.', 'cute_kernels')) "
            "or m == 'nvfp4_gemv.linear.kernels'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------- bad input: ValueError naming the tensor


def _misaligned(t):
    """A contiguous copy of t one element past a 16-byte boundary."""
    size = t.element_size()
    buf = torch.zeros(t.numel() * size + 16, dtype=torch.uint8)
    out = buf[size: size + t.numel() * size].view(t.dtype).view(t.shape)
    return out.copy_(t)


def _bad_cases():
    """(id, changes to the nvfp4 operands or a whole mxfp4 set, the name the message must start with)."""
    a, _ = operands()
    mx, _ = operands("mxfp4")
    n, k = 130, 128
    meta = torch.device("meta")
    return [
        ("fmt", dict(fmt="nvfp8"), "fmt"),
        ("layout", dict(scale_layout="blocked"), "scale_layout"),
        ("mx-swizzled", {**mx, "scale_layout": "swizzled"}, "scale_layout"),
        ("x-dtype", dict(x=a["x"].float()), "x"),
        ("x-k", dict(x=a["x"][..., :64]), "x"),
        ("x-0d", dict(x=torch.tensor(1.0, dtype=torch.bfloat16)), "x"),
        ("x-type", dict(x=np.zeros((3, k))), "x"),
        ("x-device", dict(x=a["x"].to(meta)), "x"),
        ("w-dtype", dict(weight=a["weight"].view(torch.int8)), "weight"),
        ("w-3d", dict(weight=a["weight"].view(1, n, k // 2)), "weight"),
        ("w-k", dict(weight=a["weight"][:, :20]), "weight"),
        ("w-empty", dict(weight=a["weight"][:0]), "weight"),
        ("w-strides", dict(weight=torch.zeros(k // 2, n, dtype=torch.uint8).t()), "weight"),
        ("w-type", dict(weight=None), "weight"),
        ("s-dtype", dict(weight_scale=a["weight_scale"].view(torch.uint8)), "weight_scale"),
        ("s-shape", dict(weight_scale=a["weight_scale"][:, :4]), "weight_scale"),
        ("s-swizzled-shape", dict(scale_layout="swizzled"), "weight_scale"),
        ("s-strides", dict(weight_scale=torch.zeros(k // 16, n, dtype=torch.float8_e4m3fn).t()), "weight_scale"),
        ("s-device", dict(weight_scale=a["weight_scale"].to(meta)), "weight_scale"),
        ("mx-s-dtype", {**mx, "weight_scale": mx["weight_scale"].view(torch.float8_e4m3fn)}, "weight_scale"),
        ("mx-s-shape", {**mx, "weight_scale": a["weight"][:, :8]}, "weight_scale"),
        ("g-dtype", dict(global_scale=torch.tensor(1.0, dtype=torch.float16)), "global_scale"),
        ("g-numel", dict(global_scale=torch.ones(2)), "global_scale"),
        ("g-nan", dict(global_scale=float("nan")), "global_scale"),
        ("g-inf", dict(global_scale=float("inf")), "global_scale"),
        ("g-type", dict(global_scale="1"), "global_scale"),
        ("g-device", dict(global_scale=torch.ones(1, device=meta)), "global_scale"),
        ("mx-g", {**mx, "global_scale": 1.0}, "global_scale"),
        ("b-shape", dict(bias=torch.zeros(n + 1, dtype=torch.bfloat16)), "bias"),
        ("b-dtype", dict(bias=torch.zeros(n, dtype=torch.float16)), "bias"),
        ("b-strides", dict(bias=torch.zeros(2 * n, dtype=torch.bfloat16)[::2]), "bias"),
        ("b-device", dict(bias=torch.zeros(n, dtype=torch.bfloat16, device=meta)), "bias"),
    ]


BAD = _bad_cases()
ALIGN = [("w-align", "weight", "weight"), ("s-align", "weight_scale", "weight_scale")]


@pytest.mark.parametrize("case,changes,name", BAD, ids=[c[0] for c in BAD])
def test_bad_input_names_the_tensor(case, changes, name):
    a = {**operands()[0], **changes}
    pattern = rf"^{name}: "
    with pytest.raises(ValueError, match=pattern):
        fp4_linear(**a)
    with pytest.raises(ValueError, match=pattern):
        validate_linear(a["x"], a["weight"], a["weight_scale"], a["fmt"], a["scale_layout"], a["global_scale"],
                        a["bias"])
    with pytest.raises(ValueError, match=pattern):  # the eager CUDA path, on CPU tensors with a stand-in launcher
        EagerLinear(launch=_fail)(a["x"], a["weight"], a["weight_scale"], a["fmt"], a["global_scale"], a["bias"],
                                  a["scale_layout"])


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_cpu_path_checks_a_tensor_scales_value(value):
    """A NaN or infinite global scale tensor on the CPU path (the reference) raises, as a float one does everywhere:
    reading a CPU scalar costs nothing. (On CUDA a tensor scale's value is checked where FP4Linear or a loader takes
    it, not per call: reading it would synchronize.)"""
    a = operands()[0]
    with pytest.raises(ValueError, match=r"^global_scale: expected a finite value"):
        fp4_linear(**{**a, "global_scale": torch.tensor([value])})
    fp4_linear(**{**a, "global_scale": torch.tensor([0.25])})  # a finite tensor scale runs


@pytest.mark.parametrize("case,key,name", ALIGN, ids=[c[0] for c in ALIGN])
def test_misaligned_weights(case, key, name):
    """16-byte alignment is the kernels' requirement: checked on the kernel path and by validate_linear on CUDA
    (or on request); the CPU reference reads any address."""
    a, _ = operands()
    a[key] = _misaligned(a[key])
    assert a[key].data_ptr() % 16
    with pytest.raises(ValueError, match=rf"^{name}: expected a 16-byte aligned data pointer"):
        validate_linear(*(a[k] for k in ("x", "weight", "weight_scale", "fmt", "scale_layout", "global_scale",
                                         "bias")), check_pointers=True)
    eager = EagerLinear(launch=_reference_launch)
    good, _ = operands()
    eager(**_eager_kw(good))  # the signature is cached: the pointer check is per call
    with pytest.raises(ValueError, match=rf"^{name}: expected a 16-byte aligned"):
        eager(**_eager_kw(a))
    assert torch.equal(fp4_linear(**a), linear_reference(**operands()[0]))


# ---------------------------------------------------------------- the eager CUDA path with a stand-in launcher


def _fail(*args):
    raise AssertionError("launched on bad input")


def _reference_launch(out, x2d, weight_u8, scale_u8, fmt, scale_layout, global_scale, bias):
    """What kernels.run does, from the reference, after checking the promised argument forms (uint8 weights;
    scales as uint8 or, for NVFP4, float8_e4m3fn)."""
    assert out.is_contiguous() and x2d.is_contiguous() and x2d.data_ptr() % 16 == 0
    assert weight_u8.dtype == torch.uint8
    assert scale_u8.dtype in ((torch.uint8, torch.float8_e4m3fn) if fmt == "nvfp4" else (torch.uint8,))
    assert global_scale is None or (global_scale.dtype == torch.float32 and global_scale.numel() == 1)
    view = {"nvfp4": torch.float8_e4m3fn, "mxfp4": torch.uint8}[fmt]
    out.copy_(linear_reference(x2d, weight_u8, scale_u8.view(view), fmt, global_scale, bias, scale_layout))


def _eager_kw(a):
    return {k: a[k] for k in ("x", "weight", "weight_scale", "fmt", "global_scale", "bias", "scale_layout")}


@pytest.mark.parametrize("fmt,scale_layout", LAYOUTS)
def test_eager_path_numbers_and_forms(fmt, scale_layout):
    calls = []
    eager = EagerLinear(launch=lambda *args: (calls.append(args), _reference_launch(*args)))
    a, _ = operands(fmt, scale_layout, lead=(2, 3))
    a["weight"] = a["weight"].view(torch.float4_e2m1fn_x2)
    y = eager(**_eager_kw(a))
    assert y.shape == (2, 3, 130) and torch.equal(y, linear_reference(**a))
    out, x2d, w8, s8, *_ = calls[0]
    assert w8.data_ptr() == a["weight"].data_ptr() and s8.data_ptr() == a["weight_scale"].data_ptr()  # no copies
    assert x2d.data_ptr() == a["x"].data_ptr()  # a contiguous, aligned x is not copied either
    assert y.data_ptr() == out.data_ptr()


def test_eager_path_caches_validation_and_scale(monkeypatch):
    import nvfp4_gemv.linear.op as op

    count = []
    real = op.validate_linear
    monkeypatch.setattr(op, "validate_linear", lambda *a, **k: (count.append(1), real(*a, **k))[1])
    seen = []
    eager = EagerLinear(launch=lambda *args: (seen.append(args[6]), _reference_launch(*args)))
    a, _ = operands()
    for m in (1, 4, 16, 1):  # a new M is not a new signature
        a["x"] = torch.randn(m, 128).to(torch.bfloat16)
        assert torch.equal(eager(**_eager_kw(a)), linear_reference(**a))
    assert len(count) == 1
    assert all(g is seen[0] for g in seen) and seen[0].tolist() == [0.8125]  # one cached fp32 tensor
    eager(**_eager_kw({**a, "bias": None}))
    assert len(count) == 2
    with pytest.raises(ValueError, match="^global_scale: expected a finite value"):
        eager(**_eager_kw({**a, "global_scale": float("nan")}))  # a float is checked per call


def test_eager_path_copies_only_unfit_x():
    launched = []
    eager = EagerLinear(launch=lambda *args: (launched.append(args[1]), _reference_launch(*args)))
    a, _ = operands()
    for x in (torch.randn(128, 3).to(torch.bfloat16).t(), _misaligned(torch.randn(3, 128).to(torch.bfloat16))):
        y = eager(**_eager_kw({**a, "x": x}))
        assert launched[-1].data_ptr() != x.data_ptr() and torch.equal(y, linear_reference(**{**a, "x": x}))
    launched.clear()
    y = eager(**_eager_kw({**a, "x": torch.empty(0, 128, dtype=torch.bfloat16)}))
    assert y.shape == (0, 130) and not launched  # M = 0: no launch


# ---------------------------------------------------------------- FP4Linear


@pytest.mark.parametrize("fmt,scale_layout", LAYOUTS)
def test_module_from_linear(fmt, scale_layout):
    lin = torch.nn.Linear(192, 70).to(torch.float16)
    m = FP4Linear.from_linear(lin, fmt, scale_layout)
    assert (m.in_features, m.out_features, m.fmt, m.scale_layout) == (192, 70, fmt, scale_layout)
    quantize = quantize_nvfp4 if fmt == "nvfp4" else quantize_mxfp4
    q, s, g = quantize(lin.weight, scale_layout) if fmt == "nvfp4" else quantize(lin.weight)
    assert torch.equal(m.weight, q) and torch.equal(m.weight_scale.view(torch.uint8), s.view(torch.uint8))
    x = torch.randn(2, 5, 192, dtype=torch.float16)
    y = m(x)
    assert torch.equal(y, linear_reference(x, q, s, fmt, g, lin.bias.detach(), scale_layout))
    ref = torch.nn.functional.linear(x.float(), lin.weight.float(), lin.bias.float())
    assert ((y.float() - ref).norm() / ref.norm()).item() < 0.15  # fp4's quantization error, not a layout bug
    assert m.path(1) == "reference (cpu)"


def test_module_casts_only_the_bias():
    m = FP4Linear.from_linear(torch.nn.Linear(64, 8).to(torch.bfloat16))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    m.half()
    assert m.bias.dtype == torch.float16
    for name in ("weight", "weight_scale", "global_scale"):
        assert getattr(m, name).dtype == before[name].dtype and torch.equal(getattr(m, name), before[name])
    x = torch.randn(3, 64, dtype=torch.float16)
    assert torch.equal(m(x), linear_reference(x, m.weight, m.weight_scale, "nvfp4", m.global_scale, m.bias))


def test_module_new_and_state_dict():
    m = FP4Linear(128, 40, fmt="mxfp4", dtype=torch.float16)
    assert m.global_scale is None and m.weight_scale.shape == (40, 4) and m.bias.dtype == torch.float16
    x = torch.randn(2, 128, dtype=torch.float16)
    assert torch.equal(m(x), torch.zeros(2, 40, dtype=torch.float16))
    src = FP4Linear.from_linear(torch.nn.Linear(128, 40).half(), "mxfp4")
    m.load_state_dict(src.state_dict())
    assert torch.equal(m(x), src(x))
    with pytest.raises(ValueError, match="^in_features: expected a positive multiple of 64"):
        FP4Linear(100, 8)
    with pytest.raises(ValueError, match="^fmt: "):
        FP4Linear(64, 8, fmt="int4")


def test_module_rejects_bad_tensors_at_construction():
    q, s, g = quantize_nvfp4(torch.randn(16, 64))
    with pytest.raises(ValueError, match="^global_scale: expected a finite value"):
        FP4Linear.from_quantized(q, s, "nvfp4", torch.tensor(float("nan")))
    with pytest.raises(ValueError, match="^bias: expected shape"):
        FP4Linear.from_quantized(q, s, "nvfp4", g, torch.zeros(15, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="^dtype: "):
        FP4Linear.from_quantized(q, s, "nvfp4", g, dtype=torch.float32)
    m = FP4Linear.from_quantized(q, s, "nvfp4", 0.5)
    assert m.global_scale.dtype == torch.float32 and m.global_scale.item() == 0.5
    assert m.weight is q and m.weight_scale is s  # the caller's tensors, not copies


def test_module_constructor_arguments():
    for kwargs, match in [(dict(in_features=128, out_features=-1), "^out_features: expected a positive int"),
                          (dict(in_features=128, out_features=0), "^out_features: expected a positive int"),
                          (dict(in_features=128, out_features=32.0), "^out_features: expected a positive int"),
                          (dict(in_features=128.0, out_features=32), "^in_features: expected a positive multiple"),
                          (dict(in_features=True, out_features=32), "^in_features: expected a positive multiple"),
                          (dict(in_features=128, out_features=32, dtype="bfloat16"), "^dtype: expected one of"),
                          (dict(in_features=128, out_features=32, dtype=torch.float32), "^dtype: expected one of")]:
        with pytest.raises(ValueError, match=match):
            FP4Linear(**kwargs)
    m = FP4Linear(np.int64(128), np.int32(48))  # numpy's integers, as nn.Linear takes them
    assert (m.in_features, m.out_features) == (128, 48) and type(m.in_features) is int
    q, s, g = quantize_nvfp4(torch.randn(32, 128))
    with pytest.raises(ValueError, match=r"^bias: expected one of .*got torch\.float32; cast it"):
        FP4Linear.from_quantized(q, s, "nvfp4", g, torch.zeros(32))
    with pytest.raises(ValueError, match=r"^bias: expected contiguous rows .*; pass bias\.contiguous\(\)"):
        FP4Linear.from_quantized(q, s, "nvfp4", g, torch.zeros(32, 2, dtype=torch.bfloat16)[:, 0])


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_module_loads_its_format_bit_for_bit(fmt):
    """load_state_dict copies weight, weight_scale and global_scale as bytes whatever dtype of the format each side
    holds (torch's copy_ would convert e8m0 <-> uint8 scales by value, and has no fp4 kernel)."""
    torch.manual_seed(3)
    lin = torch.nn.Linear(128, 48).to(torch.bfloat16)
    x = torch.randn(2, 128, dtype=torch.bfloat16)
    src = FP4Linear.from_linear(lin, fmt)
    views = {"weight": (torch.uint8, torch.float4_e2m1fn_x2),
             "weight_scale": (torch.float8_e4m3fn,) if fmt == "nvfp4" else (torch.uint8, torch.float8_e8m0fnu)}
    for w_dtype in views["weight"]:
        for s_dtype in views["weight_scale"]:
            for d_w in views["weight"]:
                for d_s in views["weight_scale"]:
                    state = src.state_dict()
                    state["weight"] = state["weight"].view(w_dtype)
                    state["weight_scale"] = state["weight_scale"].view(s_dtype)
                    dst = FP4Linear(128, 48, fmt=fmt)
                    dst.weight, dst.weight_scale = dst.weight.view(d_w), dst.weight_scale.view(d_s)
                    dst.load_state_dict(state)
                    assert (dst.weight.dtype, dst.weight_scale.dtype) == (d_w, d_s)  # the module's dtypes kept
                    for name in ("weight", "weight_scale"):
                        assert torch.equal(getattr(dst, name).view(torch.uint8),
                                           getattr(src, name).view(torch.uint8))
                    assert torch.equal(dst(x), src(x))
    assigned = FP4Linear(128, 48, fmt=fmt)
    assigned.load_state_dict(src.state_dict(), assign=True)
    for name in ("weight", "weight_scale"):  # assign=True takes the state dict's storage, in the module's dtype
        assert getattr(assigned, name).data_ptr() == getattr(src, name).data_ptr()
    assert torch.equal(assigned(x), src(x))


@pytest.mark.parametrize("assign", [False, True])
def test_module_loads_under_the_swap_flag(assign):
    """With torch.__future__.set_swap_module_params_on_conversion(True), load_state_dict swaps tensors instead of
    copying into them: the loaded bytes still land, in the module's dtypes."""
    src = FP4Linear.from_linear(torch.nn.Linear(128, 48).to(torch.bfloat16), "nvfp4")
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        m = FP4Linear(128, 48)
        m.load_state_dict(src.state_dict(), assign=assign)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)
    assert (m.weight.dtype, m.weight_scale.dtype) == (torch.uint8, torch.float8_e4m3fn)
    assert torch.equal(m.weight, src.weight) and torch.equal(m(x), src(x))


def test_module_assign_load_checks_what_it_takes():
    """assign=True takes the state dict's tensors as they are, so they are checked as a new module's would be."""
    src = FP4Linear.from_linear(torch.nn.Linear(128, 48).to(torch.bfloat16), "nvfp4")
    state = src.state_dict()
    with pytest.raises(ValueError, match="^bias: expected one of .*got torch.float32"):
        FP4Linear(128, 48).load_state_dict({**state, "bias": state["bias"].float()}, assign=True)
    wide = torch.zeros(48, 128, dtype=torch.uint8)
    with pytest.raises(ValueError, match="^weight: expected contiguous rows"):
        FP4Linear(128, 48).load_state_dict({**state, "weight": wide[:, :64]}, assign=True)
    FP4Linear(128, 48).load_state_dict(state, assign=True)  # as the module holds them: fine


def test_module_load_refuses_other_dtypes_and_bad_scales():
    src = FP4Linear.from_linear(torch.nn.Linear(128, 48).to(torch.bfloat16), "nvfp4")
    state = src.state_dict()
    dst = FP4Linear(128, 48)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    for key, value, match in [
        ("weight_scale", state["weight_scale"].view(torch.uint8),
         r"^weight_scale: expected dtype torch\.float8_e4m3fn"),
        ("weight", state["weight"].view(torch.int8), r"^weight: expected dtype torch\.uint8 or torch\.float4_e2m1fn"),
        ("global_scale", state["global_scale"].double(), r"^global_scale: expected dtype torch\.float32"),
        ("global_scale", torch.tensor(float("inf")), r"^global_scale: expected a finite value, got inf"),
    ]:
        with pytest.raises(ValueError, match=match):
            dst.load_state_dict({**state, key: value})
        for k, v in dst.state_dict().items():  # nothing half-loaded is left behind, dtypes included
            assert v.dtype == before[k].dtype
    prefixed = torch.nn.Sequential(dst)
    with pytest.raises(ValueError, match=r"^0\.weight_scale: expected dtype"):
        prefixed.load_state_dict({f"0.{k}": v for k, v in {**state, "weight_scale": state["weight_scale"].view(
            torch.uint8)}.items()})
    # A one-element tensor scale of another shape (from_quantized keeps the caller's) loads into this one's.
    other = FP4Linear.from_quantized(src.weight, src.weight_scale, "nvfp4", src.global_scale.reshape(1, 1), src.bias)
    dst.load_state_dict(other.state_dict())
    assert dst.global_scale.shape == () and dst.global_scale.item() == src.global_scale.item()
    with pytest.raises(RuntimeError, match="size mismatch"):  # torch's own check of the shapes still runs
        dst.load_state_dict({**state, "weight": state["weight"][:, :32]})


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_module_on_meta_then_loaded(fmt):
    """Built on the meta device (no data, so no value check), then to_empty and load_state_dict: the usual way to
    build a large model before its weights arrive."""
    src = FP4Linear.from_linear(torch.nn.Linear(128, 48).to(torch.bfloat16), fmt)
    with torch.device("meta"):
        m = FP4Linear(128, 48, fmt=fmt)
    assert m.weight.device.type == "meta"
    with pytest.raises(ValueError, match="^weight: expected a tensor with data to quantize"):
        FP4Linear.from_linear(torch.nn.Linear(128, 48, device="meta"), fmt)
    m = m.to_empty(device="cpu")
    m.load_state_dict(src.state_dict())
    x = torch.randn(3, 128, dtype=torch.bfloat16)
    assert torch.equal(m(x), src(x))
    if fmt == "nvfp4":
        with pytest.raises(ValueError, match="^global_scale: expected a finite value"):
            m.load_state_dict({**src.state_dict(), "global_scale": torch.tensor(float("nan"))})


def test_global_scale_as_other_numbers():
    a, plain = operands(lead=(2,))
    want = fp4_linear(**{**a, "global_scale": 0.5})
    assert torch.equal(fp4_linear(**{**a, "global_scale": Fraction(1, 2)}), want)
    assert torch.equal(fp4_linear(**{**a, "global_scale": np.float32(0.5)}), want)
    for big in (10**400, Fraction(10**400, 3)):
        with pytest.raises(ValueError, match="^global_scale: expected a finite value"):
            fp4_linear(**{**a, "global_scale": big})
    calls = []
    eager = EagerLinear(launch=lambda *args: calls.append(args))
    with pytest.raises(ValueError, match="^global_scale: expected a finite value"):
        eager(a["x"], a["weight"], a["weight_scale"], "nvfp4", 10**400, a["bias"], "plain")
    eager(a["x"], a["weight"], a["weight_scale"], "nvfp4", 1, a["bias"], "plain")
    assert calls[-1][6].item() == 1.0 and calls[-1][6].dtype == torch.float32
    with pytest.raises(ValueError, match="^x: expected a torch.Tensor"):
        torch.ops.nvfp4_gemv.fp4_linear(None, a["weight"], a["weight_scale"], "nvfp4", "plain", None, None)


def test_compile_global_scale_as_a_graph_input():
    """A float passed into the compiled function: one graph for all its values (the compiler makes it symbolic from
    the second; no test of its value pins it), the result following each value, past the recompile limit that
    fullgraph=True turns into an error; a NaN gives NaN outputs there (no check in the graph)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    a, _ = operands(n=64, lead=(2,))
    w, s = a["weight"], a["weight_scale"]
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    f = torch.compile(lambda x, gs: fp4_linear(x, w, s, "nvfp4", gs), fullgraph=True, backend=counter)
    for gs in [0.25 * (i + 1) for i in range(12)]:
        assert torch.equal(f(a["x"], gs), linear_reference(a["x"], w, s, "nvfp4", gs))
    assert counter.frame_count <= 2
    assert f(a["x"], float("nan")).float().isnan().all()


# ---------------------------------------------------------------- on the GPU


def _cuda(a):
    return {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in a.items()}


def module_args(layer, x):
    """fp4_linear's keyword arguments for `layer` (an FP4Linear) on x, for the reference and _assert_kernel_close."""
    return dict(x=x, weight=layer.weight, weight_scale=layer.weight_scale, fmt=layer.fmt,
                scale_layout=layer.scale_layout, global_scale=layer.global_scale, bias=layer.bias)


def _assert_kernel_close(y, a):
    """The kernel sums in another order than the reference: within fp32 accumulation error plus one rounding."""
    n, k = a["weight"].shape[0], a["x"].shape[-1]
    ref = linear_reference(**a).double().reshape(-1, n)
    w = dequantize(a["weight"], a["weight_scale"], a["fmt"], a["scale_layout"], a["global_scale"]).double()
    magnitude = a["x"].double().abs().reshape(-1, k) @ w.abs().t()
    ulp = 2.0 ** -(7 if a["x"].dtype == torch.bfloat16 else 10)
    assert ((y.double().reshape(-1, n) - ref).abs() <= 1e-5 * magnitude + ulp * ref.abs() + 1e-6).all()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,scale_layout", LAYOUTS)
@pytest.mark.parametrize("m", [1, 3, 16, 33, 130])
@pytest.mark.parametrize("n,k", [(130, 2880), (256, 4096), (1, 64)])
def test_gpu_matches_reference(fmt, scale_layout, m, n, k):
    a = _cuda(operands(fmt, scale_layout, n=n, k=k, lead=(m,))[0])
    y = fp4_linear(**a)
    assert y.is_cuda and y.shape == (m, n)
    _assert_kernel_close(y, a)
    assert torch.equal(torch.ops.nvfp4_gemv.fp4_linear(*op_args(a)), y)
    assert isinstance(FP4Linear.from_quantized(a["weight"], a["weight_scale"], fmt, a["global_scale"], a["bias"],
                                               scale_layout).path(m), str)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [4, 160], ids=["fp4 kernel", "dequantize + GEMM"])
def test_gpu_cuda_graph_and_compile(m):
    a = _cuda(operands(lead=(m,), n=256, k=512)[0])
    static_x = a["x"].clone()
    fp4_linear(**a)  # warm-up: compiles the kernel and caches the float global scale's tensor
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = fp4_linear(**{**a, "x": static_x})
    for _ in range(2):
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.cuda.synchronize()
        _assert_kernel_close(static_y, {**a, "x": static_x})
    torch._dynamo.reset()
    f = torch.compile(lambda x: fp4_linear(x, a["weight"], a["weight_scale"], "nvfp4", a["global_scale"],
                                           a["bias"]), fullgraph=True, mode="reduce-overhead")
    for _ in range(3):
        _assert_kernel_close(f(a["x"]), a)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(), (1,), (1, 1), "expanded"], ids=["0-dim", "1", "1x1", "expanded"])
@pytest.mark.parametrize("m", [1, 8, 160])
def test_gpu_global_scale_of_any_shape(shape, m):
    """A one-element fp32 global scale of any shape or stride (ModelOpt and the quantizer give a 0-dim one; an
    expanded scalar has stride 0), through the op eagerly and in a CUDA graph, and through the module that
    `from_linear` quantizes: the values of a float scale."""
    a = _cuda(operands(lead=(m,), n=300, k=512)[0])
    want = fp4_linear(**a)
    if shape == "expanded":
        g = torch.tensor(a["global_scale"], dtype=torch.float32, device="cuda").expand(1)
        assert g.stride() == (0,)
    else:
        g = torch.full(shape, a["global_scale"], dtype=torch.float32, device="cuda")
    assert torch.equal(fp4_linear(**{**a, "global_scale": g}), want)
    assert torch.equal(torch.ops.nvfp4_gemv.fp4_linear(*op_args({**a, "global_scale": g})), want)
    static_x = a["x"].clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = fp4_linear(**{**a, "x": static_x, "global_scale": g})
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, want)
    linear = torch.nn.Linear(512, 300, device="cuda", dtype=torch.bfloat16)
    layer = FP4Linear.from_linear(linear, "nvfp4")
    assert layer.global_scale.shape == ()
    x = a["x"]
    y = layer(x)
    _assert_kernel_close(y, module_args(layer, x))


@pytest.mark.gpu
@pytest.mark.parametrize("lead", [(), (2, 3, 5), (0,)], ids=["1-D x", "3 leading dims", "no rows"])
def test_gpu_leading_dims_of_x(lead):
    """x of any leading shape on the GPU, as nn.Linear takes it: (K,) gives (N,), (2, 3, 5, K) gives (2, 3, 5, N),
    zero rows give an empty y; the rows' numbers those of x as (M, K), and a strided x (copied) the same."""
    a = _cuda(operands(lead=(max(1, math.prod(lead)),), n=300, k=512)[0])
    x2d = a["x"][: math.prod(lead)]
    x = x2d.reshape(*lead, 512)
    y = fp4_linear(**{**a, "x": x})
    assert y.shape == (*lead, 300)
    assert torch.equal(y.reshape(-1, 300), fp4_linear(**{**a, "x": x2d}))
    strided = torch.empty(*lead, 1024, dtype=x.dtype, device="cuda")[..., ::2]
    strided.copy_(x)
    assert (not strided.is_contiguous() or not y.numel()) and torch.equal(fp4_linear(**{**a, "x": strided}), y)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_gpu_module_lifecycle(fmt):
    """The module's life on the GPU as a server lives it: built on the meta device, `to_empty` onto the GPU,
    `load_state_dict` from a CPU state dict, `.half()`, and `torch.compile(fullgraph=True)` (inductor): the kernels'
    numbers, the same bits eager and compiled, and the CPU module's reference within the tolerance."""
    src = FP4Linear.from_linear(torch.nn.Linear(512, 300).to(torch.bfloat16), fmt)
    with torch.device("meta"):
        m = FP4Linear(512, 300, fmt=fmt)
    m = m.to_empty(device="cuda")
    m.load_state_dict(src.state_dict())
    assert m.weight.is_cuda and (fmt == "mxfp4" or m.global_scale.shape == ())
    for dtype, tokens in ((torch.bfloat16, (1, 4, 16, 160)), (torch.float16, (1, 8))):
        if dtype == torch.float16:
            m, src = m.half(), src.half()
        for t in tokens:
            x = torch.randn(t, 512).to(dtype)
            y = m(x.cuda())
            _assert_kernel_close(y.cpu(), module_args(src, x))
        torch._dynamo.reset()
        compiled = torch.compile(m, fullgraph=True)
        x = torch.randn(4, 512, device="cuda").to(dtype)
        assert torch.equal(compiled(x), m(x))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,scale_layout", LAYOUTS)
@pytest.mark.parametrize("m", [1, 8, 160])
def test_gpu_weight_and_scale_dtypes(fmt, scale_layout, m):
    """The checkpoint dtypes the op takes on the GPU (weight as float4_e2m1fn_x2; MXFP4 scales as float8_e8m0fnu),
    read as the same bytes as uint8: the same bits, at the fp4 kernel's token counts and the dequantize path's."""
    a = _cuda(operands(fmt, scale_layout, n=300, k=512, lead=(m,))[0])
    want = fp4_linear(**a)
    weights = (a["weight"], a["weight"].view(torch.float4_e2m1fn_x2))
    scales = (a["weight_scale"],)
    if fmt == "mxfp4":
        scales += (a["weight_scale"].view(torch.float8_e8m0fnu),)
    for w in weights:
        for sf in scales:
            assert torch.equal(fp4_linear(**{**a, "weight": w, "weight_scale": sf}), want), (w.dtype, sf.dtype)


@pytest.mark.gpu
def test_gpu_autocast():
    _autocast_checks("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,scale_layout", LAYOUTS)
def test_gpu_with_grad(fmt, scale_layout):
    """x (and bias) requiring grad on CUDA: the same kernel forward (the same bits), and the op's backward."""
    a = _cuda(operands(fmt, scale_layout, lead=(3,), n=300, k=512)[0])
    y0 = fp4_linear(**a)
    x, bias = a["x"].clone().requires_grad_(), a["bias"].clone().requires_grad_()
    y = fp4_linear(**{**a, "x": x, "bias": bias})
    assert torch.equal(y.detach(), y0) and y.requires_grad
    dy = torch.randn_like(y)
    dx, db = torch.autograd.grad(y, (x, bias), dy)
    rx, rb = torch.autograd.grad(linear_reference(**{**a, "x": x, "bias": bias}), (x, bias), dy)
    assert torch.allclose(dx.float(), rx.float(), rtol=2**-7, atol=1e-4) and torch.equal(db, rb)
    with torch.no_grad():  # grad mode off: the eager path, no autograd
        assert not fp4_linear(**{**a, "x": x}).requires_grad


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.parametrize("m", [1, 16, 160], ids=["fp4 kernel", "16 tokens", "dequantize + GEMM"])
def test_gpu_second_device_while_the_first_is_current(m):
    """A layer on cuda:1 called while cuda:0 is current, as a model split over GPUs (`device_map="auto"`) calls it:
    the result lands on cuda:1, equals the same call made with cuda:1 current, and the current device is left as it
    was. (The launch binds torch's current stream of x's device; the DSL's TVM-FFI wrapper switches the device
    for the kernel and back.)"""
    a = {key: v.to("cuda:1") if isinstance(v, torch.Tensor) else v
         for key, v in operands(lead=(m,), n=300, k=512)[0].items()}
    torch.cuda.set_device(0)
    y = fp4_linear(**a)
    assert y.device == torch.device("cuda:1") and torch.cuda.current_device() == 0
    with torch.cuda.device(1):
        want = fp4_linear(**a)
    assert torch.equal(y, want)
    _assert_kernel_close(y, a)
