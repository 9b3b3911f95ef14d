import sys, torch
from cute_kernels.gemv_simt import GemvSimtConfig
from submission.bench import sweep_simt_configs, copy_bandwidth
print("bw", copy_bandwidth() / 1e12)
cfgs = [GemvSimtConfig(warps=w, r_lanes=rl, unroll=u)
        for (w, rl) in ((4, 2), (4, 4), (8, 2), (8, 4), (4, 8), (8, 8), (2, 2)) for u in (2, 4)]
sweep_simt_configs([(7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4)], cfgs)
