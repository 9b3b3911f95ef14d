"""The GPU MODE `nvfp4_gemv` entry: `custom_kernel(data) -> c` on the default CUDA stream, where the contest runs.

This is the module the single-file submission is generated from (submission.generate). It is the library's
dispatcher, calling through TVM-FFI where apache-tvm-ffi is installed and through raw pointers (the DSL's own
runtime) where it is not, as on GPU MODE's runner.
"""

from __future__ import annotations

from cute_kernels.compile import has_tvm_ffi
from nvfp4_gemv.dispatch import Dispatcher

DISPATCH = Dispatcher("tvm_ffi" if has_tvm_ffi() else "pointers")
custom_kernel = DISPATCH.__call__
