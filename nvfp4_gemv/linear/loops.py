"""The linear's K loop as the compiler leaves it: the SASS instructions of a K step of a dispatched config, by pipe,
and the share of the issue slots and of the ALU pipe that the loop needs to keep up with a read rate.

No GPU is needed: each config is compiled for sm_90a in a child process (CUTE_DSL_KEEP=cubin must be set before the
DSL loads) and its cubin read back with nvdisasm (the nvidia-cuda-nvdisasm wheel of the test extras). A K loop is a
backward branch whose body holds an HMMA; its instructions are counted statically, one pass of the body being one
K step of one warp (the loops are not unrolled: `unroll` 1).

The model (BENCHMARKS.md, "Predicted vs measured, and where the time goes"): at a read rate R (bytes a second of W
and its scales) over S SMs at clock f, a scheduler (4 an SM) must issue `instructions` warp instructions for each
`bytes` the step reads, so it is busy R / (4 S f) · instructions / bytes of its cycles; the ALU pipe takes a warp
instruction every other cycle (16 lanes a scheduler), so it is busy twice its instructions' share. Either above 100 %
caps the rate; near it, the latency that the resident warps must also hide leaves no slack.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from nvfp4_gemv.artifacts import _SASS_OPCODE, _nvdisasm

# Hopper's pipes of the opcodes the K loops hold (as ncu's `sm__inst_executed_pipe_*` metrics split them): the ALU
# pipe takes integer logic, shifts, byte permutes, compares and the integer adds that are not IMADs; the FMA pipe the
# IMADs and the f16/bf16/f32 multiplies and adds; the rest are named by their own pipe.
PIPES = {
    "alu": ("LOP3", "SHF", "PRMT", "IADD3", "LEA", "ISETP", "SEL", "F2FP", "VIMNMX", "IMNMX", "FSEL", "PLOP3",
            "VIADD", "SHL", "SHR", "LOP"),
    "fma": ("IMAD", "HMUL2", "HFMA2", "HADD2", "FMUL", "FFMA", "FADD", "IMUL"),
    "tensor": ("HMMA",),
    "lsu": ("LDG", "LDS", "LDL", "STL", "STS", "STG", "LD", "ST"),
}
_LABEL = re.compile(r"\s*(\.L_x_\d+):")
_BACK_BRANCH = re.compile(r"\bBRA\s+(?:!?U?P\w+,\s*)?`\((\.L_x_\d+)\)")  # also `BRA P1, ...` (a loop's exit test)
SCHEDULERS = 4  # warp schedulers an SM (sm_90)
ALU_CYCLES = 2  # cycles a warp instruction holds the ALU pipe (16 lanes a scheduler)


def mma_loops(sass: str) -> list[list[str]]:
    """The opcodes of every loop of nvdisasm output that holds an HMMA: the instructions from a label to the
    backward branch to it, in order (predicated ones included)."""
    lines = sass.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := _LABEL.match(line))}
    loops = []
    for i, line in enumerate(lines):
        m = _BACK_BRANCH.search(line)
        if m and labels.get(m.group(1), i) < i:
            ops = [mt.group(1).split(".")[0] for b in lines[labels[m.group(1)] : i + 1]
                   if (mt := _SASS_OPCODE.search(b))]
            if "HMMA" in ops:
                loops.append(ops)
    return loops


def pipe_of(op: str) -> str:
    """The pipe an opcode issues to (PIPES), "uniform" for the uniform datapath's U-opcodes, else "other"."""
    for pipe, ops in PIPES.items():
        if op in ops:
            return pipe
    return "uniform" if op.startswith("U") else "other"


def loop_counts(ops: list[str]) -> dict:
    """A loop's instruction count, its count a pipe, and its opcodes (most frequent first)."""
    pipes = collections.Counter(pipe_of(op) for op in ops)
    return {"instructions": len(ops), **{p: pipes.get(p, 0) for p in (*PIPES, "uniform", "other")},
            "opcodes": dict(collections.Counter(ops).most_common())}


