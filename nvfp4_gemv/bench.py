"""Benchmarks on a CUDA GPU: contest timing, CUDA-graph timing, the copy-bandwidth floor, host cost, and baselines.

Contest timing (docs/contract.md): per iteration fresh inputs, synchronize, flush the L2, record a start event, call,
record an end event, synchronize; the mean over iterations. Inputs come from a pool that spans more than 200 MB and
is rotated, so no call finds its operands in the 50 MB L2 even before the flush. Graph timing replays one CUDA graph
of calls over the same rotated pool, so it is the kernels alone, back to back. The floor is
`shapes.bytes_moved / copy bandwidth`, with the copy bandwidth measured in the same process (a device-to-device copy
of 1 GiB, read + write bytes counted).
"""

from __future__ import annotations

import math
import statistics

import torch

from nvfp4_gemv.shapes import bytes_moved, floor_us

POOL_BYTES = 256 << 20
FLUSH_BYTES = 256 << 20  # > 5x the H200's 50 MB L2


def copy_bandwidth(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write), median of `iters` copies."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e-3)
    return 2 * nbytes / statistics.median(times)


def input_pool(m: int, k: int, l: int, pool_bytes: int = POOL_BYTES):  # noqa: E741
    """Enough distinct contest input tuples on the GPU (seeds 0, 1, ...) to span `pool_bytes`, at least 2."""
    from submission.reference import generate_input

    n = max(2, math.ceil(pool_bytes / bytes_moved(m, k, l)))
    return [generate_input(m, k, l, seed=seed, device="cuda") for seed in range(n)]


_FLUSH = {}
FLUSH_MODES = ("contest", "clean")


def flush_l2(mode: str = "contest"):
    """"contest": allocate a 4 GiB torch.randn as the contest's harness does; it leaves the L2 full of dirty lines
    that the timed call then writes back. "clean": read 256 MB, which leaves the L2 full of clean lines."""
    if mode not in FLUSH_MODES:
        raise ValueError(f"flush mode must be one of {FLUSH_MODES}, got {mode!r}")
    if mode == "contest":
        torch.randn(1 << 30, device="cuda")
        return
    buf = _FLUSH.get("buf")
    if buf is None:
        buf = _FLUSH["buf"] = torch.ones(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
        _FLUSH["out"] = torch.empty((), dtype=torch.float32, device="cuda")
    torch.sum(buf, dim=0, out=_FLUSH["out"])


def contest_time_us(fn, pool, iters: int = 100, flush: str = "contest", before=None) -> float:
    """Mean µs of `fn(data)` under contest timing: L2 flushed, events around the Python call. `before(data)`, if
    given, runs untimed between the flush and the start event (cold_start_table)."""
    fn(pool[0])
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        data = pool[i % len(pool)]
        torch.cuda.synchronize()
        flush_l2(flush)
        if before is not None:
            before(data)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(data)
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.mean(times)


GRAPH_CALLS = 20  # calls captured in one graph, cycling over the pool: one replay's launch cost is spread over them


def graph_time_us(fn, pool, reps: int = 20, calls: int = GRAPH_CALLS) -> float:
    """µs per call when one CUDA graph replays at least `calls` calls cycling over the rotated pool (the whole pool
    at least once), median over replays. With many calls a graph, the per-call figure is the kernel's, not the
    graph launch's share."""
    fn(pool[0])
    torch.cuda.synchronize()
    order = [pool[i % len(pool)] for i in range(max(calls, len(pool)))]
    stream = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for d in pool:  # warm-up on the capture stream
            fn(d)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=stream):
            for d in order:
                fn(d)
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / len(order))
    return statistics.median(times)


def host_cost_us(fn, data, iters: int = 2000) -> float:
    """Wall µs per call of `fn(data)` issued back to back on a tiny shape (the GPU keeps up, so this is host time)."""
    import time

    for _ in range(50):
        fn(data)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn(data)
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / iters * 1e6


# --- baselines -------------------------------------------------------------------------------------------------


def _lut(device):
    from submission.reference import FP4_E2M1_LUT

    return torch.tensor(FP4_E2M1_LUT, dtype=torch.float32, device=device)


def _dequant(packed, sf, lut):
    """(..., K/2, L) packed fp4 and (..., K/16, L) plain scales -> (..., K, L) fp32 values, low nibble first."""
    u = packed.view(torch.uint8)
    v = torch.stack((lut[(u & 0xF).long()], lut[(u >> 4).long()]), dim=-2).flatten(-3, -2)
    return v * sf.float().repeat_interleave(16, dim=-2)


