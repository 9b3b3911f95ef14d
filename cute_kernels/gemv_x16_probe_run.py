import sys, math, torch

from cute_kernels.gemv_x16_probe import GemvX16, prep_x
from cute_kernels import gemv_simt as G
from nvfp4_gemv import bench as B
from nvfp4_gemv import dispatch as D
from nvfp4_gemv.linear import bench as LB
from submission.reference import generate_input, dequant_fp4, decode_e4m3

SHAPES = [(8192, 28672), (4096, 14336), (28672, 4096), (6144, 4096), (10240, 8192), (4096, 7168), (4096, 4096), (5760, 2880)]
torch.manual_seed(0)
print("n k | read | x16 plain | x16 perm | x16 plain u1 | gemv fp4 | linear | x16/read | linear/read | err_q err_true", flush=True)
for n, k in SHAPES:
    wbytes = n * k // 2 + n * k // 16
    copies = max(2, math.ceil((256 << 20) / wbytes))
    pool = [generate_input(n, k, 1, seed=s, device="cuda") for s in range(copies)]
    x = torch.randn(k, device="cuda").to(torch.bfloat16)
    X, f = prep_x(x)
    c = torch.empty(n, 1, 1, device="cuda", dtype=torch.float16).as_strided((n, 1, 1), (1, 1, n))
    # correctness on pool[0]
    d = pool[0]
    wd = dequant_fp4(d[0][:, :, 0]).double() * decode_e4m3(d[2][:, :, 0]).double().repeat_interleave(16, 1)
    xq = (X.view(k).double() * (2 * f.view(k // 16).double()).repeat_interleave(16))
    yq = wd @ xq
    yt = wd @ x.double()
    res = {}
    for name, kind, unroll in [("plain", "plain", None), ("perm", "permuted", None), ("plain_u1", "plain", 1)]:
        cfg = D.simt_config_for(n, k, 1, kind)
        if unroll:
            cfg = G.GemvSimtConfig(**{**cfg.__dict__, "unroll": unroll})
        fn = B.on_torch_stream(GemvX16, cfg)
        idx = 2 if kind == "plain" else 4
        fn(d[0], X, d[idx], f, c)
        torch.cuda.synchronize()
        out = c.view(n).double()
        if name == "plain":
            eq = ((out - yq).norm() / yq.norm()).item(); et = ((out - yt).norm() / yt.norm()).item()
        res[name] = B.graph_time_us(lambda dd, fn=fn, idx=idx: fn(dd[0], X, dd[idx], f, c), pool)
    rfn, rpool = B.stream_read_variant(wbytes)
    res["read"] = B.graph_time_us(rfn, rpool)
    gcfg = D.simt_config_for(n, k, 1, "permuted")
    res["gemv"] = B.graph_time_us(B.simt_call(gcfg), pool)
    lfn, lpool = LB.ours(n, k, 1, "nvfp4")
    res["linear"] = B.graph_time_us(lfn, lpool)
    print(f"{n} {k} | {res['read']:.2f} | {res['plain']:.2f} | {res['perm']:.2f} | {res['plain_u1']:.2f} | {res['gemv']:.2f} | "
          f"{res['linear']:.2f} | {min(res['plain'], res['perm'], res['plain_u1'])/res['read']:.3f} | {res['linear']/res['read']:.3f} | {eq:.2e} {et:.2e} | {gcfg}", flush=True)
    del pool, rpool, lpool; torch.cuda.empty_cache()
