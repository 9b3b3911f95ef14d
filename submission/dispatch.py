"""Arch dispatch and the cheap per-call path of `custom_kernel`, shared by the library and the contest submission.

A `Dispatcher` holds a `Launchers` (how to compile each kernel: following torch's current CUDA queue for the
library, `submission.kernel`; on the default queue for the single-file submission, `submission.contest`) and a
cache of compiled kernels. The first call with a new shape signature validates the whole tuple (submission.validate) and
picks and compiles a kernel for the device's compute capability; later calls make one launch through the compiled
TVM-FFI function, whose own argument checks (alignment included) guard the launch. Nothing is allocated per call.

Dispatch: sm_90 (H200/H100) -> the CUDA-core kernel with the prmt/dp4a decode; sm_100 family (B200/GB200) -> the
tcgen05 block-scaled tensor-core kernel by default, or the CUDA-core kernel with the hardware fp4 decode
(`NVFP4_GEMV_SM100=simt` or `sm100_variant="simt"`). Any other device is refused with a clear error.
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

import torch

from cute_kernels import gemv_simt, gemv_tc_sm100
from submission.validate import validate_inputs

SM100_VARIANTS = ("tc", "simt")
_DEFAULT_SM100 = "tc"


# (largest K, warps, r_lanes, unroll): the fastest graph-timed configs on the H200 (2026-11-29, BENCHMARKS.md) for
# the three benchmark shapes, K = 2048, 7168, 16384; warps × r_lanes small enough that M·L / (4·r_lanes) CTAs
# fill 132 SMs several times over. A later 18-config sweep (all of warps 2/4/8 × r_lanes 2/4/8 × unroll 2/4) kept
# the other two rows and moved K <= 2048 from (4, 8, 4) to (2, 4, 4): 11.50 against 11.94 µs.
SIMT_TABLE = (
    (2048, 2, 4, 4),
    (8192, 2, 2, 2),
    (None, 4, 2, 4),
)


def simt_config_for(m: int, k: int, l: int, arch: str = "sm_90", sf_kind: str = "permuted"):  # noqa: E741
    """The CUDA-core kernel's config for a shape: the first row of SIMT_TABLE whose K bound holds."""
    for k_max, warps, r_lanes, unroll in SIMT_TABLE:
        if k_max is None or k <= k_max:
            return gemv_simt.GemvSimtConfig(arch=arch, sf_kind=sf_kind, warps=warps, r_lanes=r_lanes, unroll=unroll)
    raise AssertionError("SIMT_TABLE ends with a catch-all row")


class Launchers(NamedTuple):
    """simt(config) -> compiled CUDA-core kernel; tc -> callable (a, b, sfa_permuted, sfb_permuted, c)."""

    simt: Callable
    tc: Callable


DEFAULT_QUEUE = Launchers(simt=gemv_simt.compile, tc=gemv_tc_sm100.gemv_tc_sm100)


def _require(can_implement, m: int, k: int, l: int):  # noqa: E741
    if not can_implement(m, k, l):
        raise ValueError(
            f"a: (M, K, L) = ({m}, {k}, {l}) is beyond what {can_implement.__qualname__.split('.')[0]} takes: "
            f"{can_implement.__doc__.splitlines()[0] if can_implement.__doc__ else ''}"
        )


def _raw(compiled):
    # The TVM-FFI function without the DSL's Python kwargs shim (a few µs per call saved).
    return compiled.__tvm_ffi_object__()


class Dispatcher:
    def __init__(self, launchers: Launchers):
        self.launchers = launchers
        self.kernels: dict[tuple, Callable] = {}
        self._capability: dict[int, tuple[int, int]] = {}

    def select(self, capability: tuple[int, int], m: int, k: int, l: int, sf_kind: str = "permuted",  # noqa: E741
               sm100_variant: str | None = None) -> Callable:
        """The compiled kernel for this device and shape: a callable (a, b, sf_a, sf_b, c)."""
        major = capability[0]
        if major == 9:
            _require(gemv_simt.GemvSimt.can_implement, m, k, l)
            return _raw(self.launchers.simt(simt_config_for(m, k, l, "sm_90", sf_kind)))
        if major == 10:
            variant = sm100_variant or os.environ.get("NVFP4_GEMV_SM100", _DEFAULT_SM100)
            if variant not in SM100_VARIANTS:
                raise ValueError(f"sm100_variant: expected one of {SM100_VARIANTS}, got {variant!r}")
            if variant == "simt" or sf_kind != "permuted":
                _require(gemv_simt.GemvSimt.can_implement, m, k, l)
                return _raw(self.launchers.simt(simt_config_for(m, k, l, "sm_100", sf_kind)))
            _require(gemv_tc_sm100.GemvTcSm100.can_implement, m, k, l)
            # Sizes its split-K workspace per call: a Python wrapper around one launch (never run; no B200 here).
            return self.launchers.tc
        raise RuntimeError(
            f"nvfp4-gemv has kernels for compute capability 9.0 (Hopper) and 10.x (Blackwell); this device is "
            f"{major}.{capability[1]}"
        )

    def capability(self, device: torch.device) -> tuple[int, int]:
        idx = device.index if device.index is not None else torch.cuda.current_device()
        cap = self._capability.get(idx)
        if cap is None:
            cap = self._capability[idx] = torch.cuda.get_device_capability(idx)
        return cap

    def __call__(self, data, sf_kind: str = "permuted"):
        """Fill and return c for the contest tuple (a, b, sfa, sfb, sfa_permuted, sfb_permuted, c).

        sf_kind="permuted" reads sfa_permuted/sfb_permuted (the contest's layout); "plain" reads sfa/sfb instead.
        The known-signature path is written out here rather than through `run`: it is the per-call host cost.
        """
        a, b, sfa, sfb, sfa_p, sfb_p, c = data
        if sf_kind == "permuted":
            sa, sb = sfa_p, sfb_p
        else:
            sa, sb = sfa, sfb
        fn = self.kernels.get((a.shape, sa.shape, sf_kind))
        if fn is None:
            return self.run(a, b, sa, sb, c, sf_kind, lambda: validate_inputs(data, require_cuda=True))
        try:
            fn(a, b, sa, sb, c)
        except Exception:
            validate_inputs(data, require_cuda=True)  # a ValueError naming the tensor, if the operands are at fault
            raise
        return c

    def run(self, a, b, sa, sb, c, sf_kind: str, validate: Callable[[], tuple[int, int, int]]):
        """One launch on the five operands the kernels read; `validate()` checks whatever tuple they came from.

        It runs the first time a shape signature is seen. After that the compiled function itself checks the
        dtype, rank, device, 16-byte alignment and the static and shared extents and strides of the five operands
        (TVM-FFI's argument checks, from the fake tensors it was compiled on); if it refuses them, `validate()`
        runs again, so that the error is a ValueError naming the tensor.
        """
        key = (a.shape, sa.shape, sf_kind)
        fn = self.kernels.get(key)
        if fn is None:
            m, k, l = validate()  # noqa: E741
            fn = self.kernels[key] = self.select(self.capability(a.device), m, k, l, sf_kind)
        try:
            fn(a, b, sa, sb, c)
        except Exception:
            validate()  # a ValueError naming the tensor, if the operands are at fault
            raise
        return c
