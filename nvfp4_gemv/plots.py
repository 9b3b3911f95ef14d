"""The roofline picture of a benchmark run: time against bytes moved, on log axes, beside the memory floor.

A GEMV is memory-bound, so the roofline is the line t = bytes / bandwidth (the copy bandwidth measured in the same
run, or a stated nominal one); every variant's time for every shape is a point, and its height over the line is
its factor over the floor. Rows are the dicts `nvfp4_gemv.cli` writes to bench.csv: m, k, l, variant, bytes,
floor_us, contest_us, graph_us (NaN where not timed). Uses matplotlib's Agg backend; draws nothing on screen.
"""

from __future__ import annotations

import math
from pathlib import Path

TIMINGS = (("contest_us", "o", "contest timing"), ("graph_us", "^", "CUDA graph"))


def floor_line(rows, bandwidth: float, points: int = 2):
    """(bytes, µs) of the floor line t = bytes/bandwidth, spanning the rows' byte counts from /2 to x2."""
    lo = min(r["bytes"] for r in rows) / 2
    hi = max(r["bytes"] for r in rows) * 2
    xs = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]
    return xs, [x / bandwidth * 1e6 for x in xs]


def series(rows):
    """{(variant, timing label): [(bytes, µs), ...]} of the timed points, NaN times left out."""
    out = {}
    for r in rows:
        for key, _, label in TIMINGS:
            us = r.get(key, float("nan"))
            if us is None or not isinstance(us, (int, float)) or math.isnan(us):
                continue
            out.setdefault((r["variant"], label), []).append((r["bytes"], us))
    return out


def roofline_png(rows, bandwidth: float, path, bandwidth_label: str = "", title: str = "NVFP4 GEMV vs memory floor"):
    """Draw the floor line, the shapes' floor points and every timed point; save a PNG at `path` and return it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    path = Path(path)
    fig, ax = plt.subplots(figsize=(7.5, 5), dpi=120)
    try:
        xs, ys = floor_line(rows, bandwidth)
        label = f"floor: bytes / {bandwidth_label or f'{bandwidth / 1e12:.2f} TB/s'}"
        ax.plot([x / 1e6 for x in xs], ys, "k-", lw=1.2, label=label)
        shapes = {}
        for r in rows:
            shapes[(r["m"], r["k"], r["l"])] = r["bytes"]
        for (m, k, l), nb in shapes.items():  # noqa: E741
            ax.plot(nb / 1e6, nb / bandwidth * 1e6, "ks", ms=4)
            ax.annotate(f"{m}x{k}x{l}", (nb / 1e6, nb / bandwidth * 1e6), textcoords="offset points",
                        xytext=(6, -12), fontsize=7)
        # One colour per variant, one marker per timing.
        pts_by = series(rows)
        colour = {v: f"C{i % 10}" for i, v in enumerate(sorted({v for v, _ in pts_by}))}
        for (variant, timing), pts in sorted(pts_by.items()):
            marker = dict((lab, mk) for _, mk, lab in TIMINGS)[timing]
            ax.plot([b / 1e6 for b, _ in pts], [t for _, t in pts], marker, color=colour[variant], ls="none",
                    label=f"{variant} ({timing})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(plain)
        ax.set_xlabel("bytes moved per call (MB)")
        ax.set_ylabel("time per call (µs)")
        ax.set_title(title)
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        ax.legend(fontsize=7, loc="upper left")
        fig.tight_layout()
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)
    return path
