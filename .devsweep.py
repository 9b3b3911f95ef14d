import sys, torch
from cute_kernels.gemv_simt import GemvSimtConfig
from submission.bench import sweep_simt_configs, copy_bandwidth
print("bw", copy_bandwidth() / 1e12)
cfgs = [GemvSimtConfig(warps=w, r_lanes=rl, rows_per_thread=rr)
        for (w, rl, rr) in ((4, 2, 1), (8, 2, 1), (4, 4, 1), (8, 4, 1), (4, 8, 1), (8, 8, 1), (2, 2, 1), (2, 4, 1), (4, 2, 2), (16, 2, 1))]
sweep_simt_configs([(7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4)], cfgs)
