"""Build FP4Linear modules from checkpoint state dicts (name -> tensor, e.g. `safetensors.torch.load_file`).

Three layouts (../DECODE.md has them in full): ModelOpt NVFP4 (`weight`, `weight_scale`, `weight_scale_2`), the
compressed-tensors NVFP4 (`weight_packed`, `weight_scale`, `weight_global_scale` stored as the reciprocal) and the
gpt-oss MXFP4 experts (`*_blocks` [E, rows, K/32, 16], `*_scales` [E, rows, K/32]; a module per expert, or one
FP4Experts of them all); `replace_linears` swaps a
whole model's nn.Linear modules for the first two. The weight and scale tensors
of the state dict become the modules' buffers as they are (views, never copies), so they must already sit where
the modules will run. Tensor scales are checked for NaN and infinity here, once (compressed-tensors' stored
reciprocal as well, and for zero), and an error names the state dict's key (and the expert, for gpt-oss).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping

import torch
from torch import nn

from nvfp4_gemv.linear.experts import FP4Experts
from nvfp4_gemv.linear.module import FP4Linear, activation_dtype_of

__all__ = ["load_compressed_tensors_nvfp4", "load_gpt_oss_experts", "load_modelopt_nvfp4", "replace_linears"]


def _get(state_dict: Mapping, name: str) -> torch.Tensor:
    if name not in state_dict:
        raise ValueError(f"{name}: not in the state dict")
    return state_dict[name]


def _prefixed(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


@contextlib.contextmanager
def _keys_named(keys: Mapping[str, str]):
    """Within: a ValueError naming an argument (weight, weight_scale, global_scale, bias) names the checkpoint key
    that gave it instead (`keys` maps one to the other)."""
    try:
        yield
    except ValueError as e:
        arg, sep, rest = str(e).partition(": ")
        if sep and arg in keys:
            raise ValueError(f"{keys[arg]} ({arg}): {rest}") from None
        raise


def _module(keys: Mapping[str, str], *args) -> FP4Linear:
    """FP4Linear.from_quantized(*args), its errors naming the checkpoint's keys (_keys_named)."""
    with _keys_named(keys):
        return FP4Linear.from_quantized(*args)


def load_modelopt_nvfp4(state_dict: Mapping, prefix: str, dtype: torch.dtype = torch.bfloat16) -> FP4Linear:
    """FP4Linear from a ModelOpt NVFP4 layer: `{prefix}.weight` uint8 [N, K/2], `.weight_scale` e4m3 [N, K/16],
    `.weight_scale_2` fp32 scalar (the tensor scale), optional `.bias`. `.input_scale` (W4A4 only) is ignored.
    `dtype`: the activations' dtype where there is no bias."""
    name = lambda s: _prefixed(prefix, s)  # noqa: E731
    keys = {"weight": name("weight"), "weight_scale": name("weight_scale"), "global_scale": name("weight_scale_2"),
            "bias": name("bias")}
    return _module(
        keys, _get(state_dict, keys["weight"]), _get(state_dict, keys["weight_scale"]), "nvfp4",
        _get(state_dict, keys["global_scale"]), state_dict.get(keys["bias"]), "plain", dtype,
    )  # fmt: skip


def load_compressed_tensors_nvfp4(state_dict: Mapping, prefix: str,
                                  dtype: torch.dtype = torch.bfloat16) -> FP4Linear:
    """FP4Linear from a compressed-tensors NVFP4 layer: `{prefix}.weight_packed` uint8 [N, K/2], `.weight_scale`
    e4m3 [N, K/16], `.weight_global_scale` fp32 (one element), which stores 1 / the tensor scale, optional
    `.bias`."""
    name = lambda s: _prefixed(prefix, s)  # noqa: E731
    keys = {"weight": name("weight_packed"), "weight_scale": name("weight_scale"),
            "global_scale": name("weight_global_scale"), "bias": name("bias")}
    inverse = _get(state_dict, keys["global_scale"])
    if not isinstance(inverse, torch.Tensor) or inverse.dtype != torch.float32 or inverse.numel() != 1:
        got = f"{inverse.dtype}, shape {tuple(inverse.shape)}" if isinstance(inverse, torch.Tensor) else inverse
        raise ValueError(f"{keys['global_scale']}: expected one fp32 element, got {got}")
    if inverse.device.type != "meta":  # the stored value, not only its reciprocal: 1 / inf is a finite 0
        stored = float(inverse.detach().reshape(()).cpu())
        if not math.isfinite(stored) or stored == 0:
            raise ValueError(f"{keys['global_scale']}: expected a finite, nonzero value (1 / the tensor scale), got "
                             f"{stored!r}")
    return _module(
        keys, _get(state_dict, keys["weight"]), _get(state_dict, keys["weight_scale"]), "nvfp4", 1.0 / inverse,
        state_dict.get(keys["bias"]), "plain", dtype,
    )  # fmt: skip


