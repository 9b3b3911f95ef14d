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
import csv
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DATA_KINDS = ("contest", "full", "full+nan")
SF_KINDS = ("permuted", "plain")
ARCHS = ("sm_90a", "sm_100a")
# The H200's nominal HBM3e bandwidth (datasheet), used for the floor table when nothing can be measured.
H200_NOMINAL_TBPS = 4.8
NO_GPU = "No CUDA GPU is present: running the CPU part only"


# ---- output helpers ---------------------------------------------------------------------------------------------


class Progress:
    """One line per step, prefixed with the seconds since the command started."""

    def __init__(self, out=None):
        self.t0 = time.perf_counter()
        self.out = out or sys.stdout

    def __call__(self, msg: str):
        print(f"[{time.perf_counter() - self.t0:7.1f}s] {msg}", file=self.out, flush=True)


def format_table(headers, rows) -> str:
    """A plain-text table: columns as wide as their widest cell, numbers right-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def numeric(c):
        try:
            float(c)
            return True
        except ValueError:
            return False

    def line(r, header=False):
        out = [c.rjust(w) if not header and numeric(c) else c.ljust(w) for c, w in zip(r, widths)]
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0], header=True), sep] + [line(c) for c in cells[1:]])


def _fmt_err(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.6g}"


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


# ---- independent float64 GEMV (CPU) ---------------------------------------------------------------------------


def _fp4_f64(codes):
    """e2m1 codes -> float64 from the bit formula: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0."""
    import numpy as np

    codes = codes.astype(np.int64)
    e, mant = (codes >> 1) & 3, codes & 1
    mag = np.where(e == 0, 0.5 * mant, np.exp2(e - 1.0) * (1.0 + 0.5 * mant))
    return np.where(codes & 8, -mag, mag)


def _e4m3_f64(byte):
    """e4m3fn bytes -> float64 from the bit formula: bias 7, subnormals at exponent 0, NaN at S.1111.111."""
    import numpy as np

    byte = byte.astype(np.int64)
    e, mant = (byte >> 3) & 15, byte & 7
    mag = np.where(e == 0, mant / 8.0 * 2.0**-6, np.exp2(e - 7.0) * (1.0 + mant / 8.0))
    mag = np.where((e == 15) & (mant == 7), np.nan, mag)
    return np.where(byte & 0x80, -mag, mag)


def _storage_bytes(t):
    """Every byte of t's storage from t's first element on, as a flat numpy uint8 array (no copy)."""
    import torch

    u = t.view(torch.uint8)
    return u.as_strided((u.untyped_storage().nbytes() - u.storage_offset(),), (1,)).numpy()


def fp64_gemv(data, sf_kind: str = "permuted"):
    """float64 c as an (M, L) numpy array, decoded by bit formulas; the scales come from the plain buffers or, for
    sf_kind="permuted", from the raw permuted buffers at CONTRACT.md's offsets (layouts.closed_form)."""
    import numpy as np
    import torch

    from layouts.closed_form import permuted_index_array

    a, b, sfa, sfb, sfa_p, sfb_p, _ = data
    m, kb, l = a.shape  # noqa: E741
    k = 2 * kb
    a_u8 = a.view(torch.uint8).permute(2, 0, 1).numpy()  # (L, M, K/2)
    b_u8 = b.view(torch.uint8)[0].T.numpy()  # (L, K/2)
    if sf_kind == "permuted":
        sa = _storage_bytes(sfa_p)[permuted_index_array(m, k, l)].transpose(2, 0, 1)  # (L, M, K/16)
        sb = _storage_bytes(sfb_p)[permuted_index_array(128, k, l)][0].T  # (L, K/16)
    else:
        sa = sfa.view(torch.uint8).permute(2, 0, 1).numpy()
        sb = sfb.view(torch.uint8)[0].T.numpy()
    # Tables of the bit formulas over every code and byte, so each element costs one lookup.
    fp4, e4m3 = _fp4_f64(np.arange(16)), _e4m3_f64(np.arange(256))
    sa, sb = np.ascontiguousarray(sa), np.ascontiguousarray(sb)
    out = np.empty((m, l))
    with np.errstate(invalid="ignore"):
        for li in range(l):
            bv = fp4[np.stack((b_u8[li] & 15, b_u8[li] >> 4), -1).reshape(k)] * np.repeat(e4m3[sb[li]], 16)
            av = fp4[np.stack((a_u8[li] & 15, a_u8[li] >> 4), -1).reshape(m, k)]
            av *= np.repeat(e4m3[sa[li]], 16, axis=1)
            out[:, li] = av @ bv
    return out


