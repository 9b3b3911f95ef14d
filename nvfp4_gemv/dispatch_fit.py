"""Refit the GEMV's many-rows model (`nvfp4_gemv.dispatch`: WAVE_CONSTANTS, WAVE_WEIGHTS) to the committed sweeps.

    python -m nvfp4_gemv.dispatch_fit            # the fitted numbers, and how the model picks on the data
    python -m nvfp4_gemv.dispatch_fit --cv       # also five-fold cross-validation over the shapes
    python -m nvfp4_gemv.dispatch_fit --check    # also the committed model on the held-out sweep (WAVE_CHECK)

The data are contest-timed sweeps of the five many-rows configs (`nvfp4-gemv sweep ... --timing contest`, CSVs under
docs/, WAVE_SWEEPS). Per (shape, config) the median time and read over the files that measured it; shapes where the
rows are few (simt_config_for's other branch) or a config is missing are left out. The model is
`log(time / read) = constant[config] + weights · features`, fitted by least squares within each shape (every
shape's mean taken out of both sides), so only the differences between one shape's configs count: the shape's own
distance from the read is not the model's to explain. Needs numpy only.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from nvfp4_gemv import dispatch

DOCS = Path(__file__).resolve().parents[1] / "docs"
# Every committed contest-timed sweep of the many-rows configs (r_lanes = 2, one row a thread, no cluster).
WAVE_SWEEPS = (
    "sweep_h200_contest.csv", "sweep_h200_unroll1_contest.csv", "sweep_h200_unroll1_check_contest.csv",
    "sweep_h200_unroll1_suite_contest.csv", "sweep_h200_waves_misses_contest.csv", "sweep_h200_unseen_contest.csv",
    "sweep_h200_unseen_fit_contest.csv", "sweep_h200_unseen_heldout_contest.csv", "sweep_h200_short_k_contest.csv",
)
# Shapes measured after the fit, none in WAVE_SWEEPS: the model's check, not its data. 40 random many-rows shapes
# (numpy seed 20261203), then 16 random ones drawn (seed 77031203) where a variant of the model was in doubt: one that
# took a one-wave config whenever the model scored it within 0.03 of its pick (it lost there: 1.184 against 1.173).
WAVE_CHECK = ("sweep_h200_model_heldout_contest.csv", "sweep_h200_model_margin_contest.csv")
SMS = dispatch.H200_SMS
SF_KIND = "permuted"  # the contest's scales, which every sweep above used


def load(files=WAVE_SWEEPS, docs: Path = DOCS) -> dict:
    """{(M, K, L): {config: x_read}} from the sweeps: the median µs over the median read, per (shape, config)."""
    if not docs.is_dir():
        raise FileNotFoundError(f"{docs}: the committed sweeps are read from a checkout of the repository (docs/)")
    us, read = defaultdict(list), defaultdict(list)
    for name in files:
        with open(docs / name, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("schedule", "grid") not in ("grid", "dispatched grid"):
                    continue
                if float(row.get("max_registers") or 0) or row["rows_per_thread"] != "1" or row["k_splits"] != "1":
                    continue
                cfg = (int(row["warps"]), int(row["r_lanes"]), int(row["unroll"]))
                mkl = (int(row["m"]), int(row["k"]), int(row["l"]))
                if cfg in dispatch.WAVE_CONFIGS and dispatch.many_rows(mkl[0], mkl[2], SMS):
                    us[mkl, cfg].append(float(row["contest_us"]))
                    read[mkl, cfg].append(float(row["read_contest_us"]))
    data: dict = defaultdict(dict)
    for (mkl, cfg), times in us.items():
        data[mkl][cfg] = float(np.median(times) / np.median(read[mkl, cfg]))
    return {mkl: c for mkl, c in data.items() if len(c) == len(dispatch.WAVE_CONFIGS)}


def _rows(mkl) -> np.ndarray:
    """Design rows of one shape, a config each: the config indicators (all but the first) then the features."""
    m, k, l = mkl  # noqa: E741
    slabs = -(-m // 128) * l
    out = []
    for i, cfg in enumerate(dispatch.WAVE_CONFIGS):
        ind = [1.0 if i == j else 0.0 for j in range(1, len(dispatch.WAVE_CONFIGS))]
        out.append(ind + list(dispatch.wave_features(slabs, k, SMS, SF_KIND, cfg)))
    return np.array(out)


def fit(data: dict) -> tuple[dict, tuple[float, ...]]:
    """(WAVE_CONSTANTS, WAVE_WEIGHTS) fitted to `data` (from `load`)."""
    xs, ys = [], []
    for mkl, by_cfg in data.items():
        x = _rows(mkl)
        y = np.log([by_cfg[c] for c in dispatch.WAVE_CONFIGS])
        xs.append(x - x.mean(0))
        ys.append(y - y.mean())
    coef = np.linalg.lstsq(np.vstack(xs), np.concatenate(ys), rcond=None)[0]
    n_ind = len(dispatch.WAVE_CONFIGS) - 1
    constants = {cfg: (0.0 if i == 0 else round(float(coef[i - 1]), 4)) for i, cfg in enumerate(dispatch.WAVE_CONFIGS)}
    return constants, tuple(round(float(w), 4) for w in coef[n_ind:])


def pick(mkl, constants: dict, weights) -> tuple[int, int, int]:
    """The config the model with these numbers takes for (M, K, L) on the sweeps' GPU."""
    m, k, l = mkl  # noqa: E741
    slabs = -(-m // 128) * l
    return min(dispatch.WAVE_CONFIGS,
               key=lambda cfg: dispatch.wave_score(slabs, k, SMS, SF_KIND, cfg, constants, weights))


def geomean(values) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def picked(data: dict, choose) -> float:
    """Geomean x the read of the configs `choose(mkl)` takes, over the shapes of `data`."""
    return geomean([data[mkl][choose(mkl)] for mkl in data])


def cross_validate(data: dict, folds: int = 5, seeds: int = 5) -> float:
    """Geomean x the read of the configs picked by models fitted without the picked shape's fold (mean over seeds)."""
    shapes = sorted(data)
    out = []
    for seed in range(seeds):
        order = list(shapes)
        np.random.default_rng(seed).shuffle(order)
        chosen = []
        for f in range(folds):
            test = set(order[f::folds])
            constants, weights = fit({s: data[s] for s in shapes if s not in test})
            chosen += [data[s][pick(s, constants, weights)] for s in sorted(test)]
        out.append(geomean(chosen))
    return float(np.mean(out))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cv", action="store_true", help="five-fold cross-validation over the shapes (5 shuffles)")
    parser.add_argument("--check", action="store_true", help="the committed model on the held-out sweep")
    args = parser.parse_args(argv)
    data = load()
    constants, weights = fit(data)
    print(f"{len(data)} shapes from {len(WAVE_SWEEPS)} sweeps")
    print(f"WAVE_CONSTANTS = {constants}")
    print(f"WAVE_WEIGHTS = {weights}  # {', '.join(dispatch.WAVE_FEATURES)}")
    print(f"geomean x read: fitted model {picked(data, lambda s: pick(s, constants, weights)):.4f}, "
          f"dispatch as committed {picked(data, lambda s: pick(s, dispatch.WAVE_CONSTANTS, dispatch.WAVE_WEIGHTS)):.4f}, "
          f"best config of each shape {geomean([min(c.values()) for c in data.values()]):.4f}")
    if args.cv:
        print(f"five-fold cross-validation: {cross_validate(data):.4f}")
    if args.check:
        check = load(WAVE_CHECK)
        print(f"held out ({len(check)} shapes): committed model "
              f"{picked(check, lambda s: pick(s, dispatch.WAVE_CONSTANTS, dispatch.WAVE_WEIGHTS)):.4f}, "
              f"best config of each shape {geomean([min(c.values()) for c in check.values()]):.4f}")


if __name__ == "__main__":
    main()
