"""The `nvfp4-gemv` command line: `check`, `bench`, `compile --arch` and `submission`.

`check` runs custom_kernel against the reference on the contest's test shapes with contest and full-range data, in
both scale layouts; without a CUDA GPU it checks the reference against an independent float64 GEMV (numpy, bit-formula
decoders, scales read from the permuted or plain buffer) and compiles the kernels for sm_90a and sm_100a instead.
`bench` times the benchmark shapes (contest and CUDA-graph timing, baselines, copy-bandwidth floor) and writes
bench.csv and roofline.png; without a GPU it prints the byte floors at a stated bandwidth. `compile` writes PTX,
cubin (and SASS when nvdisasm is installed) plus an instruction summary; it compiles in a child process because
CUTE_DSL_KEEP is read when cutlass is imported. Nothing here imports cutlass or torch before a subcommand needs it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from cute_kernels.targets import GPU_ARCHS
from layouts.constants import SF_KINDS
from nvfp4_gemv.artifacts import compile_table, summarize
from nvfp4_gemv.report import (
    Progress, b200_sol, bench_report, floor_rows, fmt_err, format_table, geomean, read_ratio_report, write_csv,
)

DATA_KINDS = ("contest", "full", "full+nan")
# The H200's nominal HBM3e bandwidth (datasheet), used for the floor table when nothing can be measured.
H200_NOMINAL_TBPS = 4.8
NO_GPU = "No CUDA GPU is present: running the CPU part only"
SUBMISSION_OUT = "submission-out"


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# ---- shapes ---------------------------------------------------------------------------------------------------


def _shape_arg(text: str) -> tuple[int, int, int]:
    from nvfp4_gemv.validate import validate_problem

    parts = text.split(",")
    if len(parts) != 3:
        raise argparse.ArgumentTypeError(f"a shape is M,K,L (three integers), got {text!r}")
    try:
        m, k, l = (int(p) for p in parts)  # noqa: E741
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is M,K,L (three integers), got {text!r}") from None
    try:
        return validate_problem(m, k, l)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _linear_shape_arg(text: str) -> tuple[int, int]:
    """N,K of a weight for the linear: N >= 1, K a positive multiple of 64."""
    parts = text.split(",")
    try:
        n, k = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a weight shape is N,K (two integers), got {text!r}") from None
    if n < 1 or k < 64 or k % 64:
        raise argparse.ArgumentTypeError(f"a weight shape needs N >= 1 and K a positive multiple of 64, got {text!r}")
    return n, k


def _out_folder(text: str) -> Path:
    """An --out folder: it may exist (as a folder) or be created, in a parent folder that exists and is writable."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the output folder is an empty string")
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    parent = path.resolve().parent
    if not parent.exists():
        raise argparse.ArgumentTypeError(f"the parent folder of {text!r} does not exist")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} lies under a file, {str(parent)!r}")
    target = path if path.exists() else parent
    if not os.access(target, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"no permission to write in {str(target)!r}")
    return path