def _max_abs_err(out, ref) -> float:
    """Largest |out - ref| over elements finite in both (NaN if none is)."""
    import torch

    o = out.detach().cpu().double()
    r = ref.detach().cpu().double()
    both = o.isfinite() & r.isfinite()
    return float((o - r).abs()[both].max()) if bool(both.any()) else float("nan")


# ---- kernels to compile -----------------------------------------------------------------------------------------


def kernel_builders(arch: str, sf_kinds=SF_KINDS):
    """[(name, build)] for the kernels of a target: sm_90a -> the CUDA-core kernel in each scale layout; sm_100a -> the
    tensor-core kernel (permuted scales only) and the CUDA-core kernel with the hardware fp4 decode. The CUDA-core
    configs are those custom_kernel picks for the first benchmark shape."""
    from nvfp4_gemv.kernel import simt_config_for
    from nvfp4_gemv.shapes import BENCH_SHAPES

    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    m, k, l = BENCH_SHAPES[0].mkl  # noqa: E741
    out = []
    if arch == "sm_100a" and "permuted" in sf_kinds:

        def build_tc():
            from cute_kernels import gemv_tc_sm100
            from cute_kernels.compile import compile_kernel

            return compile_kernel(gemv_tc_sm100.GemvTcSm100, gemv_tc_sm100.GemvTcSm100Config(), arch)

        out.append(("gemv_tc_sm100a_permuted", build_tc))
    for sf in sf_kinds:
        cfg = simt_config_for(m, k, l, sf)

        def build_simt(cfg=cfg):
            from cute_kernels import gemv_simt
            from cute_kernels.compile import compile_kernel

            return compile_kernel(gemv_simt.GemvSimt, cfg, arch)

        out.append((f"gemv_simt_{arch}_{sf}", build_simt))
    return out


def compile_table(archs, sf_kinds, log) -> tuple[list, bool]:
    """Compile every kernel of `archs` in this process; rows (kernel, arch, seconds, PTX lines, result)."""
    rows, ok = [], True
    for arch in archs:
        for name, build in kernel_builders(arch, sf_kinds):
            log(f"compiling {name}")
            t = time.perf_counter()
            try:
                build()
                res = "ok"
            except Exception as e:  # noqa: BLE001  (reported in the table; the command exits non-zero)
                res = f"FAIL: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                ok = False
            rows.append((name, arch, round(time.perf_counter() - t, 1), res))
    return rows, ok


# ---- check -----------------------------------------------------------------------------------------------------


def _cmd_check(args) -> int:
    log = Progress()
    shapes = _check_shapes(args.shapes)
    sf_kinds = _sf_kinds(args.sf)
    if not _has_cuda():
        print(f"{NO_GPU}: the reference against an independent float64 GEMV, and kernel compiles for "
              f"{' and '.join(ARCHS)}.", flush=True)
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
                rows.append(((m, k, l), kind, sf, _fmt_err(err), "pass" if ok else f"FAIL: {msg}"))
            log(f"{(m, k, l)} {kind}: done")
    print(format_table(("shape (M,K,L)", "data", "layout", "max abs err", "result"), rows))
    print(f"{len(rows) - failed} of {len(rows)} passed")
    return 1 if failed else 0


