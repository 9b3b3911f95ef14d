"""The fp4 W4A16 linear as a torch custom op, `nvfp4_gemv::fp4_linear`, and `fp4_linear`, the entry to call.

`torch.ops.nvfp4_gemv.fp4_linear(x, weight, weight_scale, fmt, scale_layout, global_scale, bias) -> y` returns a
new y (no arguments mutated), so torch.compile(fullgraph=True) and CUDA-graph capture take it as it is. Its fake
implementation validates from metadata and returns an empty y of the right shape and dtype, so bad input fails
while tracing. CUDA runs the kernel (`EagerLinear`, below); other devices run the fp32 reference.

`fp4_linear` calls the op while torch.compile traces. In eager mode a CUDA call skips the dispatcher: `EagerLinear`
validates and binds the launch once per metadata signature (as nvfp4_gemv.dispatch does), then per call checks two
pointers' alignment, allocates y and launches. A python-float global_scale reaches the kernel as a cached 1-element
fp32 device tensor (a first call with a new value copies it to the device, so warm up before capturing a CUDA graph);
under torch.compile it becomes a 1-element tensor in the graph, one graph for every value the compiler makes symbolic,
and is not checked for NaN or infinity there (a tensor scale, as FP4Linear and the loaders hold, is checked when they
are built). Other devices run the reference, a float kept as a float; called eagerly on the CPU, a tensor scale's
value is checked there per call too (reading a CPU scalar costs nothing).

Gradients: the op has an autograd formula for x, bias and a tensor global scale (`_backward`: W dequantized by the
reference in row chunks, fp32 sums), so a frozen fp4 layer can sit under trained adapters, in eager mode and under
torch.compile. An eager CUDA call whose x or bias requires grad (with grad mode on) goes through the op for that; the
CPU path is the reference, which autograd follows as it is.

Autocast: under `torch.autocast` for x's device, `fp4_linear` (and so FP4Linear) casts x and the bias to autocast's
dtype first, as nn.Linear's inputs are cast; the op itself takes bf16/fp16 x only.
"""

from __future__ import annotations

import numbers

import torch

from nvfp4_gemv.linear.formats import ACTIVATION_DTYPES, format_of
from nvfp4_gemv.linear.reference import dequantize, linear_reference
from nvfp4_gemv.linear.validate import PTR_ALIGN, check_global_scale, check_global_scale_value, validate_linear

OP_NAME = "nvfp4_gemv::fp4_linear"
__all__ = ["OP_NAME", "EagerLinear", "fp4_linear", "fp4_linear_op"]


def _meta(t):
    """What validation of an optional argument depends on: its kind, and a tensor's metadata."""
    if isinstance(t, torch.Tensor):
        return t.dtype, t.shape, t.stride(), t.device
    return type(t)


_KERNEL_SF_DTYPES = (torch.uint8, torch.float8_e4m3fn)  # scale dtypes the kernel takes as they are (no view)