def dequant_gemv(a, b, sfa, sfb, lut):
    """The straightforward PyTorch GEMV: dequantize A and b to fp32 with the plain scales, multiply, sum over K."""
    return (_dequant(a, sfa, lut) * _dequant(b[0], sfb[0], lut)[None]).sum(dim=1).to(torch.float16)


def torch_compile_baseline():
    """A `torch.compile`d dequant GEMV reading the plain scales; returns fn(data) -> c."""
    compiled = torch.compile(dequant_gemv, dynamic=False)
    luts = {}

    def fn(data):
        a, b, sfa, sfb, _, _, c = data
        lut = luts.get(a.device)
        if lut is None:
            lut = luts[a.device] = _lut(a.device)
        c[:, 0, :] = compiled(a, b, sfa, sfb, lut)
        return c

    return fn


def quack_baseline(data):
    """quack-kernels' Hopper NVFP4 GEMM `gemm_w4a16(..., wformat="nvfp4")` used for a GEMV, as its users would:
    weights prepared once per batch (untimed), b dequantized to bf16 (exact: 2 + 4 significand bits), one call per
    batch. Returns fn(data) -> c for the prepared weights of this `data`'s A."""
    from quack.gemm_w4 import gemm_w4a16, prepare_w4_weight

    a, b, sfa, sfb, _, _, c = data
    m, _, l = a.shape  # noqa: E741
    au = a.view(torch.uint8)
    prepared = [prepare_w4_weight(au[:, :, i].contiguous(), sfa[:, :, i].contiguous(), wformat="nvfp4") for i in range(l)]
    act = _dequant(b[0], sfb[0], _lut(a.device)).t().contiguous().to(torch.bfloat16)  # (L, K)

    def fn(d):
        outs = [gemm_w4a16(act[i : i + 1].contiguous(), blob, sf, wformat="nvfp4", n_out=m) for i, (blob, sf) in
                enumerate(prepared)]
        return outs

    def to_c(outs):
        return torch.stack([o[0, :m].float() for o in outs], dim=1).to(torch.float16)

    return fn, to_c


STREAM_READ = "stream read of the same bytes"


