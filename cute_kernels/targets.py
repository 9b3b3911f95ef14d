"""Compile targets: one value names both the compiler's `--gpu-arch` and the device code's arch switch.

No DSL import here, so the command line and the tests can use the target names without loading the CuTe DSL;
`cute_kernels.compile` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """A compile target: `gpu_arch` ("sm_90a", "sm_100a") for the compiler, `family` ("sm_90", "sm_100") for
    the device code's arch switch (cute_kernels.decode). Make one with `target()`."""

    gpu_arch: str

    def __post_init__(self):
        if self.gpu_arch not in FAMILIES:
            raise ValueError(f"gpu arch must be one of {GPU_ARCHS}, got {self.gpu_arch!r}")

    @property
    def family(self) -> str:
        return FAMILIES[self.gpu_arch]


FAMILIES = {"sm_90a": "sm_90", "sm_100a": "sm_100"}
GPU_ARCHS = tuple(FAMILIES)


def target(arch) -> Target:
    """The Target for a `--gpu-arch` string ("sm_90a", "sm_100a") or a compute capability tuple ((9, 0), (10, 0)).

    Compute capability 10.x other than 10.0 (e.g. 10.3, B300) cannot load sm_100a code, and no build for it is made
    here, so it is refused rather than given a binary it cannot run."""
    if isinstance(arch, Target):
        return arch
    if isinstance(arch, tuple):
        gpu_arch = {(9, 0): "sm_90a", (10, 0): "sm_100a"}.get(tuple(arch))
        if gpu_arch is None:
            raise RuntimeError(
                f"nvfp4-gemv has kernels for compute capability 9.0 (sm_90a) and 10.0 (sm_100a); this device is "
                f"{arch[0]}.{arch[1]}"
            )
        return Target(gpu_arch)
    if arch not in FAMILIES:
        raise ValueError(f"gpu arch must be one of {GPU_ARCHS}, got {arch!r}")
    return Target(arch)
