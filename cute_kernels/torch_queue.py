"""The kernels launched on torch's current CUDA stream, through TVM-FFI's environment stream: the library's path.

A kernel class's own `__call__` launches on the default stream, which is what the contest runs on and all that the
single-file submission needs (GPU MODE refuses any submission whose text contains the word for a CUDA queue, so the
generated file must not include this module). Library calls must follow torch's current stream instead, so that
they order with torch work on side streams and can be captured into CUDA graphs. The subclasses below add that one
argument and reuse each kernel's `build`.
"""

from __future__ import annotations

import functools

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_fake_stream

from cute_kernels import gemv_simt, gemv_tc_sm100, gemv_tma


class _OnTorchStream:
    """Mixin for a kernel class with `build(mA, mB, mSFA, mSFB, mC)`: launch on the stream passed in."""

    @cute.jit
    def __call__(self, mA, mB, mSFA, mSFB, mC, stream):
        launcher, shape = self.build(mA, mB, mSFA, mSFB, mC)
        launcher.launch(**shape, stream=stream)


class GemvSimtOnTorchStream(_OnTorchStream, gemv_simt.GemvSimt):
    pass


class GemvTmaOnTorchStream(_OnTorchStream, gemv_tma.GemvTma):
    pass


class GemvTcSm100OnTorchStream(gemv_tc_sm100.GemvTcSm100):
    @cute.jit
    def __call__(self, mA, mB, mSFA, mSFB, mC, mPartial, mArrival, num_ctas: cutlass.Int32, stream):
        launcher, shape = self.build(mA, mB, mSFA, mSFB, mC, mPartial, mArrival, num_ctas)
        launcher.launch(**shape, stream=stream)


def _env_stream():
    return make_fake_stream(use_tvm_ffi_env_stream=True)


def _compile_on_stream(kernel, sf_kind: str, gpu_arch: str):
    return cute.compile(
        kernel, *gemv_simt.fake_operands(sf_kind), _env_stream(), options=gemv_simt.compile_options(gpu_arch)
    )


@functools.lru_cache(maxsize=None)
def compile_simt(config: gemv_simt.GemvSimtConfig, gpu_arch: str = ""):
    """`gemv_simt.compile`, launching on torch's current stream."""
    return _compile_on_stream(GemvSimtOnTorchStream(config), config.sf_kind, gpu_arch)


@functools.lru_cache(maxsize=None)
def compile_tma(config: gemv_tma.GemvTmaConfig, gpu_arch: str = ""):
    """`gemv_tma.compile`, launching on torch's current stream."""
    return _compile_on_stream(GemvTmaOnTorchStream(config), "permuted", gpu_arch)


@functools.lru_cache(maxsize=None)
def compile_tc(config: gemv_tc_sm100.GemvTcSm100Config = gemv_tc_sm100.GemvTcSm100Config(), arch: str = "sm_100a"):
    """`gemv_tc_sm100.compile_for`, launching on torch's current stream."""
    return gemv_tc_sm100.compile_for(config, arch, kernel_cls=GemvTcSm100OnTorchStream, extra_args=(_env_stream(),))


def gemv_tc_on_torch_stream(a, b, sfa_permuted, sfb_permuted, c):
    """The tensor-core GEMV on torch's current stream (workspace handling as in `gemv_tc_sm100.gemv_tc_sm100`)."""
    return gemv_tc_sm100.gemv_tc_sm100(
        a, b, sfa_permuted, sfb_permuted, c, launcher=_tc_launcher(gemv_tc_sm100.GemvTcSm100Config())
    )


@functools.lru_cache(maxsize=None)
def _tc_launcher(config):
    return compile_tc(config).__tvm_ffi_object__()