def _check_cpu(shapes, sf_kinds, log) -> int:
    import torch

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
                rows.append(((m, k, l), kind, sf, _fmt_err(_max_abs_err(ref, exact)), "pass" if ok else f"FAIL: {msg}"))
        log(f"reference vs float64 {(m, k, l)}: done")
    print("Reference (fp32 accumulate) vs independent float64 GEMV, rounded to fp16:")
    print(format_table(("shape (M,K,L)", "data", "layout", "max abs err", "result"), rows))
    print(f"{len(rows) - failed} of {len(rows)} passed")
    crow, cok = compile_table(ARCHS, sf_kinds, log)
    print("Kernel compiles (no GPU needed):")
    print(format_table(("kernel", "target", "seconds", "result"), crow))
    return 0 if failed == 0 and cok else 1


# ---- bench -----------------------------------------------------------------------------------------------------

CSV_FIELDS = ("m", "k", "l", "variant", "bytes", "floor_us", "contest_us", "graph_us", "tb_s", "x_floor",
              "bandwidth_tb_s", "bandwidth_kind")


def floor_rows(shapes, bandwidth: float, kind: str):
    """Rows of the floor table: bytes moved and bytes/bandwidth per shape (bandwidth in bytes/s)."""
    from nvfp4_gemv.shapes import bytes_moved, floor_us

    return [
        {"m": m, "k": k, "l": l, "variant": "floor", "bytes": bytes_moved(m, k, l),
         "floor_us": floor_us(m, k, l, bandwidth), "contest_us": float("nan"), "graph_us": float("nan"),
         "tb_s": bandwidth / 1e12, "x_floor": 1.0, "bandwidth_tb_s": bandwidth / 1e12, "bandwidth_kind": kind}
        for m, k, l in shapes  # noqa: E741
    ]


def _b200_sol(shape):
    from nvfp4_gemv.shapes import BENCH_SHAPES

    return {s.mkl: s.b200_sol_us for s in BENCH_SHAPES}.get(tuple(shape), float("nan"))


def _geomean(values) -> float:
    """Geometric mean; NaN for no values."""
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


