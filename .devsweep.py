import itertools, time, torch
from cute_kernels.gemv_simt import GemvSimtConfig
from submission.bench import sweep_simt_configs, copy_bandwidth
from submission.kernel import custom_kernel, _KERNELS
from submission.reference import generate_input
print("bw", copy_bandwidth() / 1e12)
cfgs = [GemvSimtConfig(warps=w, r_lanes=rl, rows_per_thread=rr, unroll=u)
        for w in (4, 8, 16) for (rl, rr) in ((8, 1), (4, 1), (4, 2), (8, 2)) for u in (1, 2)]
sweep_simt_configs([(7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4)], cfgs)
# host cost components on a tiny shape
d = generate_input(128, 256, 1, seed=0, device="cuda")
custom_kernel(d); torch.cuda.synchronize()
fn = next(iter(_KERNELS.values()))
a, b, sfa, sfb, sfap, sfbp, c = d
def t(f, n=3000):
    for _ in range(100): f()
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): f()
    torch.cuda.synchronize(); return (time.perf_counter() - t0) / n * 1e6
print("raw fn", t(lambda: fn(a, b, sfap, sfbp, c)))
print("custom_kernel", t(lambda: custom_kernel(d)))
print("empty torch op (c.zero_)", t(lambda: c.zero_()))
print("signature", t(lambda: (a.shape, a.stride(), b.stride(), sfap.shape, sfa.stride(), c.stride(), a.device)))
print("data_ptr x5", t(lambda: a.data_ptr() | b.data_ptr() | sfap.data_ptr() | sfbp.data_ptr() | c.data_ptr()))
print("dtypes", t(lambda: (a.dtype, b.dtype, sfa.dtype, sfb.dtype, sfap.dtype, sfbp.dtype, c.dtype)))