def stream_read_variant(nbytes: int, pool_bytes: int = POOL_BYTES, config=None):
    """The practical roofline of a shape: `cute_kernels.stream_read` reading a flat buffer of `nbytes` (rounded down
    to 16), rotated over a pool of more than `pool_bytes`. Returns (fn(buffer), pool). config: a `StreamReadConfig`
    other than the default (the roofline's)."""
    from cute_kernels import stream_read

    config = config or stream_read.StreamReadConfig()
    if not stream_read.StreamRead.can_implement(nbytes // 16 * 16, config.row_chunks):
        raise ValueError(f"stream read of {nbytes} bytes: {stream_read.StreamRead.can_implement.__doc__}")
    fn = on_torch_stream(stream_read.StreamRead, config)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(1, dtype=torch.uint32, device="cuda")
    words = nbytes // 16 * 4
    pool = [torch.zeros(words, dtype=torch.uint32, device="cuda") for _ in range(max(2, -(-pool_bytes // nbytes)))]
    return (lambda buf: fn(buf, out, sms)), pool


def benchmark_shapes(shapes, iters: int = 100, baselines: bool = True, log=print):
    """Contest and graph timing of custom_kernel on each (m, k, l), beside the baselines, with the copy floor.

    Returns (bandwidth bytes/s, rows): a row is a dict of shape, variant, contest µs, graph µs, floor µs."""
    from nvfp4_gemv.kernel import custom_kernel

    bw = copy_bandwidth()
    log(f"copy bandwidth: {bw / 1e12:.3f} TB/s")
    rows = []
    tc = torch_compile_baseline() if baselines else None
    tma = tma_variants()
    for m, k, l in shapes:  # noqa: E741
        pool = input_pool(m, k, l)
        floor = floor_us(m, k, l, bw)
        # (name, call, the inputs it rotates over)
        variants = [("nvfp4-gemv", custom_kernel, pool)] + [(name, fn, pool) for name, fn in tma]
        variants.append((STREAM_READ, *stream_read_variant(bytes_moved(m, k, l))))
        if baselines:
            variants.append(("torch.compile dequant", tc, pool))
            try:
                qfn, _ = quack_baseline(pool[0])
                variants.append(("quack gemm_w4a16 nvfp4", qfn, [pool[0]] * 2))  # its weights are prepared once
            except Exception as e:  # noqa: BLE001  (a missing or failing peer is reported, not fatal)
                log(f"quack baseline unavailable for {(m, k, l)}: {type(e).__name__}: {e}")
        for name, fn, qpool in variants:
            row = {"m": m, "k": k, "l": l, "variant": name, "floor_us": floor}
            row["contest_us"] = contest_time_us(fn, qpool, iters)
            row["clean_flush_us"] = contest_time_us(fn, qpool, iters, flush="clean")
            row["graph_us"] = graph_time_us(fn, qpool) if name != "torch.compile dequant" else float("nan")
            rows.append(row)
            log(f"{m:>6} {k:>6} {l:>2}  {name:<24} contest {row['contest_us']:8.2f} us  clean-flush "
                f"{row['clean_flush_us']:8.2f} us  graph {row['graph_us']:8.2f} us  floor {floor:7.2f} us  "
                f"x{row['contest_us'] / floor:5.2f}")
        del pool, variants
        torch.cuda.empty_cache()
    return bw, rows


def _touch_pages(tensors, stride: int = 1 << 16):
    """Read one byte every `stride` bytes of each tensor's storage (one sector a 64 KB: the TLB entries, not the
    data). Through the raw storage, so a strided view (the contest's permuted A) is never copied."""
    for t in tensors:
        flat = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())
        flat[::stride].sum()


def cold_start_table(shapes, iters: int = 40, rounds: int = 2, log=print):
    """Where the contest timing's extra cost goes: custom_kernel and the stream read of the same bytes, contest-timed
    as is, after a clean flush, and with untimed work between the flush and the start event: a strided read of one
    byte a 64 KB of every input (cold TLB entries), a launch of the same compiled kernel on a tiny input (cold code
    and constant caches), and both; graph-timed beside them. The best of `rounds`. Returns rows of µs."""
    from nvfp4_gemv.kernel import DISPATCH, custom_kernel
    from submission.reference import generate_input

    rows = []
    tiny = generate_input(128, 64, 1, seed=1, device="cuda")
    small = torch.zeros(1024, dtype=torch.uint32, device="cuda")
    for m, k, l in shapes:  # noqa: E741
        pool = input_pool(m, k, l)
        a, b, _, _, sfa, sfb, c = pool[0]
        custom_kernel(pool[0])
        raw = DISPATCH.kernels[DISPATCH.key(a, b, sfa, sfb, c, "permuted")]
        read, read_pool = stream_read_variant(bytes_moved(m, k, l))
        variants = {
            "nvfp4-gemv": (custom_kernel, pool, lambda d: _touch_pages((d[0], d[1], d[4], d[5])),
                           lambda d: raw(tiny[0], tiny[1], tiny[4], tiny[5], tiny[6])),
            STREAM_READ: (read, read_pool, lambda d: _touch_pages((d,)), lambda d: read(small)),
        }
        for name, (fn, p, touch, warm) in variants.items():
            timings = {
                "contest_us": lambda: contest_time_us(fn, p, iters),
                "clean_flush_us": lambda: contest_time_us(fn, p, iters, flush="clean"),
                "touched_us": lambda: contest_time_us(fn, p, iters, before=touch),
                "warmed_us": lambda: contest_time_us(fn, p, iters, before=warm),
                "touched_warmed_us": lambda: contest_time_us(fn, p, iters, before=lambda d: (touch(d), warm(d))),
                "graph_us": lambda: graph_time_us(fn, p),
            }
            row = {"m": m, "k": k, "l": l, "variant": name}
            for col, time_it in timings.items():
                row[col] = min(time_it() for _ in range(rounds))
            rows.append(row)
            log(f"{m:>6} {k:>6} {l:>2}  {name:<30} " + "  ".join(f"{c_[:-3]} {row[c_]:7.2f}" for c_ in timings))
        del pool, read_pool
        torch.cuda.empty_cache()
    return rows


def read_order_table(shapes, iters: int = 40, rounds: int = 2, unrolls=(8, 2), log=print):
    """What the GEMV's read order costs DRAM by itself: the bytes of each shape's A (M·L rows of K/2 bytes) read by
    the grid-stride roofline kernel, and read a warp a row, every row at once, each row in 512-byte pieces with
    `unrolls` pieces in flight (`StreamReadConfig(row_chunks=K/32)`); custom_kernel on the whole problem and the read of
    its bytes beside them. Contest- and graph-timed, the best of `rounds`. Returns rows of µs."""
    from cute_kernels.stream_read import StreamReadConfig
    from nvfp4_gemv.kernel import custom_kernel

    rows = []
    for m, k, l in shapes:  # noqa: E741
        a_bytes = m * l * k // 2
        variants = {"A, grid-stride": stream_read_variant(a_bytes)}
        for u in unrolls:
            variants[f"A, a warp a row, unroll {u}"] = stream_read_variant(
                a_bytes, config=StreamReadConfig(row_chunks=k // 32, unroll=u))
        variants[STREAM_READ] = stream_read_variant(bytes_moved(m, k, l))
        variants["nvfp4-gemv"] = (custom_kernel, input_pool(m, k, l))
        for name, (fn, pool) in variants.items():
            row = {"m": m, "k": k, "l": l, "variant": name,
                   "contest_us": min(contest_time_us(fn, pool, iters) for _ in range(rounds)),
                   "graph_us": min(graph_time_us(fn, pool) for _ in range(rounds))}
            rows.append(row)
            log(f"{m:>6} {k:>6} {l:>2}  {name:<34} contest {row['contest_us']:7.2f}  graph {row['graph_us']:7.2f}")
        del variants
        torch.cuda.empty_cache()
    return rows


def profile_workload(shapes=None, repeats: int = 2):
    """Launches to profile with ncu: for each shape, custom_kernel and the stream read of the same bytes, `repeats`
    times each, each after a 1 GiB write that evicts the previous call's lines. BENCHMARKS.md gives the command."""
    from nvfp4_gemv.kernel import custom_kernel
    from submission.reference import generate_input
    from nvfp4_gemv.shapes import BENCH_SHAPES

    for m, k, l in shapes or [s.mkl for s in BENCH_SHAPES]:  # noqa: E741
        data = generate_input(m, k, l, seed=1, device="cuda")
        read, pool = stream_read_variant(bytes_moved(m, k, l), pool_bytes=0)
        for _ in range(repeats):
            for fn, arg in ((custom_kernel, data), (read, pool[0])):
                torch.randn(1 << 28, device="cuda")
                fn(arg)
        torch.cuda.synchronize()
        del data, pool


def on_torch_stream(kernel_cls, config):
    """The raw TVM-FFI function of `kernel_cls(config)` for this GPU, launching on torch's current stream."""
    from cute_kernels.compile import compile_kernel, raw_function, target

    tgt = target(torch.cuda.get_device_capability())
    return raw_function(compile_kernel(kernel_cls, config, tgt, stream="torch"))


def on_permuted(fn):
    """A call taking the contest tuple, for a function that takes (a, b, sfa_permuted, sfb_permuted, c)."""
    return lambda d: fn(d[0], d[1], d[4], d[5], d[6])


def tma_variants():
    """On sm_90: the TMA-fed alternative kernel (cute_kernels.gemv_tma, not dispatched), and the same kernel with
    its math off, which moves the same bytes and gives the rate of that data path alone."""
    if torch.cuda.get_device_capability()[0] != 9:
        return []
    from cute_kernels.gemv_tma import GemvTma, GemvTmaConfig

    ctas = 2 * torch.cuda.get_device_properties(0).multi_processor_count
    return [
        ("gemv_tma (not dispatched)", on_permuted(on_torch_stream(GemvTma, GemvTmaConfig(ctas=ctas)))),
        ("data path alone (gemv_tma, no math)",
         on_permuted(on_torch_stream(GemvTma, GemvTmaConfig(ctas=ctas, decode=False)))),
    ]


SWEEP_TIMINGS = ("graph", "contest")


def _timer(timing: str, iters: int):
    if timing not in SWEEP_TIMINGS:
        raise ValueError(f"timing must be one of {SWEEP_TIMINGS}, got {timing!r}")
    return graph_time_us if timing == "graph" else (lambda fn, pool: contest_time_us(fn, pool, iters))


def simt_call(cfg, schedule: str = "grid"):
    """A call taking the contest tuple, of the CUDA-core kernel with `cfg` on torch's stream: one CTA per row tile
    (schedule "grid", gemv_simt.GemvSimt) or the K-balanced schedule ("balanced", gemv_simt.GemvSimtBalanced, with
    the grid and workspace that dispatch gives it)."""
    from cute_kernels import gemv_simt

    if schedule == "grid":
        return on_permuted(on_torch_stream(gemv_simt.GemvSimt, cfg))
    import functools

    from cute_kernels.tc_workspace import SplitLauncher
    from nvfp4_gemv.dispatch import balanced_num_ctas

    fn = on_torch_stream(gemv_simt.GemvSimtBalanced, cfg)
    launcher = SplitLauncher(fn, gemv_simt.GemvSimtBalanced, cfg, functools.partial(balanced_num_ctas, cfg),
                             workspace_key=lambda: torch.cuda.current_stream().cuda_stream)
    return on_permuted(launcher)


def dispatch_choice(m, k, l):  # noqa: E741
    """(kernel class, config) that dispatch picks for the shape on this GPU (permuted scales)."""
    from nvfp4_gemv.dispatch import simt_choice

    return simt_choice(m, k, l, "permuted", torch.cuda.get_device_properties(0).multi_processor_count)


def _dispatch_description(m, k, l):  # noqa: E741
    cls, cfg = dispatch_choice(m, k, l)
    return f"{cls.__name__} warps={cfg.warps} unroll={cfg.unroll} max_registers={cfg.max_registers}"


def sweep_simt_configs(shapes, configs, log=print, timing: str = "graph", iters: int = 50):
    """µs of the CUDA-core kernel for each (schedule, config) on each shape, graph-timed (kernel time only, L2
    defeated by the rotated pool) or contest-timed (`iters` calls, each after the contest's L2 flush); returns
    {(shape, (schedule, config)): µs}. Used to fit the config choice in nvfp4_gemv.dispatch."""

    time_us = _timer(timing, iters)
    out = {}
    for m, k, l in shapes:  # noqa: E741
        pool = input_pool(m, k, l)
        for schedule, cfg in configs:
            if schedule == "dispatched":  # what custom_kernel picks for the shape (cfg None)
                from nvfp4_gemv.kernel import custom_kernel

                us = time_us(custom_kernel, pool)
                out[((m, k, l), (schedule, cfg))] = us
                log(f"{m:>6} {k:>6} {l:>2}  dispatched {_dispatch_description(m, k, l)} {us:8.2f} us ({timing})")
                continue
            us = time_us(simt_call(cfg, schedule), pool)
            out[((m, k, l), (schedule, cfg))] = us
            log(f"{m:>6} {k:>6} {l:>2}  {schedule:<7} warps={cfg.warps:<2} r_lanes={cfg.r_lanes} "
                f"rows/thr={cfg.rows_per_thread} unroll={cfg.unroll} k_splits={cfg.k_splits} "
                f"max_registers={cfg.max_registers} {us:8.2f} us ({timing})")
        del pool
        torch.cuda.empty_cache()
    return out


def sweep_fields(timing: str = "graph") -> tuple:
    """The columns of a sweep's rows: the config, then its µs and the stream read's under `timing`."""
    return ("m", "k", "l", "schedule", "warps", "r_lanes", "unroll", "rows_per_thread", "k_splits", "max_registers",
            f"{timing}_us", f"read_{timing}_us", "x_read")


def sweep_rows(shapes, configs, log=print, timing: str = "graph", iters: int = 50):
    """The CUDA-core kernel's µs for every config on every shape, beside the stream read of the same bytes under the
    same timer (`timing`: "graph" or "contest"): rows of sweep_fields(timing), the data dispatch's config choice is
    derived from."""
    results = sweep_simt_configs(shapes, configs, log, timing, iters)
    time_us = _timer(timing, iters)
    rows = []
    for m, k, l in shapes:  # noqa: E741
        fn, pool = stream_read_variant(bytes_moved(m, k, l))
        read = time_us(fn, pool)
        del pool
        for schedule, cfg in configs:
            us = results[((m, k, l), (schedule, cfg))]
            if cfg is None:
                cfg = dispatch_choice(m, k, l)
                schedule = f"dispatched {'balanced' if cfg[0].__name__.endswith('Balanced') else 'grid'}"
                cfg = cfg[1]
            rows.append({"m": m, "k": k, "l": l, "schedule": schedule, "warps": cfg.warps, "r_lanes": cfg.r_lanes,
                         "unroll": cfg.unroll, "rows_per_thread": cfg.rows_per_thread, "k_splits": cfg.k_splits,
                         "max_registers": cfg.max_registers, f"{timing}_us": us, f"read_{timing}_us": read,
                         "x_read": us / read})
        best = min(r["x_read"] for r in rows[-len(configs):])
        log(f"{m:>6} {k:>6} {l:>2}  stream read {read:8.2f} us ({timing}); best config x{best:.3f}")
    return rows


def host_cost_table(log=print):
    """Per-call wall µs on a tiny shape (128, 256, 1), issued back to back: custom_kernel, the raw compiled
    function, the torch op, and torch's own smallest launch (c.zero_()) as the machine's floor for any launch;
    plus the same kernel replayed from a CUDA graph (GPU time per call without host cost)."""
    from nvfp4_gemv.kernel import DISPATCH, custom_kernel
    from submission.reference import generate_input

    d = generate_input(128, 256, 1, seed=0, device="cuda")
    a, b, _, _, sfa_p, sfb_p, c = d
    custom_kernel(d)
    raw = DISPATCH.kernels[DISPATCH.key(a, b, sfa_p, sfb_p, c, "permuted")]
    rows = {
        "custom_kernel": host_cost_us(custom_kernel, d),
        "compiled function, raw TVM-FFI call": host_cost_us(lambda _d: raw(a, b, sfa_p, sfb_p, c), d),
        "torch c.zero_() (reference launch)": host_cost_us(lambda _d: c.zero_(), d),
        "CUDA-graph replay, per call": graph_time_us(custom_kernel, [d] * 50),
    }
    try:
        from nvfp4_gemv.op import nvfp4_gemv

        rows["torch op nvfp4_gemv (eager)"] = host_cost_us(lambda _d: nvfp4_gemv(a, b, sfa_p, sfb_p, c), d)
        op = torch.ops.nvfp4_gemv.gemv
        rows["torch.ops.nvfp4_gemv.gemv (dispatcher)"] = host_cost_us(lambda _d: op(a, b, sfa_p, sfb_p, c), d)
    except Exception as e:  # noqa: BLE001
        log(f"torch op unavailable: {type(e).__name__}: {e}")
    for name, us in rows.items():
        log(f"{name:<42} {us:7.2f} us/call")
    return rows


def call_path_table(entries, shapes, iters: int = 100, log=print):
    """Host cost and contest timing of `custom_kernel` entries (name -> fn(data)), e.g. the contest dispatcher on
    its TVM-FFI and its raw-pointer call path. Host cost: back-to-back wall µs per call on (128, 256, 1). Contest
    timing: on each shape, interleaved entry by entry in the same run. Returns rows of dicts."""
    from submission.reference import generate_input

    rows = []
    tiny = generate_input(128, 256, 1, seed=0, device="cuda")
    for name, fn in entries.items():
        us = host_cost_us(fn, tiny)
        rows.append({"entry": name, "shape": (128, 256, 1), "host_us": us})
        log(f"{name:<28} host cost {us:7.2f} us/call (back to back, 128x256x1)")
    for m, k, l in shapes:  # noqa: E741
        pool = input_pool(m, k, l)
        for name, fn in entries.items():
            us = contest_time_us(fn, pool, iters)
            rows.append({"entry": name, "shape": (m, k, l), "contest_us": us})
            log(f"{m:>6} {k:>6} {l:>2}  {name:<28} contest {us:8.2f} us")
        del pool
        torch.cuda.empty_cache()
    return rows


def load_submission_file(path):
    """The generated single-file submission at `path`, imported under a private module name (its own file name,
    submission.py, would clash with this package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nvfp4_gemv_uploaded_submission", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_submission_file(path, shapes, log=print) -> bool:
    """The generated file's custom_kernel on `shapes`: bit-identical to the reference on contest data, within the
    contract's tolerance on full-range data (against the exact-sum bound), writing c in place. True if all pass."""
    from submission.reference import check, check_fp32_bound, generate_full_range, generate_input, ref_kernel

    sub = load_submission_file(path)
    ok_all = True
    for m, k, l in shapes:  # noqa: E741
        data = generate_input(m, k, l, seed=m + k + l, device="cuda")
        data[-1].fill_(float("nan"))
        out = sub.custom_kernel(data)
        torch.cuda.synchronize()
        ref_data = list(data)
        ref_data[-1] = torch.empty_like(data[-1])
        ref = ref_kernel(tuple(ref_data))
        exact = out.data_ptr() == data[-1].data_ptr() and torch.equal(out, ref) and check(out, ref)[0]
        full = generate_full_range(m, k, l, seed=7 * m + k + l, device="cuda")
        ok_full, msg = check_fp32_bound(sub.custom_kernel(full), full)
        ok_all &= exact and ok_full
        log(f"{m:>6} {k:>6} {l:>2}  contest data bit-exact: {exact}  full range: {ok_full} {'' if ok_full else msg}")
    return ok_all