def write_csv(rows, path: Path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def _cmd_bench(args) -> int:
    from nvfp4_gemv import plots
    from nvfp4_gemv.shapes import BENCH_SHAPES

    log = Progress()
    shapes = args.shapes or [s.mkl for s in BENCH_SHAPES]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not _has_cuda():
        bw = args.bandwidth * 1e12
        kind = "nominal H200 HBM3e" if args.bandwidth == H200_NOMINAL_TBPS else "given"
        print(f"{NO_GPU}: compiling the sm_90a kernels and the byte floors at the {kind} bandwidth "
              f"{args.bandwidth:g} TB/s; nothing is timed.", flush=True)
        rows = floor_rows(shapes, bw, kind)
        table = [((r["m"], r["k"], r["l"]), r["bytes"], f"{r['bytes'] / 1e6:.3g}", f"{r['floor_us']:.3f}",
                  f"{_b200_sol((r['m'], r['k'], r['l'])):.3f}") for r in rows]
        print(f"Memory floor at {args.bandwidth:g} TB/s ({kind}):")
        print(format_table(("shape (M,K,L)", "bytes moved", "MB", "floor us", "B200 SOL us"), table))
        print(f"geomean floor: {_geomean(r['floor_us'] for r in rows):.2f} us")
        crow, cok = compile_table(("sm_90a",), ("permuted",), log)
        print(format_table(("kernel", "target", "seconds", "result"), crow))
        write_csv(rows, out / "bench.csv")
        png = plots.roofline_png(rows, bw, out / "roofline.png", bandwidth_label=f"{kind} {args.bandwidth:g} TB/s")
        print(f"wrote {out / 'bench.csv'} and {png}")
        return 0 if cok else 1

    from nvfp4_gemv.bench import STREAM_READ, benchmark_shapes
    from nvfp4_gemv.shapes import bytes_moved

    bw, raw = benchmark_shapes(shapes, iters=args.iters, baselines=not args.no_baselines, log=log)
    rows = []
    for r in raw:
        nb = bytes_moved(r["m"], r["k"], r["l"])
        rows.append({**r, "bytes": nb, "tb_s": nb / (r["contest_us"] * 1e-6) / 1e12,
                     "x_floor": r["contest_us"] / r["floor_us"], "bandwidth_tb_s": bw / 1e12,
                     "bandwidth_kind": "measured copy"})
    table = [((r["m"], r["k"], r["l"]), r["variant"], f"{r['contest_us']:.2f}", f"{r['graph_us']:.2f}",
              f"{r['tb_s']:.2f}", f"{r['x_floor']:.2f}", f"{r['floor_us']:.2f}",
              f"{_b200_sol((r['m'], r['k'], r['l'])):.3f}") for r in rows]
    print(f"copy bandwidth (measured): {bw / 1e12:.3f} TB/s")
    print(format_table(("shape (M,K,L)", "variant", "contest us", "graph us", "TB/s", "x floor", "floor us",
                        "B200 SOL us"), table))
    geo_floor = _geomean(r["floor_us"] for r in rows if r["variant"] == "nvfp4-gemv")
    for name in ("nvfp4-gemv", STREAM_READ):
        geo = _geomean(r["contest_us"] for r in rows if r["variant"] == name)
        if not math.isnan(geo):
            print(f"{name} geomean (contest timing): {geo:.2f} us = {geo / geo_floor:.2f} x floor ({geo_floor:.2f} us)")
    all_rows = floor_rows(shapes, bw, "measured copy") + rows
    write_csv(all_rows, out / "bench.csv")
    png = plots.roofline_png(all_rows, bw, out / "roofline.png", bandwidth_label=f"measured copy {bw / 1e12:.2f} TB/s")
    print(f"wrote {out / 'bench.csv'} and {png}")
    return 0


# ---- compile ---------------------------------------------------------------------------------------------------

# (label, regex on a PTX instruction's opcode); counts are static (instructions in the code, not executed).
PTX_PATTERNS = (
    ("ld.global.v4", r"ld\.global(\.\S+)?\.v4\."),
    ("ld.global", r"ld\.global\."),
    ("cp.async.ca/cg", r"cp\.async\.c[ag]\."),  # global -> shared, 4/8/16 B (cg: always 16 B)
    ("ld.local", r"ld\.local\."),
    ("st.local", r"st\.local\."),
    ("prmt", r"prmt\."),
    ("dp4a", r"dp4a\."),
    ("cvt.rn.f16x2.e2m1x2", r"cvt\.rn\.f16x2\.e2m1x2"),
    ("cvt.rn.f16x2.e4m3x2", r"cvt\.rn\.f16x2\.e4m3x2"),
    ("fma.rn.f16x2", r"fma\.rn(\.\S+)?\.f16x2"),
    ("fma.rn.f32", r"fma\.rn\.f32"),
    ("shfl.sync", r"shfl\.sync\."),
    ("tcgen05.mma", r"tcgen05\.mma\."),
    ("tcgen05.cp", r"tcgen05\.cp\."),
    ("tcgen05.ld", r"tcgen05\.ld\."),
    ("cp.async.bulk.tensor", r"cp\.async\.bulk\.tensor\."),
    ("atom/red", r"(atom|red)\."),
)
SASS_PATTERNS = (
    ("LDG.128", r"LDG\.E(\.\S+)?\.128"),
    ("LDL", r"LDL\b"),
    ("STL", r"STL\b"),
    ("PRMT", r"PRMT\b"),
    ("IDP.4A", r"IDP\.4A"),
    ("HFMA2", r"HFMA2\b"),
    ("UTCOMMA", r"UTC\w*MMA"),
    ("UTMALDG", r"UTMALDG"),
)
_PTX_OPCODE = re.compile(r"^\s*(?:@!?%\w+\s+)?([a-z][\w.:]*)")
_SASS_OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)")


