"""The fp4 W4A16 decode linear: y = x · dequant(W)ᵀ (+ bias), x bf16/fp16, W NVFP4 or MXFP4 as checkpoints store it.

    from nvfp4_gemv.linear import FP4Linear, fp4_linear, load_modelopt_nvfp4

    y = fp4_linear(x, weight, weight_scale, "nvfp4", global_scale, bias)   # eager, torch.compile, CUDA graphs
    y = fp4_experts_linear(x, experts_w, experts_scale, expert_ids, "mxfp4")  # routed MoE experts, one launch
    layer = FP4Linear.from_linear(nn_linear, "mxfp4")                      # a drop-in for nn.Linear

Modules: `formats` (the two formats as data), `validate` (metadata checks), `reference` (fp32 dequantize and
linear), `op` (the torch op and the eager path), `experts` (routed experts of a MoE layer), `module` (FP4Linear),
`quantize`, `loaders` (ModelOpt, compressed-tensors, gpt-oss; `replace_linears` for a whole model), and on CUDA
`kernels` (the fp4 kernel's config and launch) and `prefill` (from 128 tokens: W dequantized in chunks, then
cuBLAS). The CUDA kernels load on the first CUDA call; importing this package imports no CuTe DSL.
"""

from nvfp4_gemv.linear.experts import FP4Experts, fp4_experts_linear
from nvfp4_gemv.linear.loaders import (
    load_compressed_tensors_nvfp4,
    load_gpt_oss_experts,
    load_modelopt_nvfp4,
    replace_linears,
)
from nvfp4_gemv.linear.module import FP4Linear
from nvfp4_gemv.linear.op import fp4_linear
from nvfp4_gemv.linear.quantize import quantize_mxfp4, quantize_nvfp4
from nvfp4_gemv.linear.reference import dequantize, linear_reference
from nvfp4_gemv.linear.validate import validate_linear

__all__ = [
    "FP4Experts",
    "FP4Linear",
    "dequantize",
    "fp4_experts_linear",
    "fp4_linear",
    "linear_reference",
    "load_compressed_tensors_nvfp4",
    "load_gpt_oss_experts",
    "load_modelopt_nvfp4",
    "quantize_mxfp4",
    "quantize_nvfp4",
    "replace_linears",
    "validate_linear",
]