_CHILD = """
import json, sys
from cute_kernels.compile import compile_kernel
from cute_kernels.linear_w4a16 import LinearW4A16Config
from nvfp4_gemv.linear.kernels import kernel_class
for i, fields in enumerate(json.loads(sys.argv[1])):
    cfg = LinearW4A16Config(**fields)
    cubin = compile_kernel(kernel_class(cfg)[0], cfg, "sm_90a").__cubin__
    open(f"{sys.argv[2]}/{i}.cubin", "wb").write(cubin)
"""


def compile_loops(configs: list) -> list[list[dict]]:
    """For each LinearW4A16Config: loop_counts of each K loop of its main kernel's sm_90a build (for a two-kernel
    config, x's first pass has no HMMA and so no K loop here)."""
    import dataclasses

    nvdisasm = _nvdisasm()
    if not nvdisasm:
        raise RuntimeError("nvdisasm not found: install the test extras (nvidia-cuda-nvdisasm)")
    with tempfile.TemporaryDirectory() as tmp:
        fields = [dataclasses.asdict(c) for c in configs]
        env = dict(os.environ, CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=tmp, CUTE_DSL_ARCH="sm_90a")
        out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(fields), tmp], capture_output=True, text=True,
                             env=env, timeout=1800)
        if out.returncode != 0:
            raise RuntimeError(f"compiling the linear's configs failed:\n{out.stderr[-3000:]}")
        result = []
        for i in range(len(configs)):
            sass = subprocess.run([nvdisasm, "-c", str(Path(tmp) / f"{i}.cubin")], capture_output=True, text=True,
                                  check=True).stdout
            result.append([loop_counts(ops) for ops in mma_loops(sass)])
    return result


def step_bytes(cfg) -> int:
    """Bytes of W and its scales one warp reads in one K step of `cfg`: its rows (16 a group; with K parts, 16 / P
    rows of P·128 K) times 128 K of codes (64 bytes) and their scales (NVFP4 8 bytes, MXFP4 4)."""
    scale = 8 if cfg.fmt == "nvfp4" else 4
    return 16 * cfg.groups * (64 + scale)


def needed_shares(instructions: int, alu: int, nbytes: int, read_tbs: float, sms: int, clock_ghz: float) -> tuple:
    """(issue share, ALU share) a loop of `instructions` (`alu` of them on the ALU pipe) a step of `nbytes` needs to
    keep up with a read of read_tbs TB/s on `sms` SMs at clock_ghz (the model in the module's docstring)."""
    steps_a_cycle = read_tbs * 1e12 / (sms * SCHEDULERS * clock_ghz * 1e9) / nbytes  # a scheduler's
    return steps_a_cycle * instructions, steps_a_cycle * alu * ALU_CYCLES


def loops_table(points, read_tbs: float, sms: int, clock_ghz: float, log=print) -> list[dict]:
    """One row a (N, K, M, format, x dtype) point: the dispatched config (plain scales, a global scale for NVFP4, no
    bias), its first K loop's counts (the loop a step of checkpoint scales runs: for MXFP4's fold, the fold's) and
    the shares it needs at the given read rate."""
    from nvfp4_gemv.linear import kernels
    from nvfp4_gemv.linear.bench import _label

    configs = [kernels.config_for(m, n, k, fmt, "plain", xd, False, fmt == "nvfp4", sms)
               for n, k, m, fmt, xd in points]
    rows = []
    for (n, k, m, fmt, xd), cfg, loops in zip(points, configs, compile_loops(configs)):
        first = loops[0]
        nbytes = step_bytes(cfg)
        issue, alu = needed_shares(first["instructions"], first["alu"], nbytes, read_tbs, sms, clock_ghz)
        fold = ("fold, redo" if cfg.mx_fold_redo else "fold") if cfg.mx_fold else ""
        row = {"n": n, "k": k, "m": m, "fmt": fmt, "x": xd, "config": _label(cfg), "mx_fold": fold,
               "loops": len(loops), **{key: first[key] for key in ("instructions", "alu", "fma", "tensor", "lsu")},
               "step_bytes": nbytes, "instructions_a_kb": round(first["instructions"] * 1024 / nbytes, 1),
               "issue_needed": round(issue, 3), "alu_needed": round(alu, 3)}
        rows.append(row)
        log(" ".join(f"{key}={val}" for key, val in row.items()))
    return rows
