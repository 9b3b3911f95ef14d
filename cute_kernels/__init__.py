"""The CuTe DSL kernels of nvfp4-gemv and the one surface they are compiled and launched through.

- `compile`: the compile surface (targets, DSL-release shims, fake operands, the call paths, one cache) and `launch`.
- `targets`: `Target`, one value for the compiler's `--gpu-arch` and the device code's arch switch (no DSL import).
- `gemv_simt`: the CUDA-core GEMV (sm_90 prmt/dp4a decode, sm_100 hardware fp4 decode); dispatched on sm_90.
- `gemv_tma`: a TMA-fed, warp-specialized CUDA-core GEMV for sm_90 (measured, not dispatched).
- `gemv_tc_sm100`: the tcgen05 block-scaled tensor-core GEMV (sm_100a, compile-verified only); `tc_workspace` and
  `tile_scheduler` are its host-side workspace and its deterministic split-K schedule.
- `stream_read`: a pure read of N bytes, the measured roofline the benchmarks hold the GEMV to.
- `decode`, `ptx`, `l2_policy`: device helpers shared by the kernels (decode.py is the arch switch).
"""
