"""`custom_kernel(data) -> c`: the library's entry point, launching on torch's current CUDA stream.

It is `submission.dispatch.Dispatcher` bound to `cute_kernels.torch_queue`'s compiles, so calls order with torch
work on any stream and can be captured into CUDA graphs. `submission.contest` is the same dispatcher on the default
stream, for the single-file GPU MODE submission.
"""

from __future__ import annotations

from cute_kernels import torch_queue
from submission.dispatch import SIMT_TABLE, SM100_VARIANTS, Dispatcher, Launchers, simt_config_for

__all__ = ["custom_kernel", "select_kernel", "simt_config_for", "SIMT_TABLE", "SM100_VARIANTS", "DISPATCH"]

DISPATCH = Dispatcher(Launchers(simt=torch_queue.compile_simt, tc=torch_queue.gemv_tc_on_torch_stream))
custom_kernel = DISPATCH.__call__
select_kernel = DISPATCH.select
