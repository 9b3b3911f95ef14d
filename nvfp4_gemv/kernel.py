"""`custom_kernel(data) -> c`: the library's entry point, launching on torch's current CUDA stream.

It is `nvfp4_gemv.dispatch.Dispatcher` compiled for torch's current stream (TVM-FFI's environment stream), so calls
order with torch work on any stream and can be captured into CUDA graphs; the tensor-core kernel's workspace is
kept per stream. `submission.contest` is the same dispatcher on the default stream, for the single-file submission.
"""

from __future__ import annotations

import torch

from nvfp4_gemv.dispatch import SM100_VARIANTS, Dispatcher, simt_config_for

__all__ = ["custom_kernel", "select_kernel", "simt_config_for", "SM100_VARIANTS", "DISPATCH"]

DISPATCH = Dispatcher("tvm_ffi", stream="torch", workspace_key=lambda: torch.cuda.current_stream().cuda_stream)
custom_kernel = DISPATCH.__call__
select_kernel = DISPATCH.select