def ptx_opcodes(ptx: str) -> list[str]:
    """The opcode of every instruction line of a PTX text (directives, labels and comments excluded)."""
    ops = []
    for line in ptx.splitlines():
        mt = _PTX_OPCODE.match(line)
        if mt and not line.lstrip().startswith((".", "//")) and not mt.group(1).endswith(":"):
            ops.append(mt.group(1))
    return ops


def instruction_counts(text: str, sass: bool = False) -> dict[str, int]:
    """{label: count} of the key instructions in PTX (or, with sass=True, in nvdisasm output)."""
    if sass:
        ops = [mt.group(1) for mt in _SASS_OPCODE.finditer(text)]
        patterns = SASS_PATTERNS
    else:
        ops = ptx_opcodes(text)
        patterns = PTX_PATTERNS
    return {label: sum(1 for op in ops if re.match(rx, op + ".")) for label, rx in patterns}


def _nvdisasm() -> str | None:
    """The nvdisasm binary: on PATH, else from the nvidia-cuda-nvdisasm wheel; None if neither."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    from importlib import metadata

    try:
        dist = metadata.distribution("nvidia-cuda-nvdisasm")
    except metadata.PackageNotFoundError:
        return None
    for entry in dist.files or ():
        if entry.name == "nvdisasm" and Path(str(dist.locate_file(entry))).is_file():
            return str(dist.locate_file(entry))
    return None


def compile_artifacts(arch: str, out: str) -> int:
    """Compile the kernels of `arch` and write NAME.ptx, NAME.cubin (and NAME.sass) into `out`, plus manifest.json.

    Runs in a process started with CUTE_DSL_KEEP=ptx,cubin and CUTE_DSL_DUMP_DIR set before cutlass is imported;
    the compiled objects' __ptx__ (text) and __cubin__ (ELF bytes) are what get written.
    """
    log = Progress()
    out_dir = Path(out)
    nvdisasm = _nvdisasm()
    manifest = []
    # sm_100a: the tensor-core kernel and the CUDA-core variant, both on the contest's permuted scales.
    for name, build in kernel_builders(arch, SF_KINDS if arch == "sm_90a" else ("permuted",)):
        log(f"compiling {name} for {arch}")
        t = time.perf_counter()
        compiled = build()
        ptx, cubin = compiled.__ptx__, compiled.__cubin__
        if not isinstance(ptx, str) or f".target {arch}" not in ptx:
            raise RuntimeError(f"{name}: no {arch} PTX text kept; CUTE_DSL_KEEP must be set before import cutlass")
        if not isinstance(cubin, bytes) or not cubin.startswith(b"\x7fELF"):
            raise RuntimeError(f"{name}: no cubin kept; CUTE_DSL_KEEP must include cubin")
        (out_dir / f"{name}.ptx").write_text(ptx)
        (out_dir / f"{name}.cubin").write_bytes(cubin)
        entry = {"name": name, "arch": arch, "seconds": round(time.perf_counter() - t, 2), "sass": False}
        if nvdisasm:
            sass = subprocess.run([nvdisasm, "-c", str(out_dir / f"{name}.cubin")], capture_output=True, text=True,
                                  check=True).stdout
            (out_dir / f"{name}.sass").write_text(sass)
            entry["sass"] = True
        manifest.append(entry)
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return 0


def summarize(out_dir: Path, manifest) -> str:
    """The instruction summary of the written artifacts: one PTX table (and one SASS table if SASS was written)."""
    names = [e["name"] for e in manifest]
    ptx_counts = {n: instruction_counts((out_dir / f"{n}.ptx").read_text()) for n in names}
    labels = [lab for lab, _ in PTX_PATTERNS]
    lines = ["Static instruction counts in the PTX (instructions in the code, not executed):",
             format_table(["instruction"] + names, [[lab] + [ptx_counts[n][lab] for n in names] for lab in labels])]
    sass_names = [e["name"] for e in manifest if e["sass"]]
    if sass_names:
        sc = {n: instruction_counts((out_dir / f"{n}.sass").read_text(), sass=True) for n in sass_names}
        slabels = [lab for lab, _ in SASS_PATTERNS]
        lines += ["", "Static instruction counts in the SASS:",
                  format_table(["instruction"] + sass_names, [[lab] + [sc[n][lab] for n in sass_names] for lab in slabels])]
    else:
        lines += ["", "SASS: not written (no nvdisasm; `pip install nvidia-cuda-nvdisasm` adds it)."]
    sizes = [(e["name"], e["seconds"], (out_dir / f"{e['name']}.ptx").stat().st_size,
              (out_dir / f"{e['name']}.cubin").stat().st_size) for e in manifest]
    lines += ["", format_table(("kernel", "compile s", "PTX bytes", "cubin bytes"), sizes)]
    return "\n".join(lines) + "\n"


def _cmd_compile(args) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    log = Progress()
    with tempfile.TemporaryDirectory(prefix="nvfp4-gemv-dump-") as dump:
        env = dict(os.environ, CUTE_DSL_KEEP="ptx,cubin", CUTE_DSL_DUMP_DIR=dump, CUTE_DSL_ARCH=args.arch)
        code = "import sys; from nvfp4_gemv.cli import compile_artifacts; sys.exit(compile_artifacts(*sys.argv[1:]))"
        log(f"compiling the {args.arch} kernels in a child process (CUTE_DSL_KEEP=ptx,cubin)")
        rc = subprocess.run([sys.executable, "-c", code, args.arch, str(out)], env=env).returncode
    if rc != 0:
        print(f"compile for {args.arch} failed (exit {rc})", file=sys.stderr)
        return 1
    manifest = json.loads((out / "manifest.json").read_text())
    summary = summarize(out, manifest)
    (out / "summary.txt").write_text(summary)
    print(summary, end="")
    print(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} into {out}")
    return 0


# ---- submission ------------------------------------------------------------------------------------------------


def _cmd_submission(args) -> int:
    from submission.generate import write_submission

    path = Path(args.out)
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
    c.set_defaults(func=_cmd_check)

    b = sub.add_parser("bench", help="contest and CUDA-graph timing against the copy-bandwidth floor, with baselines")
    b.add_argument("--shapes", nargs="+", type=_shape_arg, metavar="M,K,L",
                   help="shapes to time (default: the three contest benchmark shapes)")
    b.add_argument("--iters", type=int, default=100, help="contest-timing iterations per variant (default: 100)")
    b.add_argument("--out", default="bench-out", help="folder for bench.csv and roofline.png (default: bench-out)")
    b.add_argument("--no-baselines", action="store_true", help="time nvfp4-gemv only")
    b.add_argument("--bandwidth", type=float, default=H200_NOMINAL_TBPS, metavar="TB/S",
                   help=f"without a GPU: the bandwidth of the floor table (default: the H200's nominal "
                   f"{H200_NOMINAL_TBPS} TB/s)")
    b.set_defaults(func=_cmd_bench)

    k = sub.add_parser("compile", help="write PTX, cubin (and SASS with nvdisasm) and an instruction summary")
    k.add_argument("--arch", choices=ARCHS, required=True)
    k.add_argument("--out", required=True, help="output folder")
    k.set_defaults(func=_cmd_compile)

    s = sub.add_parser("submission", help="write the single-file GPU MODE submission")
    s.add_argument("--out", default="submission.py", help="path of the file to write (default: submission.py)")
    s.set_defaults(func=_cmd_submission)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "iters", 1) < 1:
        parser.error(f"--iters must be >= 1, got {args.iters}")
    if getattr(args, "bandwidth", 1.0) <= 0:
        parser.error(f"--bandwidth must be positive, got {args.bandwidth}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
