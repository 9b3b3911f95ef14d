"""Loaders: safetensors files with the real tensor names, dtypes and shapes, loaded back into FP4Linear modules whose
outputs are checked against the reference of the original tensors and a float64 numpy decode of the file's bytes."""

import numpy as np
import pytest
import torch

safetensors_torch = pytest.importorskip("safetensors.torch")

from nvfp4_gemv.linear import (  # noqa: E402
    FP4Linear,
    dequantize,
    linear_reference,
    load_compressed_tensors_nvfp4,
    load_gpt_oss_experts,
    load_modelopt_nvfp4,
    quantize_mxfp4,
    quantize_nvfp4,
    replace_linears,
)
from test_linear_reference import np_dequantize, u8  # noqa: E402

PREFIX = "model.layers.3.mlp.down_proj"


def _roundtrip(tmp_path, tensors):
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(tensors, str(path))
    return safetensors_torch.load_file(str(path))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("n,k", [(96, 256), (130, 2880)])
def test_modelopt_nvfp4(tmp_path, bias, n, k):
    torch.manual_seed(0)
    q, s, g = quantize_nvfp4(torch.randn(n, k))
    tensors = {f"{PREFIX}.weight": q, f"{PREFIX}.weight_scale": s, f"{PREFIX}.weight_scale_2": g,
               f"{PREFIX}.input_scale": torch.tensor(0.01)}
    if bias:
        tensors[f"{PREFIX}.bias"] = torch.randn(n).to(torch.bfloat16)
    assert tensors[f"{PREFIX}.weight_scale_2"].shape == () and g.dtype == torch.float32
    sd = _roundtrip(tmp_path, tensors)
    layer = load_modelopt_nvfp4(sd, PREFIX)
    assert layer.weight.data_ptr() == sd[f"{PREFIX}.weight"].data_ptr()  # the loaded tensor itself
    assert (layer.in_features, layer.out_features, layer.fmt) == (k, n, "nvfp4")
    x = torch.randn(2, 3, k).to(torch.bfloat16)
    b = tensors.get(f"{PREFIX}.bias")
    y = layer(x)
    assert torch.equal(y, linear_reference(x, q, s, "nvfp4", g, b))
    wd = np_dequantize(u8(sd[f"{PREFIX}.weight"]), u8(sd[f"{PREFIX}.weight_scale"]), "nvfp4", "plain",
                       float(sd[f"{PREFIX}.weight_scale_2"]))
    y64 = x.double().numpy() @ wd.T + (b.double().numpy() if bias else 0)
    assert np.allclose(y.double().numpy(), y64, rtol=2**-7, atol=1e-3 * np.abs(y64).max())


def test_compressed_tensors_nvfp4(tmp_path):
    torch.manual_seed(1)
    n, k = 64, 192
    q, s, g = quantize_nvfp4(torch.randn(n, k) * 3)
    stored = (1.0 / g).reshape(1)  # compressed-tensors keeps the reciprocal
    sd = _roundtrip(tmp_path, {f"{PREFIX}.weight_packed": q, f"{PREFIX}.weight_scale": s,
                               f"{PREFIX}.weight_global_scale": stored})
    layer = load_compressed_tensors_nvfp4(sd, PREFIX, dtype=torch.float16)
    assert layer.bias is None and layer.global_scale.item() == (1.0 / stored).item()
    assert abs(layer.global_scale.item() / g.item() - 1) < 2**-22
    x = torch.randn(5, k).to(torch.float16)
    assert torch.equal(layer(x), linear_reference(x, q, s, "nvfp4", 1.0 / stored))
    wd = np_dequantize(u8(q), u8(s), "nvfp4", "plain", 1.0 / float(stored))
    assert np.allclose(dequantize(layer.weight, layer.weight_scale, "nvfp4", "plain", layer.global_scale).numpy(),
                       wd, rtol=2**-22, atol=0)