def load_gpt_oss_experts(state_dict: Mapping, prefix: str, proj: str, dtype: torch.dtype = torch.bfloat16,
                         stacked: bool = False) -> list[FP4Linear] | FP4Experts:
    """One FP4Linear per expert of a gpt-oss MXFP4 projection: `{prefix}.{proj}_blocks` uint8 [E, rows, K/32, 16]
    and `{prefix}.{proj}_scales` uint8 [E, rows, K/32], with `proj` "gate_up_proj" or "down_proj", and the
    optional `{prefix}.{proj}_bias` [E, rows]. With `stacked`, one FP4Experts of all of them instead (blocks viewed
    as (E, rows, K/2)): a decode step's routed slots in one launch (`fp4_experts_linear`).

    Expert e's weight is blocks[e] viewed as (rows, K/2) and its scales scales[e]: views of the state dict's
    tensors, no copy. Each expert's bytes start 16-byte aligned on CUDA only if rows·K/32 is a multiple of 16
    (true of gpt-oss's 2880 and 5760 rows). gate_up_proj stores the gate and up rows interleaved (gate on even
    rows, up on odd); the module computes over the rows as stored and does not reorder them.
    """
    if proj not in ("gate_up_proj", "down_proj"):
        raise ValueError(f"proj: expected 'gate_up_proj' or 'down_proj', got {proj!r}")
    blocks_name, scales_name = _prefixed(prefix, f"{proj}_blocks"), _prefixed(prefix, f"{proj}_scales")
    blocks, scales = _get(state_dict, blocks_name), _get(state_dict, scales_name)
    bias_name = _prefixed(prefix, f"{proj}_bias")
    bias = state_dict.get(bias_name)
    if not isinstance(blocks, torch.Tensor) or blocks.dim() != 4 or blocks.shape[-1] != 16:
        got = tuple(blocks.shape) if isinstance(blocks, torch.Tensor) else type(blocks).__name__
        raise ValueError(f"{blocks_name}: expected shape (E, rows, K/32, 16), got {got}")
    experts, rows, kb, _ = blocks.shape
    if not blocks.is_contiguous():
        raise ValueError(f"{blocks_name}: expected a contiguous tensor (experts are viewed, not copied), got "
                         f"strides {blocks.stride()}")
    if not isinstance(scales, torch.Tensor) or tuple(scales.shape) != (experts, rows, kb):
        got = tuple(scales.shape) if isinstance(scales, torch.Tensor) else type(scales).__name__
        raise ValueError(f"{scales_name}: expected shape {(experts, rows, kb)} (from {blocks_name}), got {got}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (experts, rows)):
        got = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise ValueError(f"{bias_name}: expected shape {(experts, rows)}, got {got}")
    if stacked:
        with _keys_named({"weight": blocks_name, "weight_scale": scales_name, "bias": bias_name}):
            return FP4Experts(blocks.view(experts, rows, kb * 16), scales, "mxfp4", None, bias, dtype)
    return [
        _module({"weight": f"{blocks_name}[{e}]", "weight_scale": f"{scales_name}[{e}]", "bias": f"{bias_name}[{e}]"},
                blocks[e].view(rows, kb * 16), scales[e], "mxfp4", None, None if bias is None else bias[e], "plain",
                dtype)
        for e in range(experts)
    ]  # fmt: skip


def replace_linears(model: nn.Module, state_dict: Mapping, dtype: torch.dtype | None = None) -> list[str]:
    """Swap every nn.Linear of `model` whose layer `state_dict` holds as NVFP4 for an FP4Linear over the state dict's
    tensors (no copies), in place; return the swapped modules' names. A layer `name` is ModelOpt's where
    `{name}.weight_scale_2` is present (load_modelopt_nvfp4), compressed-tensors' where `{name}.weight_packed` is
    (load_compressed_tensors_nvfp4); other Linear modules (an unquantized lm_head, say) stay as they are, and their
    weights are not loaded here. The bias is the state dict's `{name}.bias`, if any. `dtype`: the activations' dtype,
    by default the Linear's own where that is bf16 or fp16, else bf16. The new modules live where the state dict's
    tensors do (load it onto the GPU to run there). A checkpoint layer whose (in, out) features differ from its
    Linear's raises ValueError naming both."""
    swapped = []
    for name, linear in list(model.named_modules()):
        if not isinstance(linear, nn.Linear):
            continue
        if _prefixed(name, "weight_scale_2") in state_dict:
            load = load_modelopt_nvfp4
        elif _prefixed(name, "weight_packed") in state_dict:
            load = load_compressed_tensors_nvfp4
        else:
            continue
        if not name:
            raise ValueError("model: is itself an nn.Linear, which cannot be swapped in place; build its FP4Linear "
                             "with load_modelopt_nvfp4 or load_compressed_tensors_nvfp4 (prefix '')")
        layer = load(state_dict, name, dtype or activation_dtype_of(linear))
        if (layer.in_features, layer.out_features) != (linear.in_features, linear.out_features):
            raise ValueError(f"{name}: the checkpoint's layer is {layer.in_features} -> {layer.out_features} "
                             f"features, the model's Linear {linear.in_features} -> {linear.out_features}")
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, layer)
        swapped.append(name)
    return swapped
