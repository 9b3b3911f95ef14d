"""The int16-x probe over splits (warps, rows a thread, unroll; permuted scales), graph timer, beside the read."""
import math

import torch

from cute_kernels import gemv_simt as G
from cute_kernels.gemv_x16_probe import GemvX16, prep_x
from nvfp4_gemv import bench as B
from submission.reference import generate_input

SHAPES = [(8192, 28672), (4096, 14336), (28672, 4096), (6144, 4096), (10240, 8192), (4096, 7168), (4096, 4096),
          (5760, 2880)]
SPLITS = [(1, 1, 1), (2, 1, 1), (4, 1, 1), (8, 1, 1), (16, 1, 1), (1, 2, 1), (2, 2, 1), (4, 2, 1), (8, 2, 1)]
for n, k in SHAPES:
    wbytes = n * k // 2 + n * k // 16
    pool = [generate_input(n, k, 1, seed=s, device="cuda") for s in range(max(2, math.ceil((256 << 20) / wbytes)))]
    X, f = prep_x(torch.randn(k, device="cuda").to(torch.bfloat16))
    c = torch.empty(n, device="cuda", dtype=torch.float16).as_strided((n, 1, 1), (1, 1, n))
    rfn, rpool = B.stream_read_variant(wbytes)
    read = B.graph_time_us(rfn, rpool)
    out = []
    for w, rr, u in SPLITS:
        fn = B.on_torch_stream(GemvX16, G.GemvSimtConfig(warps=w, r_lanes=2, rows_per_thread=rr, unroll=u))
        t = B.graph_time_us(lambda d, fn=fn: fn(d[0], X, d[4], f, c), pool)
        out.append(f"w{w}r{rr}u{u} {t / read:.3f}")
    print(f"{n} x {k}: read {read:.2f} us | " + " | ".join(out), flush=True)
    del pool, rpool
    torch.cuda.empty_cache()
