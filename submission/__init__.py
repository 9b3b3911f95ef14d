"""The contest end of nvfp4-gemv: GPU MODE's `nvfp4_gemv` problem.

- `reference`: the contest's input generator, a full-range generator and the fp32 reference GEMV.
- `contest`: `custom_kernel(data) -> c` on the default CUDA stream, the module the single-file submission is made of.
- `generate`: writes that single file; `bundle_runtime` is the code it runs at import (and `--selftest-compile`).

The library itself is `nvfp4_gemv`.
"""