def test_gpt_oss_experts(tmp_path):
    """gate_up_proj (E=2, 2·8 rows interleaved) and down_proj (E=2, 8 rows), K = 2880 (45·64), with biases."""
    torch.manual_seed(2)
    k, experts = 2880, 2
    tensors = {}
    originals = {}
    for proj, rows in (("gate_up_proj", 16), ("down_proj", 8)):
        blocks = torch.randint(0, 256, (experts, rows, k // 32, 16), dtype=torch.uint8)
        scales = torch.randint(118, 134, (experts, rows, k // 32), dtype=torch.uint8)
        bias = torch.randn(experts, rows).to(torch.bfloat16)
        prefix = "model.layers.0.mlp.experts"
        tensors.update({f"{prefix}.{proj}_blocks": blocks, f"{prefix}.{proj}_scales": scales,
                        f"{prefix}.{proj}_bias": bias})
        originals[proj] = (blocks, scales, bias)
    sd = _roundtrip(tmp_path, tensors)
    x = torch.randn(3, k).to(torch.bfloat16)
    for proj, (blocks, scales, bias) in originals.items():
        layers = load_gpt_oss_experts(sd, "model.layers.0.mlp.experts", proj)
        assert len(layers) == experts
        loaded = sd[f"model.layers.0.mlp.experts.{proj}_blocks"]
        rows = blocks.shape[1]
        outs = []
        for e, layer in enumerate(layers):
            # a view of the file's tensor: same storage, expert e's bytes, no copy
            assert layer.weight.untyped_storage().data_ptr() == loaded.untyped_storage().data_ptr()
            assert layer.weight.data_ptr() == loaded.data_ptr() + e * rows * k // 2
            assert layer.weight_scale.data_ptr() == sd[f"model.layers.0.mlp.experts.{proj}_scales"].data_ptr() \
                + e * rows * k // 32
            assert (layer.in_features, layer.out_features, layer.fmt) == (k, rows, "mxfp4")
            y = layer(x)
            # float64 numpy from the original [E, rows, K/32, 16] bytes: a row's byte j is blocks[e, r, j // 16, j % 16]
            wd = np_dequantize(blocks[e].reshape(rows, k // 2).numpy(), scales[e].numpy(), "mxfp4")
            y64 = x.double().numpy() @ wd.T + bias[e].double().numpy()
            bound = 1e-6 * (np.abs(x.double().numpy()) @ np.abs(wd).T) + 2**-8 * np.abs(y64)
            assert (np.abs(y.double().numpy() - y64) <= bound).all()
            outs.append(y)
        assert not torch.equal(outs[0], outs[1])  # the experts differ: the E index is honoured
        # stacked: one module over the same bytes, every routed slot in one call
        stack = load_gpt_oss_experts(sd, "model.layers.0.mlp.experts", proj, stacked=True)
        assert stack.weight.data_ptr() == loaded.data_ptr() and stack.weight.shape == (experts, rows, k // 2)
        assert (stack.experts, stack.in_features, stack.out_features, stack.fmt) == (experts, k, rows, "mxfp4")
        ids = torch.tensor([[1, 0], [0, 0], [1, 1]])
        y = stack(x, ids)
        want = torch.stack([torch.stack([outs[e][t] for e in ids[t].tolist()]) for t in range(3)])
        ulp = 2.0**-7  # the same fp32 sums as each expert's module, in another order: one rounding apart at most
        assert ((y.double() - want.double()).abs() <= ulp * want.double().abs() + 1e-3).all()


def test_gpt_oss_from_quantizer_round_trip(tmp_path):
    """Experts quantized with quantize_mxfp4 and stored in gpt-oss's 4-D form load back to the same linear."""
    torch.manual_seed(3)
    k, rows = 128, 8
    w = [torch.randn(rows, k) for _ in range(2)]
    qs = [quantize_mxfp4(t) for t in w]
    blocks = torch.stack([q.view(rows, k // 32, 16) for q, _, _ in qs])
    scales = torch.stack([s for _, s, _ in qs])
    sd = _roundtrip(tmp_path, {"experts.down_proj_blocks": blocks, "experts.down_proj_scales": scales})
    x = torch.randn(4, k).to(torch.bfloat16)
    for e, layer in enumerate(load_gpt_oss_experts(sd, "experts", "down_proj")):
        assert layer.bias is None
        assert torch.equal(layer(x), linear_reference(x, qs[e][0], qs[e][1], "mxfp4"))


def test_loader_errors(tmp_path):
    q, s, g = quantize_nvfp4(torch.randn(32, 64))
    with pytest.raises(ValueError, match=r"^p\.weight_scale_2: not in the state dict"):
        load_modelopt_nvfp4({"p.weight": q, "p.weight_scale": s}, "p")
    with pytest.raises(ValueError, match=r"^p\.weight_scale_2 \(global_scale\): expected a finite value, got nan"):
        load_modelopt_nvfp4({"p.weight": q, "p.weight_scale": s, "p.weight_scale_2": torch.tensor(float("nan"))}, "p")
    with pytest.raises(ValueError, match=r"^p\.weight_scale_2 \(global_scale\): expected dtype torch\.float32, got "
                                         r"torch\.float64"):
        load_modelopt_nvfp4({"p.weight": q, "p.weight_scale": s, "p.weight_scale_2": g.double()}, "p")
    # The stored reciprocal itself: 1 / 0 is inf, and 1 / inf a finite 0 that would zero the layer.
    for stored in (0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=r"^p\.weight_global_scale: expected a finite, nonzero value"):
            load_compressed_tensors_nvfp4({"p.weight_packed": q, "p.weight_scale": s,
                                           "p.weight_global_scale": torch.full((1,), stored)}, "p")
    with pytest.raises(ValueError, match=r"^p\.bias \(bias\): expected one of .* got torch\.float32"):
        load_compressed_tensors_nvfp4({"p.weight_packed": q, "p.weight_scale": s, "p.weight_global_scale": 1 / g,
                                       "p.bias": torch.zeros(32)}, "p")
    with pytest.raises(ValueError, match=r"^p\.weight_global_scale: expected one fp32 element"):
        load_compressed_tensors_nvfp4({"p.weight_packed": q, "p.weight_scale": s,
                                       "p.weight_global_scale": torch.ones(2)}, "p")
    with pytest.raises(ValueError, match=r"^p\.weight_scale \(weight_scale\): expected shape"):
        load_modelopt_nvfp4({"p.weight": q, "p.weight_scale": s[:, :2], "p.weight_scale_2": g}, "p")
    with pytest.raises(ValueError, match=r"^p\.weight_packed \(weight\): expected dtype"):
        load_compressed_tensors_nvfp4({"p.weight_packed": q.view(torch.int8), "p.weight_scale": s,
                                       "p.weight_global_scale": 1 / g}, "p")
    blocks = torch.zeros(2, 8, 4, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="^proj: "):
        load_gpt_oss_experts({}, "e", "up_proj")
    with pytest.raises(ValueError, match=r"^e\.down_proj_scales: expected shape \(2, 8, 4\)"):
        load_gpt_oss_experts({"e.down_proj_blocks": blocks, "e.down_proj_scales": torch.zeros(2, 8, 2)}, "e",
                             "down_proj")
    with pytest.raises(ValueError, match=r"^e\.down_proj_blocks: expected shape \(E, rows, K/32, 16\)"):
        load_gpt_oss_experts({"e.down_proj_blocks": blocks[..., :8], "e.down_proj_scales": torch.zeros(2, 8, 4)},
                             "e", "down_proj")
    with pytest.raises(ValueError, match=r"^e\.down_proj_blocks: expected a contiguous tensor"):
        load_gpt_oss_experts({"e.down_proj_blocks": blocks.transpose(0, 1).contiguous().transpose(0, 1),
                              "e.down_proj_scales": torch.zeros(2, 8, 4, dtype=torch.uint8)}, "e", "down_proj")
    with pytest.raises(ValueError, match=r"^e\.down_proj_blocks\[0\] \(weight\): expected dtype"):
        load_gpt_oss_experts({"e.down_proj_blocks": blocks.view(torch.int8),
                              "e.down_proj_scales": torch.zeros(2, 8, 4, dtype=torch.uint8)}, "e", "down_proj")
    with pytest.raises(ValueError, match=r"^e\.down_proj_bias\[0\] \(bias\): expected contiguous rows"):
        load_gpt_oss_experts({"e.down_proj_blocks": blocks,
                              "e.down_proj_scales": torch.zeros(2, 8, 4, dtype=torch.uint8),
                              "e.down_proj_bias": torch.zeros(8, 2, dtype=torch.bfloat16).t()}, "e", "down_proj")
    with pytest.raises(ValueError, match=r"^e\.down_proj_bias \(bias\): expected dtype torch\.bfloat16"):
        load_gpt_oss_experts({"e.down_proj_blocks": blocks,
                              "e.down_proj_scales": torch.zeros(2, 8, 4, dtype=torch.uint8),
                              "e.down_proj_bias": torch.zeros(2, 8)}, "e", "down_proj", stacked=True)
    with pytest.raises(ValueError, match=r"^e\.down_proj_scales \(weight_scale\): expected dtype"):
        load_gpt_oss_experts({"e.down_proj_blocks": blocks, "e.down_proj_scales": torch.zeros(2, 8, 4)}, "e",
                             "down_proj", stacked=True)
    with pytest.raises(ValueError, match=r"^e\.down_proj_bias: expected shape \(2, 8\)"):
        load_gpt_oss_experts({"e.down_proj_blocks": blocks, "e.down_proj_scales": torch.zeros(2, 8, 4),
                              "e.down_proj_bias": torch.zeros(8)}, "e", "down_proj")


def _tiny_model(dtype=torch.bfloat16):
    """Two quantizable projections under nested names, an activation, and an lm_head left unquantized."""
    torch.manual_seed(5)
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.layers[0].mlp = torch.nn.Sequential(torch.nn.Linear(128, 192), torch.nn.ReLU(),
                                              torch.nn.Linear(192, 64, bias=False))
    model.lm_head = torch.nn.Linear(64, 10, bias=False)
    return model.to(dtype)


def _forward(model, x):
    return model.lm_head(model.layers[0].mlp(x))


QUANTIZED = ("layers.0.mlp.0", "layers.0.mlp.2")  # the _tiny_model layers a checkpoint of it quantizes


def _checkpoint_of(model, style: str) -> dict:
    """The NVFP4 tensors of the QUANTIZED layers of `model` under a ModelOpt or compressed-tensors checkpoint's names
    (ModelOpt's 0-dim `weight_scale_2` and its unused `input_scale`; compressed-tensors' one-element reciprocal)."""
    tensors = {}
    for name in QUANTIZED:
        linear = model.get_submodule(name)
        q, s, g = quantize_nvfp4(linear.weight.detach().float().cpu())
        if style == "modelopt":
            tensors.update({f"{name}.weight": q, f"{name}.weight_scale": s, f"{name}.weight_scale_2": g,
                            f"{name}.input_scale": torch.tensor(0.01)})
        else:
            tensors.update({f"{name}.weight_packed": q, f"{name}.weight_scale": s,
                            f"{name}.weight_global_scale": (1.0 / g).reshape(1)})
        if linear.bias is not None:
            tensors[f"{name}.bias"] = linear.bias.detach().cpu().clone()
    return tensors


@pytest.mark.parametrize("style", ["modelopt", "compressed-tensors"])
def test_replace_linears_swaps_a_whole_model(tmp_path, style):
    """A model's Linear modules swapped for FP4Linear from a checkpoint file with the real tensor names: the
    quantized layers run the reference of the file's tensors (no copies), the lm_head the file does not quantize
    stays an nn.Linear with its own weights, and the model's output is the chain of those layers."""
    model = _tiny_model()
    sd = _roundtrip(tmp_path, _checkpoint_of(model, style))
    x = torch.randn(3, 128).to(torch.bfloat16)
    head = model.lm_head.weight
    assert replace_linears(model, sd) == list(QUANTIZED)
    first, second = model.layers[0].mlp[0], model.layers[0].mlp[2]
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight is head
    packed = "weight" if style == "modelopt" else "weight_packed"
    for layer, name in zip((first, second), QUANTIZED):
        assert isinstance(layer, FP4Linear) and layer.weight.data_ptr() == sd[f"{name}.{packed}"].data_ptr()
    assert first.bias is not None and second.bias is None
    h = torch.relu(linear_reference(x, first.weight, first.weight_scale, "nvfp4", first.global_scale, first.bias))
    want = torch.nn.functional.linear(
        linear_reference(h, second.weight, second.weight_scale, "nvfp4", second.global_scale), head)
    assert torch.equal(_forward(model, x), want)
    assert replace_linears(model, sd) == []  # nothing left to swap


def test_replace_linears_refuses_a_mismatched_layer(tmp_path):
    model = _tiny_model()
    q, s, g = quantize_nvfp4(torch.randn(192, 256))  # a 256 -> 192 layer where the model has 128 -> 192
    sd = _roundtrip(tmp_path, {"layers.0.mlp.0.weight": q, "layers.0.mlp.0.weight_scale": s,
                               "layers.0.mlp.0.weight_scale_2": g})
    with pytest.raises(ValueError, match=r"^layers\.0\.mlp\.0: the checkpoint's layer is 256 -> 192 features, the "
                                         r"model's Linear 128 -> 192"):
        replace_linears(model, sd)
    assert type(model.layers[0].mlp[0]) is torch.nn.Linear
    with pytest.raises(ValueError, match=r"^layers\.0\.mlp\.0\.weight_scale: not in the state dict"):
        replace_linears(_tiny_model(), {"layers.0.mlp.0.weight": q, "layers.0.mlp.0.weight_scale_2": g})
    with pytest.raises(ValueError, match=r"^model: is itself an nn\.Linear"):
        replace_linears(torch.nn.Linear(256, 192), {"weight": q, "weight_scale": s, "weight_scale_2": g})


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 16, 130])
def test_loaders_on_the_gpu(tmp_path, m):
    """Checkpoints loaded straight onto the GPU (safetensors' `device="cuda"`), as a server loads them: ModelOpt's 0-dim
    `weight_scale_2`, compressed-tensors' one-element reciprocal and gpt-oss's 4-D experts, run by the kernels
    against the reference of the file's tensors on the CPU."""
    from test_linear_op import _assert_kernel_close, module_args

    torch.manual_seed(4)
    n, k = 200, 2880
    q, s, g = quantize_nvfp4(torch.randn(n, k) * 0.02)
    qm, sm, _ = quantize_mxfp4(torch.randn(n, k) * 0.02)
    tensors = {"a.weight": q, "a.weight_scale": s, "a.weight_scale_2": g, "a.bias": torch.randn(n).to(torch.bfloat16),
               "b.weight_packed": q.clone(), "b.weight_scale": s.clone(), "b.weight_global_scale": (1.0 / g).reshape(1),
               "e.down_proj_blocks": torch.stack([qm.view(n, k // 32, 16), qm.flip(0).view(n, k // 32, 16)]),
               "e.down_proj_scales": torch.stack([sm, sm.flip(0)])}
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(tensors, str(path))
    sd = safetensors_torch.load_file(str(path), device="cuda")
    assert sd["a.weight_scale_2"].shape == () and sd["a.weight_scale_2"].is_cuda
    layers = [load_modelopt_nvfp4(sd, "a"), load_compressed_tensors_nvfp4(sd, "b"),
              *load_gpt_oss_experts(sd, "e", "down_proj")]
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    for layer in layers:
        assert layer.weight.is_cuda
        y = layer(x)
        assert y.shape == (m, n) and torch.equal(y, layer(x))
        _assert_kernel_close(y, module_args(layer, x))


@pytest.mark.gpu
@pytest.mark.parametrize("style", ["modelopt", "compressed-tensors"])
@pytest.mark.parametrize("m", [1, 7, 16, 130])
def test_replace_linears_on_the_gpu(tmp_path, style, m):
    """A model on the GPU swapped from a checkpoint file loaded with `device="cuda"`: each swapped layer holds the
    file's tensors and runs the kernels (checked against the reference of those tensors), the model's output is
    the chain of its layers, the same on a second call, and the same in a CUDA graph."""
    from test_linear_op import _assert_kernel_close, module_args

    model = _tiny_model().cuda()
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(_checkpoint_of(model, style), str(path))
    sd = safetensors_torch.load_file(str(path), device="cuda")
    assert replace_linears(model, sd) == list(QUANTIZED)
    packed = "weight" if style == "modelopt" else "weight_packed"
    x = torch.randn(m, 128, device="cuda").to(torch.bfloat16)
    h = x
    for name in QUANTIZED:
        layer = model.get_submodule(name)
        assert isinstance(layer, FP4Linear) and layer.weight.data_ptr() == sd[f"{name}.{packed}"].data_ptr()
        y = layer(h)
        _assert_kernel_close(y, module_args(layer, h))
        h = torch.relu(y) if name == QUANTIZED[0] else y
    y = _forward(model, x)
    assert torch.equal(y, model.lm_head(h)) and torch.equal(_forward(model, x), y)
    static_x = x.clone()
    _forward(model, static_x)  # warm-up on the capturing thread's stream, as CUDA graphs ask
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = _forward(model, static_x)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_y, y)
