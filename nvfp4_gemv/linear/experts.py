"""Routed fp4 experts: the linear of a mixture-of-experts layer at decode time, every routed (token, expert) pair in
one launch.

    y = fp4_experts_linear(x, weight, weight_scale, expert_ids, fmt, global_scale=None, bias=None)
    y[t, j] = x[t] · dequant(weight[expert_ids[t, j]])ᵀ (· global_scale[e]) (+ bias[e]),  e = expert_ids[t, j]

- x (T, K) bf16/fp16; expert_ids (T, top_k) int32 or int64 (a router's top-k indices as they come), on x's device;
  y (T, top_k, N) in x's dtype.
- weight (E, N, K/2) uint8 or float4_e2m1fn_x2, the experts stacked as checkpoints store them (gpt-oss's
  `*_blocks` [E, N, K/32, 16] viewed as (E, N, K/2)); weight_scale plain, (E, N, K/16) e4m3 for NVFP4 or
  (E, N, K/32) uint8/e8m0 for MXFP4. global_scale (NVFP4 only): None or (E,) fp32, one a expert. bias: None or
  (E, N) in x's dtype. Read in place, never copied.

On CUDA, up to EXPERTS_MAX_TOKENS tokens are one launch of `cute_kernels.linear_w4a16_experts` (the ids are read on
the device: no sync, so the call takes CUDA-graph capture and torch.compile). Where `kernels.experts_route` says,
the slots that name the same expert are grouped there, in runs of up to 8, so its weight is read once a run, not
once a slot: below RUNS_MIN_TOKENS found by a scan of the ids where `kernels.expert_group_for` says (from two
tokens, by the slots an expert and the expert's size), from it read from a run table made on the device before the
launch by one small kernel where the slots an expert reach RUNS_MIN_SHARE (runs of up to 16 from RUN_TILES_MIN_SLOTS
slots an expert on average). An id outside [0, E) gives NaN in its (t, j) row there, since checking it on the host
would need a sync. Past EXPERTS_MAX_TOKENS tokens (prefill), the ids are read on the host (one sync): each expert's
tokens go through `fp4_linear` together, so its weight is read once a call, and a bad id raises ValueError. Other
devices run the fp32 reference, which raises on a bad id as well. Each slot's result is within the same tolerance of
the reference as `fp4_linear`'s (the same kernel code, with the split `kernels.experts_config` gives the routed grid).
"""

from __future__ import annotations

import torch
from torch import nn

from nvfp4_gemv.linear.formats import ACTIVATION_DTYPES, K_ALIGN, WEIGHT_DTYPES, format_of
from nvfp4_gemv.linear.reference import dequantize
from nvfp4_gemv.linear.validate import PTR_ALIGN, _aligned, _device, _rows, _tensor

EXPERTS_OP_NAME = "nvfp4_gemv::fp4_experts_linear"
# Tokens a call takes in one routed launch; past it, each expert's tokens together through fp4_linear (the ids read on
# the host). At 32 and 64 tokens the routed launch took 1/9 to 1/96 of that path's wall time on an H100
# (BENCHMARKS.md, "Shared experts grouped on the device"); on the H200 the launch as routed from 64 tokens (the runs
# from a table) took 1/2.9 to 1/19 of it at 128 tokens and 1/1.9 to 1/19 at 256 ("The run table on the H200").
# Larger counts: not measured.
EXPERTS_MAX_TOKENS = 256
ID_DTYPES = (torch.int32, torch.int64)

__all__ = ["EXPERTS_MAX_TOKENS", "FP4Experts", "experts_reference", "fp4_experts_linear", "validate_experts"]