def _number(cast, what: str, valid, requirement: str):
    """An argparse type: `cast(text)`, refused unless it parses (as `what`) and `valid(value)` holds."""

    def parse(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not valid(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text!r}")
        return value

    return parse


_positive_int = _number(int, "a whole number", lambda v: v >= 1, ">= 1")
_bandwidth = _number(float, "a number of TB/s", lambda v: math.isfinite(v) and v > 0, "a positive finite number of TB/s")
_clock = _number(float, "a number of GHz", lambda v: math.isfinite(v) and v > 0, "a positive finite number of GHz")


def _check_shapes(which: str):
    from nvfp4_gemv.shapes import ODD_SHAPES, TEST_SHAPES

    return list(TEST_SHAPES) if which == "contest" else list(TEST_SHAPES) + list(ODD_SHAPES)


def _sf_kinds(which: str):
    return SF_KINDS if which == "both" else (which,)


def _generate(kind: str, m: int, k: int, l: int, seed: int, device: str):  # noqa: E741
    from submission.reference import generate_full_range, generate_input

    if kind == "contest":
        return generate_input(m, k, l, seed=seed, device=device)
    return generate_full_range(m, k, l, seed=seed, device=device, nonfinite=kind == "full+nan")


def _max_abs_err(out, ref) -> float:
    """Largest |out - ref| over elements finite in both (NaN if none is)."""
    o = out.detach().cpu().double()
    r = ref.detach().cpu().double()
    both = o.isfinite() & r.isfinite()
    return float((o - r).abs()[both].max()) if bool(both.any()) else float("nan")


# ---- check -----------------------------------------------------------------------------------------------------


def _cmd_bringup() -> int:
    import torch

    from nvfp4_gemv import bringup
    from nvfp4_gemv.dispatch import SM100_VARIANTS

    log = Progress()
    if not torch.cuda.is_available():
        print(f"{NO_GPU}: the bring-up probes against the reference alone (a check of the probes).", flush=True)
        from submission.reference import ref_kernel

        def select(variant, m, k, l):  # noqa: E741
            return lambda a, b, sa, sb, c: c.copy_(ref_kernel((a, b, *bringup.plain_scales(a, sa, sb), sa, sb, c)))

        variants, device = ("reference",), "cpu"
    else:
        from nvfp4_gemv.kernel import DISPATCH

        cap = torch.cuda.get_device_capability()
        if cap[0] == 10:
            variants = SM100_VARIANTS
            def select(variant, m, k, l):  # noqa: E741
                return DISPATCH.select(cap, m, k, l, sm100_variant=variant)
        else:
            print(f"This GPU is compute capability {cap[0]}.{cap[1]}, not Blackwell: the bring-up probes against its "
                  f"own dispatched kernel (a check of the probes).", flush=True)
            variants = ("dispatched",)

            def select(variant, m, k, l):  # noqa: E741
                return DISPATCH.select(cap, m, k, l)
        device = "cuda"
    rows = bringup.run_bringup(select, variants, device, log=log)
    print(format_table(("variant", "probe", "result"), rows))
    passed = bringup.verdict(rows, variants)
    print(f"passed every probe: {', '.join(passed) if passed else 'none'}")
    if device == "cuda" and torch.cuda.get_device_capability()[0] == 10:
        path = bringup.write_verdict(passed, torch.cuda.get_device_name())
        print(f"wrote the verdict to {path}; dispatch on this machine now starts from {passed[0] if passed else 'tc'}")
    return 0 if len(passed) == len(variants) else 1


def _cmd_check(args) -> int:
    if args.bringup:
        return _cmd_bringup()
    log = Progress()
    shapes = _check_shapes(args.shapes)
    sf_kinds = _sf_kinds(args.sf)
    if not _has_cuda():
        print(f"{NO_GPU}: the reference against an independent float64 GEMV, and kernel compiles for "
              f"{' and '.join(GPU_ARCHS)}.", flush=True)
        return _check_cpu(shapes, sf_kinds, log)
    return _check_gpu(shapes, sf_kinds, log)


def _check_gpu(shapes, sf_kinds, log) -> int:
    import torch

    from nvfp4_gemv.kernel import custom_kernel
    from submission.reference import check, ref_kernel

    rows, failed = [], 0
    for n, (m, k, l) in enumerate(shapes):  # noqa: E741
        for kind in DATA_KINDS:
            data = _generate(kind, m, k, l, seed=1000 + n, device="cuda")
            ref = ref_kernel(data[:6] + (data[6].clone(),))
            for sf in sf_kinds:
                c = data[6]
                c.fill_(float("nan"))  # an element the kernel never writes fails the check
                try:
                    out = custom_kernel(data, sf_kind=sf)
                    torch.cuda.synchronize()
                    ok, msg = check(out, ref)
                    err = _max_abs_err(out, ref)
                except Exception as e:  # noqa: BLE001
                    ok, msg, err = False, f"{type(e).__name__}: {e}", float("nan")
                failed += not ok
                rows.append(((m, k, l), kind, sf, fmt_err(err), "pass" if ok else f"FAIL: {msg}"))
            log(f"{(m, k, l)} {kind}: done")
    print(format_table(("shape (M,K,L)", "data", "layout", "max abs err", "result"), rows))
    print(f"{len(rows) - failed} of {len(rows)} passed")
    return 1 if failed else 0


def _check_cpu(shapes, sf_kinds, log) -> int:
    import torch

    from submission.fp64_reference import fp64_gemv
    from submission.reference import check, ref_kernel

    rows, failed = [], 0
    for n, (m, k, l) in enumerate(shapes):  # noqa: E741
        for kind in DATA_KINDS:
            data = _generate(kind, m, k, l, seed=1000 + n, device="cpu")
            ref = ref_kernel(data)
            for sf in sf_kinds:
                exact = torch.from_numpy(fp64_gemv(data, sf).astype("float16")).unsqueeze(1)
                ok, msg = check(ref, exact)
                if kind == "contest":  # fp32 sums of contest data are exact: the reference must match bit for bit
                    same = torch.equal(ref.view(torch.int16), exact.view(torch.int16))
                    ok, msg = ok and same, msg if same else f"not bit-exact ({msg})"
                failed += not ok
                rows.append(((m, k, l), kind, sf, fmt_err(_max_abs_err(ref, exact)), "pass" if ok else f"FAIL: {msg}"))
        log(f"reference vs float64 {(m, k, l)}: done")
    print("Reference (fp32 accumulate) vs independent float64 GEMV, rounded to fp16:")
    print(format_table(("shape (M,K,L)", "data", "layout", "max abs err", "result"), rows))
    print(f"{len(rows) - failed} of {len(rows)} passed")
    crow, cok = compile_table(GPU_ARCHS, sf_kinds, log)
    print("Kernel compiles (no GPU needed):")
    print(format_table(("kernel", "target", "seconds", "result"), crow))
    return 0 if failed == 0 and cok else 1


# ---- bench -----------------------------------------------------------------------------------------------------

def _cmd_bench_linear(args) -> int:
    """`bench --linear`: the W4A16 linear against the read, quack and cuBLAS (nvfp4_gemv/linear/bench.py)."""
    from nvfp4_gemv.linear import bench as LB

    out = args.out
    out.mkdir(exist_ok=True)
    if not _has_cuda():
        print(f"{NO_GPU}: the linear is timed on a GPU only; the weight + scale bytes per shape:")
        for n, k in LB.SHAPES:
            print(f"  {n} x {k}: nvfp4 {LB.weight_bytes(n, k, 'nvfp4') / 1e6:.2f} MB, "
                  f"mxfp4 {LB.weight_bytes(n, k, 'mxfp4') / 1e6:.2f} MB")
        return 0
    import torch

    print("host time a call (4096 x 4096, M = 1, calls back to back):", flush=True)
    LB.host_table(log=lambda s: print(s, flush=True))
    stem = "linear" if args.x_dtype == "bf16" else f"linear_{args.x_dtype}"
    LB.run(peers=not args.no_baselines, csv_path=out / f"{stem}.csv", plot_path=out / f"{stem}.png",
           log=lambda s: print(s, flush=True), dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[args.x_dtype])
    print(f"wrote {out / (stem + '.csv')} and {out / (stem + '.png')}")
    return 0


def _cmd_bench_experts(args) -> int:
    """`bench --experts`: routed MoE experts in one launch against the read and a launch a slot."""
    from nvfp4_gemv.linear import bench as LB

    out = args.out
    out.mkdir(exist_ok=True)
    if not _has_cuda():
        print(f"{NO_GPU}: the experts are timed on a GPU only; the (E, N, K, top_k, format) timed there:")
        for shape in LB.EXPERT_SHAPES:
            print(f"  {shape}")
        return 0
    import torch

    stem = "experts" if args.x_dtype == "bf16" else f"experts_{args.x_dtype}"
    LB.experts_run(csv_path=out / f"{stem}.csv", log=lambda s: print(s, flush=True),
                   dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[args.x_dtype])
    print(f"wrote {out / (stem + '.csv')}")
    return 0


def _cmd_bench(args) -> int:
    from nvfp4_gemv import plots

    from nvfp4_gemv.shapes import SUITES

    if args.linear:
        return _cmd_bench_linear(args)
    if args.experts:
        return _cmd_bench_experts(args)
    log = Progress()
    shapes = args.shapes or list(SUITES[args.suite])
    out = args.out
    out.mkdir(exist_ok=True)
    if not _has_cuda():
        bw = args.bandwidth * 1e12
        kind = "nominal H200 HBM3e" if args.bandwidth == H200_NOMINAL_TBPS else "given"
        print(f"{NO_GPU}: compiling the sm_90a kernels and the byte floors at the {kind} bandwidth "
              f"{args.bandwidth:g} TB/s; nothing is timed.", flush=True)
        rows = floor_rows(shapes, bw, kind)
        table = [((r["m"], r["k"], r["l"]), r["bytes"], f"{r['bytes'] / 1e6:.3g}", f"{r['floor_us']:.3f}",
                  f"{b200_sol((r['m'], r['k'], r['l'])):.3f}") for r in rows]
        print(f"Memory floor at {args.bandwidth:g} TB/s ({kind}):")
        print(format_table(("shape (M,K,L)", "bytes moved", "MB", "floor us", "B200 SOL us"), table))
        print(f"geomean floor: {geomean(r['floor_us'] for r in rows):.2f} us")
        crow, cok = compile_table(("sm_90a",), ("permuted",), log)
        print(format_table(("kernel", "target", "seconds", "result"), crow))
        write_csv(rows, out / "bench.csv")
        png = plots.roofline_png(rows, bw, out / "roofline.png", bandwidth_label=f"{kind} {args.bandwidth:g} TB/s")
        print(f"wrote {out / 'bench.csv'} and {png}")
        return 0 if cok else 1

    from nvfp4_gemv.bench import STREAM_READ, benchmark_shapes

    bw, raw = benchmark_shapes(shapes, iters=args.iters, baselines=not args.no_baselines, log=log)
    rows, text = bench_report(raw, bw, ("nvfp4-gemv", STREAM_READ))
    print(text)
    print(read_ratio_report(rows, "nvfp4-gemv", STREAM_READ, describe=_dispatch_choice))
    all_rows = floor_rows(shapes, bw, "measured copy") + rows
    write_csv(all_rows, out / "bench.csv")
    png = plots.roofline_png(all_rows, bw, out / "roofline.png", bandwidth_label=f"measured copy {bw / 1e12:.2f} TB/s")
    print(f"wrote {out / 'bench.csv'} and {png}")
    return 0


def _dispatch_choice(m: int, k: int, l: int) -> str:  # noqa: E741
    import torch

    from nvfp4_gemv.kernel import DISPATCH

    return DISPATCH.describe(torch.cuda.get_device_capability(), m, k, l)


def _cmd_sweep(args) -> int:
    import csv
    import itertools

    from cute_kernels.gemv_simt import GemvSimtConfig
    from nvfp4_gemv.bench import sweep_fields, sweep_rows
    from nvfp4_gemv.shapes import SUITES

    if not _has_cuda():
        print(f"{NO_GPU}: a sweep times kernels, so there is nothing to do here.", file=sys.stderr)
        return 1
    if args.linear:
        from nvfp4_gemv.linear import bench as LB

        args.out.mkdir(exist_ok=True)
        if args.many_tokens:
            LB.many_tokens_sweep(tokens=args.tokens or (33, 64, 96, 128, 192, 256, 512), fmt=args.formats[0],
                                 csv_path=args.out / "linear_many_tokens.csv",
                                 log=lambda s: print(s, flush=True))
            print(f"wrote {args.out / 'linear_many_tokens.csv'}")
            return 0
        LB.sweep(tokens=args.tokens or (1, 4, 8, 16), formats=args.formats, csv_path=args.out / "linear_sweep.csv",
                 log=lambda s: print(s, flush=True))
        print(f"wrote {args.out / 'linear_sweep.csv'}")
        return 0
    if args.warps is None:
        args.warps = [] if (args.balanced or args.dispatched) else [2, 4, 8, 16]
    configs = [("grid", GemvSimtConfig(warps=w, r_lanes=r, unroll=u, rows_per_thread=t, k_splits=s))
               for w, r, u, t, s in itertools.product(args.warps, args.r_lanes, args.unroll, args.rows_per_thread,
                                                      args.k_splits)]
    if args.balanced:
        from nvfp4_gemv.dispatch import BALANCED_CONFIGS, balanced_config

        configs += [("balanced", balanced_config("permuted", *c)) for c in BALANCED_CONFIGS]
    if args.dispatched:
        configs.insert(0, ("dispatched", None))
    rows = sweep_rows(args.shapes or list(SUITES[args.suite]), configs, log=Progress(), timing=args.timing,
                      iters=args.iters)
    args.out.mkdir(exist_ok=True)
    with open(args.out / "sweep.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=sweep_fields(args.timing))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {args.out / 'sweep.csv'} ({len(rows)} rows)")
    return 0


def _ab_names() -> list:
    from nvfp4_gemv.linear.bench import AB_RUNS

    return list(AB_RUNS)


def _cmd_ab(args) -> int:
    from nvfp4_gemv.linear.bench import AB_RUNS

    if not _has_cuda():
        print(f"{NO_GPU}: an A/B run times kernels, so there is nothing to do here.", file=sys.stderr)
        return 1
    args.out.mkdir(exist_ok=True)
    for name in args.runs:
        what, run = AB_RUNS[name]
        path = args.out / f"linear_ab_{name}.csv"
        print(f"== {name}: {what}", flush=True)
        rows = run(rounds=args.rounds, csv_path=path, log=lambda s: print(s, flush=True))
        print(f"wrote {path} ({len(rows)} rows)", flush=True)
    return 0


def _cmd_probes(args) -> int:
    from nvfp4_gemv.linear import probes

    if not _has_cuda():
        print(f"{NO_GPU}: load probes time kernels, so there is nothing to do here.", file=sys.stderr)
        return 1
    args.out.mkdir(exist_ok=True)
    path = args.out / "linear_load_probes.csv"
    rows = probes.load_probe_sweep(shapes=args.shapes, tokens=tuple(args.tokens), formats=tuple(args.formats),
                                   csv_path=path, log=lambda s: print(s, flush=True))
    print(f"wrote {path} ({len(rows)} rows)", flush=True)
    return 0


def _cmd_loops(args) -> int:
    from nvfp4_gemv.linear import bench as LB
    from nvfp4_gemv.linear import loops

    shapes = args.shapes or LB.SHAPES
    points = [(n, k, m, fmt, args.x_dtype) for n, k in shapes for m in args.tokens for fmt in args.formats]
    rows = loops.loops_table(points, args.read_tbs, args.sms, args.clock_ghz, log=lambda s: None)
    cols = ("n", "k", "m", "fmt", "config", "mx_fold", "loops", "instructions", "alu", "fma", "instructions_a_kb",
            "issue_needed", "alu_needed")
    print(format_table(cols, [[r[c] for c in cols] for r in rows]))
    print(f"issue_needed, alu_needed: the shares of a scheduler's cycles that the K loop's issue and its ALU pipe "
          f"need to keep up with a read of {args.read_tbs} TB/s on {args.sms} SMs at {args.clock_ghz} GHz")
    args.out.mkdir(exist_ok=True)
    LB.write_csv(rows, args.out / f"linear_loops_{args.x_dtype}.csv")
    return 0


# ---- compile ---------------------------------------------------------------------------------------------------

def _cmd_compile(args) -> int:
    out = args.out.resolve()
    out.mkdir(exist_ok=True)
    log = Progress()
    with tempfile.TemporaryDirectory(prefix="nvfp4-gemv-dump-") as dump:
        env = dict(os.environ, CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=dump, CUTE_DSL_ARCH=args.arch)
        code = "import sys; from nvfp4_gemv.artifacts import compile_artifacts; sys.exit(compile_artifacts(*sys.argv[1:]))"
        log(f"compiling the {args.arch} kernels in a child process (CUTE_DSL_KEEP=ptx,cubin)")
        rc = subprocess.run([sys.executable, "-c", code, args.arch, str(out)], env=env).returncode
    if rc != 0:
        print(f"compile for {args.arch} failed (exit {rc})", file=sys.stderr)
        return 1
    manifest = json.loads((out / "manifest.json").read_text())
    summary = summarize(out, manifest)
    (out / "summary.txt").write_text(summary)
    print(summary, end="")
    written = [f"{e['name']}.{ext}" for e in manifest for ext in ("ptx", "cubin", "sass") if ext != "sass" or e["sass"]]
    print(f"wrote {', '.join(sorted(written + ['manifest.json', 'summary.txt']))} into {out}")
    return 0


# ---- submission ------------------------------------------------------------------------------------------------


def _cmd_submission(args) -> int:
    from submission.generate import write_submission

    args.out.mkdir(exist_ok=True)
    path = args.out / "submission.py"  # the name GPU MODE expects; in its own folder, where it shadows nothing
    log = Progress()
    log(f"writing {path}")
    write_submission(path)
    log(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


# ---- entry -----------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nvfp4-gemv", description="NVFP4 batched GEMV: check, benchmark, compile, "
                                "and write the GPU MODE submission file.")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("check", help="custom_kernel vs the reference on the test shapes (CPU: reference vs float64, "
                       "and kernel compiles)")
    c.add_argument("--shapes", choices=("contest", "all"), default="contest",
                   help="contest: the 9 test shapes; all: plus the ragged ones (default: contest)")
    c.add_argument("--sf", choices=("permuted", "plain", "both"), default="both",
                   help="scale layout the kernel reads (default: both)")
    c.add_argument("--bringup", action="store_true",
                   help="on a Blackwell GPU: run every variant on adversarial probes, print a verdict table and "
                   "record which variants dispatch may use (elsewhere: check the probes)")
    c.set_defaults(func=_cmd_check)

    b = sub.add_parser("bench", help="contest and CUDA-graph timing against the copy-bandwidth floor, with baselines")
    b.add_argument("--shapes", nargs="+", type=_shape_arg, metavar="M,K,L",
                   help="shapes to time (default: the --suite's)")
    b.add_argument("--suite", choices=("contest", "decode"), default="contest",
                   help="contest: the three benchmark shapes; decode: those and LLM decode shapes "
                   "(nvfp4_gemv.shapes.DECODE_SUITE), each beside a stream read of its bytes (default: contest)")
    b.add_argument("--iters", type=_positive_int, default=100,
                   help="contest-timing iterations per variant (default: 100)")
    b.add_argument("--out", type=_out_folder, default="bench-out",
                   help="folder for bench.csv and roofline.png (default: bench-out)")
    b.add_argument("--no-baselines", action="store_true", help="time nvfp4-gemv only")
    b.add_argument("--linear", action="store_true",
                   help="the W4A16 linear (NVFP4 and MXFP4 weights, M = 1..16) against the read of its bytes, quack "
                        "gemm_w4a16 and cuBLAS in x's dtype; writes linear.csv and linear.png (linear_fp16.* with "
                        "--x-dtype fp16)")
    b.add_argument("--experts", action="store_true",
                   help="routed MoE experts (fp4_experts_linear, one launch a call) against the read of the experts' "
                        "bytes and a launch a (token, expert) slot, at T = 1..16; writes experts.csv")
    b.add_argument("--x-dtype", choices=("bf16", "fp16"), default="bf16",
                   help="--linear, --experts: the activations' dtype")
    b.add_argument("--bandwidth", type=_bandwidth, default=H200_NOMINAL_TBPS, metavar="TB/S",
                   help=f"without a GPU: the bandwidth of the floor table (default: the H200's nominal "
                   f"{H200_NOMINAL_TBPS} TB/s)")
    b.set_defaults(func=_cmd_bench)

    w = sub.add_parser("sweep", help="time CUDA-core kernel configs on a suite beside the stream read (GPU)")
    w.add_argument("--suite", choices=("contest", "decode"), default="decode")
    w.add_argument("--shapes", nargs="+", type=_shape_arg, metavar="M,K,L", help="shapes (default: the --suite's)")
    w.add_argument("--warps", nargs="+", type=_positive_int, default=None,
                   help="warps a CTA of the one-CTA-a-row-tile grid (default 2 4 8 16; none with --balanced or "
                        "--dispatched alone)")
    w.add_argument("--r-lanes", nargs="+", type=int, choices=(1, 2, 4, 8), default=[2, 4, 8])
    w.add_argument("--unroll", nargs="+", type=_positive_int, default=[2, 4])
    w.add_argument("--rows-per-thread", nargs="+", type=int, choices=(1, 2, 4), default=[1])
    w.add_argument("--k-splits", nargs="+", type=int, choices=(1, 2, 4, 8), default=[1],
                   help="CTAs of a cluster splitting K (default: 1)")
    w.add_argument("--balanced", action="store_true",
                   help="also the K-balanced schedule (GemvSimtBalanced) in each of dispatch.BALANCED_CONFIGS")
    w.add_argument("--dispatched", action="store_true", help="also what custom_kernel picks for each shape")
    w.add_argument("--timing", choices=("graph", "contest"), default="graph",
                   help="graph: kernel time, one CUDA graph of 20+ calls (default); contest: the contest's timing, "
                        "each call after an L2 flush, events around the Python call (the targets' timing)")
    w.add_argument("--iters", type=_positive_int, default=50, help="--timing contest: calls a config (default 50)")
    w.add_argument("--out", type=_out_folder, default="bench-out", help="folder for sweep.csv (default: bench-out)")
    w.add_argument("--linear", action="store_true",
                   help="the W4A16 linear instead: every split its launcher chooses from (nvfp4_gemv.linear.bench."
                        "sweep_configs) on its shapes; writes linear_sweep.csv")
    w.add_argument("--many-tokens", action="store_true",
                   help="--linear: past 16 tokens, the fp4 kernel in both grid orders against the dequantize-and-GEMM "
                        "path and cuBLAS bf16 (the data behind PREFILL_MIN_TOKENS and m_major); writes "
                        "linear_many_tokens.csv")
    w.add_argument("--tokens", nargs="+", type=_positive_int, default=None,
                   help="--linear: token counts M (default 1 4 8 16; with --many-tokens 33 64 96 128 192 256 512)")
    w.add_argument("--formats", nargs="+", choices=("nvfp4", "mxfp4"), default=["nvfp4"], help="--linear: formats")
    w.set_defaults(func=_cmd_sweep)

    a = sub.add_parser("ab", help="the W4A16 linear: time configs its launcher's rules would change against the "
                       "dispatched ones, alternately, beside the read (GPU)")
    a.add_argument("runs", nargs="+", choices=_ab_names(), metavar="RUN",
                   help="one or more of: " + ", ".join(_ab_names()))
    a.add_argument("--rounds", type=_positive_int, default=2, help="alternate rounds, the best of each (default 2)")
    a.add_argument("--out", type=_out_folder, default="bench-out",
                   help="folder for linear_ab_<run>.csv (default: bench-out)")
    a.set_defaults(func=_cmd_ab)

    q = sub.add_parser("probes", help="the W4A16 linear's load probes: its kernel with the scale loads, the x loads or "
                       "both taken out of the K loop (wrong results, timing only), beside the kernel and the read (GPU)")
    q.add_argument("--shapes", nargs="+", type=_linear_shape_arg, metavar="N,K", default=None,
                   help="weight shapes (default: the bench's 12)")
    q.add_argument("--tokens", nargs="+", type=_positive_int, default=[1, 4], help="token counts M (default 1 4)")
    q.add_argument("--formats", nargs="+", choices=("nvfp4", "mxfp4"), default=["nvfp4", "mxfp4"])
    q.add_argument("--out", type=_out_folder, default="bench-out",
                   help="folder for linear_load_probes.csv (default: bench-out)")
    q.set_defaults(func=_cmd_probes)

    o = sub.add_parser("loops", help="the W4A16 linear's K loop for sm_90a, compiled here: its SASS instructions a "
                       "step by pipe, and the issue and ALU shares it needs to keep up with a read rate (no GPU)")
    o.add_argument("--shapes", nargs="+", type=_linear_shape_arg, metavar="N,K", default=None,
                   help="weight shapes (default: the bench's 12)")
    o.add_argument("--tokens", nargs="+", type=_positive_int, default=[1, 2, 4, 8, 16],
                   help="token counts M (default 1 2 4 8 16)")
    o.add_argument("--formats", nargs="+", choices=("nvfp4", "mxfp4"), default=["nvfp4", "mxfp4"])
    o.add_argument("--x-dtype", choices=("bf16", "fp16"), default="bf16")
    o.add_argument("--read-tbs", type=_bandwidth, default=4.2,
                   help="the read rate to keep up with, TB/s (default 4.2: the H200's stream read of large weights)")
    o.add_argument("--sms", type=_positive_int, default=132, help="SMs (default 132: H200, H100 SXM)")
    o.add_argument("--clock-ghz", type=_clock, default=1.78,
                   help="SM clock under load, GHz (default 1.78: what ncu saw on the H200 under this load)")
    o.add_argument("--out", type=_out_folder, default="bench-out",
                   help="folder for linear_loops_<x dtype>.csv (default: bench-out)")
    o.set_defaults(func=_cmd_loops)

    k = sub.add_parser("compile", help="write PTX, cubin (and SASS with nvdisasm) and an instruction summary")
    k.add_argument("--arch", choices=GPU_ARCHS, required=True)
    k.add_argument("--out", type=_out_folder, required=True, help="output folder")
    k.set_defaults(func=_cmd_compile)

    s = sub.add_parser("submission", help="write the single-file GPU MODE submission")
    s.add_argument("--out", type=_out_folder, default=SUBMISSION_OUT,
                   help=f"folder to write submission.py into (default: {SUBMISSION_OUT}; a submission.py in the "
                   f"project folder would hide the project's `submission` package)")
    s.set_defaults(func=_cmd_submission)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
