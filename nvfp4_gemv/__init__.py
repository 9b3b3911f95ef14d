"""nvfp4-gemv: NVFP4 batched GEMV in CuTe DSL, the library's public API.

    import nvfp4_gemv

    nvfp4_gemv.custom_kernel(data)                 # GPU MODE's 7-tuple (docs/contract.md); fills and returns c
    nvfp4_gemv.gemv(a, b, sfa_permuted, sfb_permuted, c)   # the torch op: torch.compile and CUDA graphs
    nvfp4_gemv.validate_inputs(data)               # the checks, alone: ValueError naming the tensor

Calls launch on torch's current CUDA stream. The modules: `dispatch` (arch and kernel choice, the per-call path),
`validate`, `kernel` (the library's dispatcher), `op` (the torch op), `shapes`, `bench`, `report`, `artifacts`,
`plots` and `cli` (the `nvfp4-gemv` command). The kernels are in `cute_kernels`, the layouts in `layouts`, and the
contest end (reference, the single-file submission) in `submission`. Names load on first use, so `import
nvfp4_gemv` does not import the CuTe DSL.
"""

_EXPORTS = {
    "custom_kernel": ("nvfp4_gemv.kernel", "custom_kernel"),
    "select_kernel": ("nvfp4_gemv.kernel", "select_kernel"),
    "gemv": ("nvfp4_gemv.op", "nvfp4_gemv"),
    "validate_inputs": ("nvfp4_gemv.validate", "validate_inputs"),
    "validate_operands": ("nvfp4_gemv.validate", "validate_operands"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'nvfp4_gemv' has no attribute {name!r}")
    import importlib

    module, attr = _EXPORTS[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value
