"""What `nvfp4-gemv compile` and `check` build, and the artifacts `compile` writes: PTX, cubin, SASS (with
nvdisasm) and a static instruction summary of each kernel.

`compile_artifacts` runs in a child process started with CUTE_DSL_KEEP=ptx,cubin (read when cutlass is imported);
the compiled objects' __ptx__ and __cubin__ are what get written.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

from cute_kernels.targets import GPU_ARCHS
from layouts.constants import SF_KINDS
from nvfp4_gemv.report import Progress, format_table


def kernel_builders(arch: str, sf_kinds=SF_KINDS):
    """[(name, build)] for the kernels of a target: sm_90a -> the CUDA-core kernel in each scale layout; sm_100a -> the
    tensor-core kernel (permuted scales only) and the CUDA-core kernel with the hardware fp4 decode. The CUDA-core
    configs are those custom_kernel picks for the first benchmark shape."""
    from nvfp4_gemv.kernel import simt_config_for
    from nvfp4_gemv.shapes import BENCH_SHAPES

    if arch not in GPU_ARCHS:
        raise ValueError(f"arch must be one of {GPU_ARCHS}, got {arch!r}")
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