class EagerLinear:
    """The eager CUDA path: validation and launch binding cached per metadata signature, then one allocation (y)
    and one launch.

    `launch` is None for the kernels (`nvfp4_gemv.linear.kernels.bind`, imported on first use) or, in tests, a
    stand-in with the signature of `kernels.run`: `(out2d, x2d, weight_u8, scale, fmt, scale_layout,
    global_scale, bias)`. A signature holds the format, layout, x's dtype, device and K, and the dtype, shape,
    strides and device of every other tensor (a float global_scale only as "a float": its finiteness is checked per
    call). M is not in it, so a new number of tokens costs no validation. Per call: the alignment of weight and
    weight_scale (their addresses are not in the signature), and x made contiguous and 16-byte aligned if it is not
    (activations may be copied).
    """

    def __init__(self, launch=None):
        self._launch = launch
        self.launches: dict = {}  # signature -> launch(out2d, x2d, weight, weight_scale, global_scale, bias)
        self.scale_tensors: dict = {}  # (float value, device) -> 1-element fp32 tensor on that device

    def bind(self, x, weight, weight_scale, fmt, scale_layout, global_scale, bias):
        """The launch of a validated signature, taking weight and weight_scale as the caller passed them (the views
        the kernel reads them through are fixed by their dtypes, which the signature holds)."""
        w_view = weight.dtype != torch.uint8
        sf_view = weight_scale.dtype not in _KERNEL_SF_DTYPES
        if self._launch is not None:
            stand_in = self._launch

            def launch(out, x2d, w, sf, gs, b):
                stand_in(out, x2d, w, sf, fmt, scale_layout, gs, b)
        else:
            from nvfp4_gemv.linear import kernels

            launch = kernels.bind(weight.shape[0], x.shape[-1], x.device, x.dtype,
                                  torch.uint8 if sf_view else weight_scale.dtype, fmt, scale_layout,
                                  global_scale is not None, bias is not None)
        if not (w_view or sf_view):
            return launch

        def viewed(out, x2d, w, sf, gs, b):
            launch(out, x2d, w.view(torch.uint8) if w_view else w, sf.view(torch.uint8) if sf_view else sf, gs, b)

        return viewed

    def scale_tensor(self, value, device: torch.device) -> torch.Tensor:
        """The cached 1-element fp32 tensor holding the float `value` on `device`."""
        t = self.scale_tensors.get((value, device))
        if t is None:
            t = torch.full((1,), float(value), dtype=torch.float32, device=device)
            self.scale_tensors[(value, device)] = t
        return t

    def __call__(self, x, weight, weight_scale, fmt, global_scale, bias, scale_layout):
        try:
            shape, w_shape = x.shape, weight.shape
            k, device = shape[-1], x.device
            key = (fmt, scale_layout, x.dtype, device, k, weight.dtype, w_shape, weight.stride(), weight.device,
                   weight_scale.dtype, weight_scale.shape, weight_scale.stride(), weight_scale.device,
                   None if global_scale is None else _meta(global_scale), None if bias is None else _meta(bias))
            launch = self.launches.get(key)
            if launch is None:
                validate_linear(x, weight, weight_scale, fmt, scale_layout, global_scale, bias, check_pointers=True)
                launch = self.launches[key] = self.bind(x, weight, weight_scale, fmt, scale_layout, global_scale,
                                                        bias)
            if weight.data_ptr() % PTR_ALIGN or weight_scale.data_ptr() % PTR_ALIGN:
                validate_linear(x, weight, weight_scale, fmt, scale_layout, global_scale, bias, check_pointers=True)
        except (AttributeError, IndexError, TypeError):
            validate_linear(x, weight, weight_scale, fmt, scale_layout, global_scale, bias)  # a non-tensor argument
            raise
        if global_scale is not None and not isinstance(global_scale, torch.Tensor):
            # NaN or infinite, or a number that is not a float (an int past fp64's range; the signature holds only
            # its type)
            if type(global_scale) is not float or global_scale - global_scale != 0:
                check_global_scale(format_of(fmt), global_scale)
            global_scale = self.scale_tensor(global_scale, device)
        n = w_shape[0]
        flat = len(shape) == 2
        x2d = x if flat else x.reshape(x.numel() // k, k)
        if not x2d.is_contiguous() or x2d.data_ptr() % PTR_ALIGN:
            x2d = x2d.clone(memory_format=torch.contiguous_format)
        m = x2d.shape[0]
        out = torch.empty(m, n, dtype=x.dtype, device=device)  # sizes as arguments: faster than a tuple
        if m:
            launch(out, x2d, weight, weight_scale, global_scale, bias)
        return out if flat else out.view(*shape[:-1], n)


EAGER = EagerLinear()


@torch.library.custom_op(OP_NAME, mutates_args=())
def fp4_linear_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, fmt: str, scale_layout: str,
                  global_scale: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """y = x · dequant(weight)ᵀ (+ bias) in x's dtype; see `fp4_linear`."""
    if isinstance(x, torch.Tensor) and x.device.type == "cuda":
        if x.requires_grad or (isinstance(bias, torch.Tensor) and bias.requires_grad):  # autograd is above this
            x, bias = x.detach(), None if bias is None else bias.detach()
        return EAGER(x, weight, weight_scale, fmt, global_scale, bias, scale_layout)
    return linear_reference(x, weight, weight_scale, fmt, global_scale, bias, scale_layout)


@fp4_linear_op.register_fake
def _fp4_linear_fake(x, weight, weight_scale, fmt, scale_layout, global_scale, bias):
    validate_linear(x, weight, weight_scale, fmt, scale_layout, global_scale, bias, check_pointers=False)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


GRAD_CHUNK_BYTES = 64 << 20  # fp32 rows of W dequantized at a time by the backward (temporaries: about 3x that)


def _setup_context(ctx, inputs, output):
    x, weight, weight_scale, fmt, scale_layout, global_scale, bias = inputs
    scale_grad = isinstance(global_scale, torch.Tensor) and global_scale.requires_grad
    ctx.save_for_backward(weight, weight_scale, global_scale, x if scale_grad else None)
    ctx.meta = (fmt, scale_layout, x.dtype)


def _backward(ctx, grad):
    """dy -> (dx, d global_scale, dbias): dx = dy · dequant(W) with fp32 sums, W dequantized by the reference in
    chunks of 128-row multiples (at most GRAD_CHUNK_BYTES of fp32), rounded once to x's dtype; a tensor global scale
    that requires grad gets the sum of dy · (x · W without it)ᵀ; dbias = dy summed over the rows. The fp4 tensors
    get none. For adapters trained on a frozen fp4 layer; not a fast path."""
    weight, weight_scale, global_scale, x = ctx.saved_tensors
    fmt, scale_layout, x_dtype = ctx.meta
    n, k = weight.shape[0], 2 * weight.shape[1]
    dy = grad.reshape(-1, n).float()
    want_x, want_scale = ctx.needs_input_grad[0], ctx.needs_input_grad[5]
    acc = torch.zeros(dy.shape[0], k, dtype=torch.float32, device=grad.device) if want_x else None
    d_scale = torch.zeros((), dtype=torch.float32, device=grad.device) if want_scale else None
    xs = x.reshape(-1, k).float() if want_scale else None
    if want_x or want_scale:
        rows = max(128, GRAD_CHUNK_BYTES // (4 * k) // 128 * 128)
        for n0 in range(0, n, rows):
            n1 = min(n, n0 + rows)
            sf_rows = n1 - n0 if scale_layout == "plain" else -(-(n1 - n0) // 128) * 128  # a slice of 128-row atoms
            w_rows, sf_slice = weight[n0:n1], weight_scale[n0:n0 + sf_rows]
            if want_x:
                acc.addmm_(dy[:, n0:n1], dequantize(w_rows, sf_slice, fmt, scale_layout, global_scale.detach()
                                                    if global_scale is not None else None))
            if want_scale:
                w0 = dequantize(w_rows, sf_slice, fmt, scale_layout, None)
                d_scale += (dy[:, n0:n1] * (xs @ w0.t())).sum()
    dx = acc.to(x_dtype).reshape(*grad.shape[:-1], k) if want_x else None
    d_scale = d_scale.reshape(global_scale.shape) if want_scale else None
    db = dy.sum(0).to(grad.dtype) if ctx.needs_input_grad[6] else None
    return dx, None, None, None, None, d_scale, db


fp4_linear_op.register_autograd(_backward, setup_context=_setup_context)


_AUTOCAST_DEVICES = ("cuda", "cpu")  # where x's device type can hold an autocast state (meta cannot be asked)


def _autocast(x, bias, device_type: str):
    """x and the bias in the dtype torch.autocast gives x's device type, where that is bf16 or fp16 (nn.Linear's
    inputs are cast the same way)."""
    dtype = torch.get_autocast_dtype(device_type)
    if dtype in ACTIVATION_DTYPES:
        if x.is_floating_point() and x.dtype != dtype:
            x = x.to(dtype)
        if isinstance(bias, torch.Tensor) and bias.is_floating_point() and bias.dtype != dtype:
            bias = bias.to(dtype)
    return x, bias


def fp4_linear(x, weight, weight_scale, fmt="nvfp4", global_scale=None, bias=None, scale_layout="plain"):
    """y = x · dequant(weight)ᵀ (+ bias): x (..., K) bf16/fp16 -> y (..., N) in x's dtype.

    weight (N, K/2) uint8 or float4_e2m1fn_x2, fp4 e2m1 codes with the even k in the low nibble. fmt "nvfp4":
    weight_scale float8_e4m3fn, (N, K/16) for scale_layout "plain" or the 128x4-atom buffer for "swizzled", and
    global_scale None, a float or a 1-element fp32 tensor. fmt "mxfp4": weight_scale uint8 or float8_e8m0fnu
    (N, K/32), no global_scale. bias None or (N,) in x's dtype. Bad input raises ValueError naming the tensor
    (under torch.compile, wrapped in the tracer's error). Weights are read in place; x may be copied.

    Where N is a multiple of 128, plain and swizzled NVFP4 scales have the same shape, so only `scale_layout` says
    which the buffer holds: a wrong one cannot be told from the tensors and gives wrong numbers. Under
    torch.autocast, x and the bias are first cast to autocast's dtype for x's device (bf16 or fp16), as nn.Linear's.
    """
    device_type = x.device.type if isinstance(x, torch.Tensor) else None
    if device_type in _AUTOCAST_DEVICES and torch.is_autocast_enabled(device_type):
        x, bias = _autocast(x, bias, device_type)
        with torch.autocast(device_type, enabled=False):  # the reference's and the GEMM path's fp32 sums stay fp32
            return fp4_linear(x, weight, weight_scale, fmt, global_scale, bias, scale_layout)
    if torch.compiler.is_compiling():
        if isinstance(global_scale, numbers.Real) and not isinstance(global_scale, bool):
            if not format_of(fmt).has_global:
                check_global_scale(format_of(fmt), global_scale)  # raises: the format has no tensor scale
            # A tensor op on the number, and no branch on its value: the compiler may make a float input symbolic,
            # and any test of it in Python would pin it (one recompile per value, a hard failure past the cache
            # limit with fullgraph=True). So no NaN check here: a NaN or infinite scale gives NaN or inf outputs.
            global_scale = torch.ones((1,), dtype=torch.float32, device=x.device) * global_scale
        return torch.ops.nvfp4_gemv.fp4_linear(x, weight, weight_scale, fmt, scale_layout, global_scale, bias)
    if device_type == "cuda":
        # Inputs that need grad go through the op, which autograd knows (_backward); the kernel still runs forward.
        if torch.is_grad_enabled() and (x.requires_grad or (isinstance(bias, torch.Tensor) and bias.requires_grad) or (
                isinstance(global_scale, torch.Tensor) and global_scale.requires_grad)):
            if global_scale is not None and not isinstance(global_scale, torch.Tensor):
                check_global_scale(format_of(fmt), global_scale)
                global_scale = EAGER.scale_tensor(float(global_scale), x.device)
            return torch.ops.nvfp4_gemv.fp4_linear(x, weight, weight_scale, fmt, scale_layout, global_scale, bias)
        return EAGER(x, weight, weight_scale, fmt, global_scale, bias, scale_layout)
    if isinstance(global_scale, torch.Tensor) and global_scale.device.type == "cpu" and global_scale.numel() == 1:
        check_global_scale_value(global_scale)  # free here; a CUDA scalar would synchronize, so the module checks it
    return linear_reference(x, weight, weight_scale, fmt, global_scale, bias, scale_layout)
