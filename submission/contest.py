"""The GPU MODE `nvfp4_gemv` entry: `custom_kernel(data) -> c` on the default CUDA queue, where the contest runs.

This is the module the single-file submission is generated from (submission.generate); it is the library's
dispatcher with the kernels' own launch path, so the generated file needs nothing that follows torch's queue.
"""

from __future__ import annotations

from submission.dispatch import DEFAULT_QUEUE, Dispatcher

DISPATCH = Dispatcher(DEFAULT_QUEUE)
custom_kernel = DISPATCH.__call__
