"""Plain-text reporting shared by the `nvfp4-gemv` commands: progress lines, tables, the floor rows, geomeans and
the bench CSV."""

from __future__ import annotations

import csv
import math
import sys
import time
from pathlib import Path


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


def fmt_err(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.6g}"


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


def b200_sol(shape):
    from nvfp4_gemv.shapes import BENCH_SHAPES

    return {s.mkl: s.b200_sol_us for s in BENCH_SHAPES}.get(tuple(shape), float("nan"))


def geomean(values) -> float:
    """Geometric mean; NaN for no values."""
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


def write_csv(rows, path: Path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def bench_report(raw, bandwidth: float, geomean_variants) -> tuple[list, str]:
    """Bench rows (`nvfp4_gemv.bench.benchmark_shapes`) with bytes, TB/s and × floor added, and their text: the
    table and each named variant's contest-timing geomean against the floor's."""
    from nvfp4_gemv.shapes import bytes_moved

    rows = []
    for r in raw:
        nb = bytes_moved(r["m"], r["k"], r["l"])
        rows.append({**r, "bytes": nb, "tb_s": nb / (r["contest_us"] * 1e-6) / 1e12,
                     "x_floor": r["contest_us"] / r["floor_us"], "bandwidth_tb_s": bandwidth / 1e12,
                     "bandwidth_kind": "measured copy"})
    table = [((r["m"], r["k"], r["l"]), r["variant"], f"{r['contest_us']:.2f}", f"{r['graph_us']:.2f}",
              f"{r['tb_s']:.2f}", f"{r['x_floor']:.2f}", f"{r['floor_us']:.2f}",
              f"{b200_sol((r['m'], r['k'], r['l'])):.3f}") for r in rows]
    lines = [f"copy bandwidth (measured): {bandwidth / 1e12:.3f} TB/s",
             format_table(("shape (M,K,L)", "variant", "contest us", "graph us", "TB/s", "x floor", "floor us",
                           "B200 SOL us"), table)]
    geo_floor = geomean(r["floor_us"] for r in rows if r["variant"] == geomean_variants[0])
    for name in geomean_variants:
        geo = geomean(r["contest_us"] for r in rows if r["variant"] == name)
        if not math.isnan(geo):
            lines.append(f"{name} geomean (contest timing): {geo:.2f} us = {geo / geo_floor:.2f} x floor "
                         f"({geo_floor:.2f} us)")
    return rows, "\n".join(lines)


def read_ratio_report(rows, variant: str, read: str, describe=None) -> str:
    """Per shape: `variant`'s contest µs, the stream read's, their ratio (and `describe(m, k, l)`, e.g. what dispatch
    picked); then the geomean of the ratios."""
    by = {(r["m"], r["k"], r["l"], r["variant"]): r["contest_us"] for r in rows}
    shapes = list(dict.fromkeys((r["m"], r["k"], r["l"]) for r in rows))
    table, ratios = [], []
    for m, k, l in shapes:  # noqa: E741
        if (m, k, l, variant) not in by or (m, k, l, read) not in by:
            continue
        ratio = by[(m, k, l, variant)] / by[(m, k, l, read)]
        ratios.append(ratio)
        table.append(((m, k, l), f"{by[(m, k, l, variant)]:.2f}", f"{by[(m, k, l, read)]:.2f}", f"{ratio:.3f}",
                      describe(m, k, l) if describe else ""))
    head = ("shape (M,K,L)", f"{variant} us", "read us", "x read", "kernel and config" if describe else "")
    return "\n".join([format_table(head, table), f"geomean {variant} / read (contest timing): {geomean(ratios):.3f}"])