def validate_experts(x, weight, weight_scale, expert_ids, fmt, global_scale=None, bias=None, *,
                     check_pointers: bool | None = None) -> tuple[int, int, int, int, int]:
    """Check the operands of fp4_experts_linear from metadata alone; return (T, top_k, E, N, K). ValueError naming
    the tensor otherwise. check_pointers as validate_linear's (16-byte aligned weight and scales on CUDA)."""
    f = format_of(fmt)
    _tensor("weight", weight, WEIGHT_DTYPES)
    if weight.dim() != 3:
        raise ValueError(f"weight: expected 3 dimensions (E, N, K/2), the experts stacked, got shape "
                         f"{tuple(weight.shape)}")
    e, n, k = weight.shape[0], weight.shape[1], 2 * weight.shape[2]
    if e < 1 or n < 1 or k < 1 or k % K_ALIGN:
        raise ValueError(f"weight: expected shape (E, N, K/2) with E, N >= 1 and K a positive multiple of {K_ALIGN}, "
                         f"got {tuple(weight.shape)} (K = {k})")
    _rows("weight", weight)
    device = weight.device
    _tensor("weight_scale", weight_scale, f.scale_dtypes)
    if tuple(weight_scale.shape) != (e, n, k // f.block):
        raise ValueError(f"weight_scale: expected shape {(e, n, k // f.block)} ({f.name}, plain: (E, N, K/{f.block})) "
                         f"for E, N, K = {e}, {n}, {k} (from weight), got {tuple(weight_scale.shape)}")
    _rows("weight_scale", weight_scale)
    _device("weight_scale", weight_scale, device)
    if global_scale is not None:
        if not f.has_global:
            raise ValueError(f"global_scale: {f.name} has no tensor scale; expected None, got "
                             f"{type(global_scale).__name__}")
        _tensor("global_scale", global_scale, (torch.float32,), " (one a expert)")
        if tuple(global_scale.shape) != (e,):
            raise ValueError(f"global_scale: expected shape ({e},) (E, from weight), got {tuple(global_scale.shape)}")
        _rows("global_scale", global_scale, "; pass global_scale.contiguous()")
        _device("global_scale", global_scale, device)
    _tensor("x", x, ACTIVATION_DTYPES)
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x: expected shape (T, K) with K = {k} (from weight), got {tuple(x.shape)}")
    _device("x", x, device)
    _tensor("expert_ids", expert_ids, ID_DTYPES)
    if expert_ids.dim() != 2 or expert_ids.shape[0] != x.shape[0] or expert_ids.shape[1] < 1:
        raise ValueError(f"expert_ids: expected shape (T, top_k) with T = {x.shape[0]} (from x) and top_k >= 1, got "
                         f"{tuple(expert_ids.shape)}")
    _device("expert_ids", expert_ids, device)
    if bias is not None:
        _tensor("bias", bias, (x.dtype,), " (x's dtype)")
        if tuple(bias.shape) != (e, n):
            raise ValueError(f"bias: expected shape {(e, n)} (E, N, from weight), got {tuple(bias.shape)}")
        _rows("bias", bias, "; pass bias.contiguous()")
        _device("bias", bias, device)
    _aligned("weight", weight, check_pointers)
    _aligned("weight_scale", weight_scale, check_pointers)
    return x.shape[0], expert_ids.shape[1], e, n, k


def _by_expert(expert_ids: torch.Tensor, experts: int):
    """(order, spans): the slots sorted by expert, in slot order within one, and (expert, start, count) of every
    expert some slot names, its slots order[start:start + count]; read on the host (one sync). A ValueError naming
    expert_ids where an id is outside [0, E)."""
    ids = expert_ids.reshape(-1).long()
    bad = (ids < 0) | (ids >= experts)
    if bool(bad.any()):
        raise ValueError(f"expert_ids: expected values in [0, {experts}) (E, from weight), got "
                         f"{ids[bad][:4].tolist()}")
    order = torch.argsort(ids, stable=True)
    spans, start = [], 0
    for e, count in enumerate(torch.bincount(ids, minlength=experts).tolist()):
        if count:
            spans.append((e, start, count))
            start += count
    return order, spans


def _groups(expert_ids: torch.Tensor, experts: int):
    """(expert, token indices, slot indices) of every expert some slot names (`_by_expert`)."""
    order, spans = _by_expert(expert_ids, experts)
    top_k = expert_ids.shape[1]
    for e, start, count in spans:
        slots = order[start:start + count]
        yield e, slots // top_k, slots


def experts_reference(x, weight, weight_scale, expert_ids, fmt, global_scale=None, bias=None) -> torch.Tensor:
    """y (T, top_k, N) in fp32 a slot, rounded once to x's dtype: each named expert dequantized (`dequantize`), its
    tokens' x times it. The CPU implementation of the op and the tests' oracle."""
    t, top_k, e, n, _ = validate_experts(x, weight, weight_scale, expert_ids, fmt, global_scale, bias,
                                         check_pointers=False)
    y = torch.empty(t * top_k, n, dtype=torch.float32, device=x.device)
    for ex, tokens, slots in _groups(expert_ids, e):
        w = dequantize(weight[ex], weight_scale[ex], fmt, "plain", None if global_scale is None else global_scale[ex])
        ye = x[tokens].float() @ w.t()
        if bias is not None:
            ye = ye + bias[ex].float()
        y[slots] = ye
    return y.to(x.dtype).view(t, top_k, n)


def _kernel_scale(weight_scale: torch.Tensor) -> torch.Tensor:
    """The scales as the kernels take them: the dtypes they read as they are (op._KERNEL_SF_DTYPES), e8m0 viewed as
    uint8."""
    from nvfp4_gemv.linear.op import _KERNEL_SF_DTYPES

    if weight_scale.dtype in _KERNEL_SF_DTYPES:
        return weight_scale
    return weight_scale.view(torch.uint8)


class EagerExperts:
    """The eager CUDA path: validation and the launch bound once per metadata signature (T and the data not in it),
    then per call the pointers' alignment, y allocated, one launch (or, past EXPERTS_MAX_TOKENS tokens, one
    `fp4_linear` an expert named)."""

    def __init__(self, bind=None, max_tokens: int = EXPERTS_MAX_TOKENS):
        self._bind = bind  # None: kernels.bind_experts (imported on first use); tests pass a stand-in of its signature
        self.max_tokens = max_tokens  # past it, each expert's tokens through fp4_linear (the ids read on the host)
        self.launches: dict = {}

    def __call__(self, x, weight, weight_scale, expert_ids, fmt, global_scale, bias):
        args = (x, weight, weight_scale, expert_ids, fmt, global_scale, bias)
        try:
            # T (x's and expert_ids' first dim) is not in the signature; every other shape, stride and dtype is
            key = (fmt, x.dtype, x.shape[1:], x.device, expert_ids.dtype, expert_ids.shape[1:], expert_ids.device,
                   *((t.dtype, t.shape, t.stride(), t.device) if isinstance(t, torch.Tensor) else type(t)
                     for t in (weight, weight_scale, global_scale, bias)))
            launch = self.launches.get(key)
            if (launch is None or weight.data_ptr() % PTR_ALIGN or weight_scale.data_ptr() % PTR_ALIGN
                    or expert_ids.shape[0] != x.shape[0]):
                validate_experts(*args, check_pointers=True)
        except (AttributeError, IndexError, TypeError):
            validate_experts(*args)  # a non-tensor argument
            raise
        t, top_k = expert_ids.shape
        e, n, kb = weight.shape
        if t > self.max_tokens:
            if x.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
                raise ValueError(f"expert_ids: {t} tokens are grouped by expert on the host (a sync), which a CUDA "
                                 f"graph cannot capture; capture calls of at most {self.max_tokens} tokens")
            return self.grouped(*args)
        sf = _kernel_scale(weight_scale)
        if launch is None:
            bind = self._bind
            if bind is None:
                from nvfp4_gemv.linear.kernels import bind_experts as bind
            launch = self.launches[key] = bind(e, n, 2 * kb, x.device, x.dtype, sf.dtype, expert_ids.dtype, fmt,
                                               global_scale is not None, bias is not None)
        if not x.is_contiguous() or x.data_ptr() % PTR_ALIGN:
            x = x.clone(memory_format=torch.contiguous_format)
        out = torch.empty(t, top_k, n, dtype=x.dtype, device=x.device)
        if t:
            launch(out, x, weight if weight.dtype == torch.uint8 else weight.view(torch.uint8), sf, global_scale, bias,
                   expert_ids if expert_ids.is_contiguous() else expert_ids.contiguous())
        return out

    @staticmethod
    def grouped(x, weight, weight_scale, expert_ids, fmt, global_scale, bias):
        """Each expert's tokens through fp4_linear together (the ids read on the host): x's rows gathered once in
        expert order, each expert's run of them a contiguous slice, and the outputs put back in slot order once,
        so a named expert costs one fp4_linear call and no gather or scatter of its own.

        An expert's codes start PTR_ALIGN-aligned (N·K/2 bytes an expert, K a multiple of 64), but its scales need
        not: N·K/16 (NVFP4) or N·K/32 (MXFP4) bytes an expert is a multiple of 16 only for some N. Where expert e's
        scales are not, fp4_linear gets a copy of them (1/8 or 1/16 of its codes' bytes); the codes are never
        copied."""
        from nvfp4_gemv.linear.op import fp4_linear

        t, top_k = expert_ids.shape
        n = weight.shape[1]
        order, spans = _by_expert(expert_ids, weight.shape[0])
        xs = x[order // top_k]  # x's row of each slot, in expert order
        parts = [fp4_linear(xs[start:start + count], weight[ex], _aligned_copy(weight_scale[ex]), fmt,
                            None if global_scale is None else global_scale[ex:ex + 1],
                            None if bias is None else bias[ex]) for ex, start, count in spans]
        out = torch.empty(t * top_k, n, dtype=x.dtype, device=x.device)
        if parts:
            out[order] = torch.cat(parts)
        return out.view(t, top_k, n)


def _aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """t itself where its data is PTR_ALIGN-aligned, else a copy that is."""
    return t if t.data_ptr() % PTR_ALIGN == 0 else t.clone()


EAGER = EagerExperts()


@torch.library.custom_op(EXPERTS_OP_NAME, mutates_args=())
def fp4_experts_linear_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                          expert_ids: torch.Tensor, fmt: str, global_scale: torch.Tensor | None,
                          bias: torch.Tensor | None) -> torch.Tensor:
    """y[t, j] = x[t] · dequant(weight[expert_ids[t, j]])ᵀ; see `fp4_experts_linear`."""
    if x.device.type == "cuda":
        return EAGER(x, weight, weight_scale, expert_ids, fmt, global_scale, bias)
    return experts_reference(x, weight, weight_scale, expert_ids, fmt, global_scale, bias)


@fp4_experts_linear_op.register_fake
def _fp4_experts_linear_fake(x, weight, weight_scale, expert_ids, fmt, global_scale, bias):
    t, top_k, _, n, _ = validate_experts(x, weight, weight_scale, expert_ids, fmt, global_scale, bias,
                                         check_pointers=False)
    return x.new_empty((t, top_k, n))


def fp4_experts_linear(x, weight, weight_scale, expert_ids, fmt="mxfp4", global_scale=None, bias=None):
    """y (T, top_k, N) with y[t, j] = x[t] · dequant(weight[expert_ids[t, j]])ᵀ (+ bias[expert_ids[t, j]]): the
    module docstring says what each argument takes. Eager CUDA calls skip the dispatcher; under torch.compile the
    call is the op `nvfp4_gemv::fp4_experts_linear`."""
    if torch.compiler.is_compiling():
        return torch.ops.nvfp4_gemv.fp4_experts_linear(x, weight, weight_scale, expert_ids, fmt, global_scale, bias)
    grads = any(isinstance(a, torch.Tensor) and a.requires_grad for a in (x, global_scale, bias))
    if torch.is_grad_enabled() and grads:
        raise ValueError("fp4_experts_linear: no gradients are computed (an inference op); call it under "
                         "torch.no_grad() or torch.inference_mode(), or pass x, global_scale and bias detached")
    if isinstance(x, torch.Tensor) and x.device.type == "cuda":
        return EAGER(x, weight, weight_scale, expert_ids, fmt, global_scale, bias)
    return experts_reference(x, weight, weight_scale, expert_ids, fmt, global_scale, bias)


class FP4Experts(nn.Module):
    """The experts of one MoE projection as one module: `forward(x (T, K), expert_ids (T, top_k))` gives
    (T, top_k, N) through fp4_experts_linear (the routing weights and the sum over top_k are the caller's).

    Buffers `weight` (E, N, K/2), `weight_scale`, `global_scale` (NVFP4: (E,) fp32 or None) and `bias` ((E, N) in
    `dtype` or None) are the tensors given (views, never copied), checked as fp4_experts_linear takes them with x of
    `dtype`; the global scales are checked for NaN and infinity once, here."""

    def __init__(self, weight, weight_scale, fmt: str, global_scale=None, bias=None, dtype=torch.bfloat16):
        super().__init__()
        if dtype not in ACTIVATION_DTYPES:
            raise ValueError(f"dtype: expected one of {ACTIVATION_DTYPES} (the activations' dtype), got {dtype!r}")
        k = 2 * weight.shape[-1] if isinstance(weight, torch.Tensor) and weight.dim() else 0
        device = weight.device if isinstance(weight, torch.Tensor) else None
        x = torch.empty(0, k, dtype=dtype, device=device)
        _, _, self.experts, self.out_features, self.in_features = validate_experts(
            x, weight, weight_scale, torch.empty(0, 1, dtype=torch.int64, device=device), fmt, global_scale, bias)
        if global_scale is not None and global_scale.device.type != "meta":  # one read (a sync on CUDA)
            bad = (~torch.isfinite(global_scale)).nonzero().flatten().tolist()
            if bad:
                raise ValueError(f"global_scale: expected finite values, got {global_scale[bad[0]].item()!r} for "
                                 f"expert {bad[0]}")
        self.fmt = format_of(fmt).name
        for name, t in (("weight", weight), ("weight_scale", weight_scale), ("global_scale", global_scale),
                        ("bias", bias)):
            self.register_buffer(name, t)

    def forward(self, x, expert_ids):
        return fp4_experts_linear(x, self.weight, self.weight_scale, expert_ids, self.fmt, self.global_scale,
                                  self.bias)

    def path(self, tokens: int, top_k: int, dtype: torch.dtype | None = None) -> str:
        """Which kernel serves a call of `tokens` tokens routed to `top_k` experts each, with x in `dtype` (default:
        the bias's, else bf16), in words."""
        if dtype is None:
            dtype = self.bias.dtype if self.bias is not None else torch.bfloat16
        device = self.weight.device
        if device.type != "cuda":
            return f"reference ({device.type})"
        if tokens > EXPERTS_MAX_TOKENS:
            return (f"{tokens} tokens > {EXPERTS_MAX_TOKENS}: the ids read on the host (one sync), each named expert's "
                    f"tokens through fp4_linear together (FP4Linear.path of that many rows)")
        from nvfp4_gemv.linear import kernels

        index = device.index if device.index is not None else torch.cuda.current_device()
        return kernels.describe_experts(tokens, top_k, self.experts, self.out_features, self.in_features, self.fmt,
                                        dtype, self.bias is not None, self.global_scale is not None,
                                        kernels.sm_count(index))

    def extra_repr(self) -> str:
        return (f"experts={self.experts}, in_features={self.in_features}, out_features={self.out_features}, "
                f"fmt={self.fmt}, bias={self.bias is not None}")
