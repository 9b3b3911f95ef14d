"""Benchmark of the W4A16 linear on a CUDA GPU: device time per call against a plain read of the same weight and scale
bytes, quack's `gemm_w4a16` and cuBLAS bf16 (`F.linear` on a dequantized copy, 4x the bytes), in one run.

Every variant is timed by `nvfp4_gemv.bench.graph_time_us`: one CUDA graph of at least 20 calls cycling over weight
copies that total more than 256 MB, so no call finds its weights in the 50 MB L2 and the graph launch is spread over
many calls. The read is `cute_kernels.stream_read` of the weight + scale bytes, timed the same way in the same run.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import math

import torch

from nvfp4_gemv import bench as B
from nvfp4_gemv.dispatch import ctas_per_sm

# N x K of decode-time projections: the six the issue measured, then dense and MoE-expert projections of public
# models (Llama-3 8B/70B, Mixtral, gpt-oss, Qwen3-30B-A3B), K from 768 to 28672.
SHAPES = (
    (6144, 4096), (28672, 4096), (4096, 14336), (8192, 28672), (5760, 2880), (4096, 7168),
    (4096, 4096), (2880, 2880), (1536, 2048), (2048, 768), (14336, 4096), (10240, 8192),
)  # fmt: skip
TOKENS = (1, 2, 4, 8, 16)
FORMATS = ("nvfp4", "mxfp4")
POOL_BYTES = 256 << 20


def weight_bytes(n: int, k: int, fmt: str) -> int:
    """Bytes the linear must read: fp4 codes plus one scale byte per block (16 or 32 elements)."""
    return n * k // 2 + n * k // (16 if fmt == "nvfp4" else 32)


# The e8m0 bytes (least, most) MXFP4 scales are drawn from: 2^-9 to 2^3, finite outputs for the cuBLAS dequant.
MXFP4_SCALES = (118, 130)
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # x dtype names, as the launcher's rules take them
MXFP4_ZERO_BLOCKS = 0.0  # the share of MXFP4 blocks random_weights makes all-zero, with scale 2^-127 (e8m0 byte 0)


def random_weights(n: int, k: int, fmt: str, device="cuda"):
    """Codes over the full e2m1 range with moderate scales (finite outputs for the cuBLAS dequant)."""
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device)
    if fmt == "nvfp4":
        sf = torch.randint(0x28, 0x41, (n, k // 16), dtype=torch.uint8, device=device).view(torch.float8_e4m3fn)
    else:
        sf = torch.randint(MXFP4_SCALES[0], MXFP4_SCALES[1] + 1, (n, k // 32), dtype=torch.uint8, device=device)
        if MXFP4_ZERO_BLOCKS:
            zero = torch.rand(n, k // 32, device=device) < MXFP4_ZERO_BLOCKS
            sf[zero] = 0
            w.view(n, k // 32, 16)[zero] = 0
    return w, sf


def drawn_shapes(count: int, seed: int, lo=(1024, 1024), hi=(32768, 28672)) -> list[tuple[int, int]]:
    """`count` (N, K) drawn log-uniform between `lo` and `hi` by Python's `random` seeded `seed`, N a multiple of 8
    and K of 64: decode shapes that no file names, for checking a rule on points it was not fitted to."""
    import random

    rng = random.Random(seed)

    def draw(a, b, step):
        return max(step, round(math.exp(rng.uniform(math.log(a), math.log(b))) / step) * step)

    return [(draw(lo[0], hi[0], 8), draw(lo[1], hi[1], 64)) for _ in range(count)]


def _pool(make, nbytes: int):
    return [make() for _ in range(max(2, -(-POOL_BYTES // nbytes)))]


def ours(n, k, m, fmt, dtype=torch.bfloat16, **override):
    """The op as users call it; with `override` (kernel config fields, for sweeps) the launcher underneath."""
    from nvfp4_gemv.linear import fp4_linear, kernels

    x = torch.randn(m, k, device="cuda").to(dtype)
    pool = _pool(lambda: random_weights(n, k, fmt), weight_bytes(n, k, fmt))
    gs = 0.5 if fmt == "nvfp4" else None
    if not override:
        return (lambda d: fp4_linear(x, d[0], d[1], fmt, gs)), pool
    y = torch.empty(m, n, device="cuda", dtype=dtype)
    gst = torch.full((1,), 0.5, device="cuda") if gs else None
    return (lambda d: kernels.run(y, x, d[0], d[1].view(torch.uint8), fmt, "plain", gst, None, **override)), pool


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)


def sweep_configs(token_tiles: int = 1) -> list[dict]:
    """The dispatched config ({}), then every (groups, k_warps, register cap) the launcher chooses from."""
    from nvfp4_gemv.linear import kernels

    return [{}] + [dict(groups=g, k_warps=q, max_registers=c) for g, q, c in kernels.candidates(token_tiles)]


def sweep(configs=None, shapes=SHAPES, tokens=TOKENS, formats=("nvfp4",), csv_path=None, log=print,
          dtype=torch.bfloat16):
    """µs per call of each config override (a dict of kernel config fields; {} is the dispatched config) at every
    (shape, M, format), with the read of the same bytes: the data behind the launcher's choice. configs None: at
    each M, `sweep_configs` of the token tiles that M takes. dtype: x's (bf16 or fp16)."""
    from nvfp4_gemv.linear import kernels

    rows = []
    for n, k in shapes:
        for fmt in formats:
            read = _time(lambda: B.stream_read_variant(weight_bytes(n, k, fmt)))
            for m in tokens:
                tiles = kernels.token_tiles_for(m, n, k)
                for ov in configs if configs is not None else sweep_configs(tiles):
                    t = _time(lambda: ours(n, k, m, fmt, dtype, **ov))
                    name = " ".join(f"{a}={b}" for a, b in ov.items()) or "dispatched"
                    rows.append(dict(n=n, k=k, m=m, fmt=fmt, config=name, read_us=read, us=t, ratio=t / read))
                    log(f"{n:>6}x{k:<6} {m:>3} {fmt:>5} {read:7.2f} {t:7.2f} {t / read:6.3f}  {name}")
    if csv_path:
        write_csv(rows, csv_path)
    return rows


def x_fragments_ab(shapes=SHAPES, tokens=(1, 2, 3, 4, 8, 12, 16), formats=FORMATS, rounds=2, csv_path=None, log=print,
                   more=None):
    """µs per call at every (shape, M, format) of the launcher's split with x in fragment order forced on and off
    (and block columns where their rule takes them), alternately `rounds` times, the best of each; with the read of
    the same bytes: the data behind `kernels.X_FRAGMENTS_MIN_CODE_BYTES`. A shape may carry x's dtype third. `more`:
    {name: config fields} of further variants, timed in the same rounds (e.g. {"parts2": dict(k_parts=2,
    x_fragments=True)}: two K parts a row with x in fragment order, which the rules give from 3 tokens, at 1-2)."""
    from nvfp4_gemv.linear import kernels

    rows = []
    for shape in shapes:
        n, k = shape[:2]
        dtype = shape[2] if len(shape) > 2 else torch.bfloat16
        for fmt in formats:
            read = _time(lambda: B.stream_read_variant(weight_bytes(n, k, fmt)))
            for m in tokens:
                variants = {"default": dict(x_fragments=False), "fragments": dict(x_fragments=True)}
                if kernels.block_columns_for(m, n, k, fmt, kernels.H200_SMS, kernels._X_DTYPES[dtype]):
                    variants["columns"] = dict(block_columns=True)
                variants.update(more or {})
                times = _best_of(n, k, m, fmt, dtype, variants, rounds)
                row = dict(n=n, k=k, m=m, fmt=fmt, x=kernels._X_DTYPES[dtype], read_us=round(read, 3),
                           default_us=round(times["default"], 3), fragments_us=round(times["fragments"], 3),
                           columns_us=round(times.get("columns", math.nan), 3),
                           fragments_over_default=round(times["fragments"] / times["default"], 4),
                           **{f"{name}_us": round(times[name], 3) for name in more or {}})
                _logged(rows, log, row)
    if csv_path:
        write_csv(rows, csv_path)
    return rows


def _logged(rows: list, log, row: dict) -> None:
    """Append an A/B row to `rows` and log it as key=value pairs."""
    rows.append(row)
    log(" ".join(f"{key}={val}" for key, val in row.items()))


def _best_of(n, k, m, fmt, dtype, variants: dict, rounds: int) -> dict:
    """{name: µs} of `ours` with each variant's override, timed alternately `rounds` times, the best of each."""
    times = dict.fromkeys(variants, math.inf)
    for _ in range(rounds):
        for name, ov in variants.items():
            times[name] = min(times[name], _time(lambda: ours(n, k, m, fmt, dtype, **ov)))
    return times


def _ab_fields(cfg) -> dict:
    """A config's split as an override of every field the launcher chooses (so config_for keeps it as it is)."""
    return {f: getattr(cfg, f) for f in ("groups", "k_warps", "max_registers", "k_splits", "k_parts", "token_tiles",
                                         "x_fragments", "block_columns", "acc_sets", "m_major", "mx_fold",
                                         "mx_fold_redo", "w_l2_prefetch", "shifts_on_fma", "pdl")}


def _general_of(cfg) -> dict:
    """The override that times a config with the scale fold on MXFP4's general path instead: the same split, without
    the fold's register cap (kernels.mx_fold_cap) where the fold took one."""
    from nvfp4_gemv.linear import kernels

    cap = kernels.mx_fold_cap(cfg.groups, cfg.k_warps, cfg.token_tiles)
    return dict(_ab_fields(cfg), mx_fold=False, mx_fold_redo=False, max_registers=0 if cap else cfg.max_registers)


def mx_fold_ab(shapes=SHAPES, tokens=TOKENS, scales=((112, 128), (0, 255)), rounds=2, csv_path=None, log=print,
               x_dtype="fp16"):
    """µs per call of MXFP4 with x_dtype x at every (shape, M, scale range): the dispatched config (the scale fold,
    its registers capped by `kernels.mx_fold_cap`) against the same split on the general path (`_general_of`),
    alternately `rounds` times, the best of each; with the read of the same bytes: the data behind
    `kernels.MX_FOLD_X_DTYPES`, `MX_FOLD_MIN_CODE_BYTES` and `MX_FOLD_MIN_CAP`, which the run sets so that the
    fold is taken at every point where it keeps the general path's split (with bf16 x, `config_for`). `scales`:
    (least, most) e8m0 bytes, drawn uniformly; the default pair is what checkpoints hold (2^-15 to 2^1) and the whole
    range (every warp leaves the fold: with bf16 x it does its K again on the general
    path, kernels.mx_fold_redo_for)."""
    with _kernels_patched(MX_FOLD_X_DTYPES=("fp16", "bf16"), MX_FOLD_MIN_CODE_BYTES={"fp16": 0, "bf16": 0},
                          MX_FOLD_MIN_CAP=0):
        return _mx_fold_ab(shapes, tokens, scales, rounds, csv_path, log, x_dtype)


@contextlib.contextmanager
def _drawn_with(**attrs):
    """Within: this module's weight-drawing settings (MXFP4_SCALES, MXFP4_ZERO_BLOCKS; random_weights reads them)
    set to `attrs`."""
    kept = {name: globals()[name] for name in attrs}
    globals().update(attrs)
    try:
        yield
    finally:
        globals().update(kept)


def _mx_fold_ab(shapes, tokens, scales, rounds, csv_path, log, x_dtype):
    dtype = TORCH_DTYPES[x_dtype]
    rows = []
    for n, k, m, cfg, read in _fold_points(shapes, tokens, x_dtype):
        for drawn in scales:
            with _drawn_with(MXFP4_SCALES=drawn):
                times = _best_of(n, k, m, "mxfp4", dtype, {"general": _general_of(cfg), "fold": _ab_fields(cfg)},
                                 rounds)
            _logged(rows, log, dict(n=n, k=k, m=m, x=x_dtype, scales=f"{drawn[0]}-{drawn[1]}",
                                    read_us=round(read, 3), general_us=round(times["general"], 3),
                                    fold_us=round(times["fold"], 3),
                                    fold_over_general=round(times["fold"] / times["general"], 4),
                                    config=_mx_config(m, n, k, dtype)))
    if csv_path:
        write_csv(rows, csv_path)
    return rows


def _mx_config(m: int, n: int, k: int, dtype) -> str:
    """The dispatched MXFP4 config of (M, N, K) with x in `dtype`, as an A/B row names it (describe's words past the
    MMA)."""
    from nvfp4_gemv.linear import kernels

    return kernels.describe(m, n, k, "mxfp4", dtype).split("MMA, ")[-1]


def _fold_points(shapes, tokens, x_dtype: str):
    """(n, k, m, config, read µs) at every point of shapes x tokens where the launcher takes MXFP4's scale fold with
    x_dtype x (not block columns), the read of the weight's bytes timed once a shape."""
    from nvfp4_gemv.linear import kernels

    for n, k in shapes:
        read = None
        for m in tokens:
            cfg = kernels.config_for(m, n, k, "mxfp4", "plain", x_dtype, False, False)
            if not cfg.mx_fold:
                continue
            read = read or _time(lambda: B.stream_read_variant(weight_bytes(n, k, "mxfp4")))
            yield n, k, m, cfg, read


def mx_fold_designs_ab(shapes=SHAPES, tokens=(1, 4, 16), rounds=2, csv_path=None, log=print):
    """µs per call of MXFP4 with checkpoint scales (MXFP4_SCALES) at every (x dtype, shape, M) where the launcher
    takes the scale fold: the general path, the fold with a vote a step, and the fold over the whole K with a redo
    (mx_fold_redo), each at the dispatched split and cap, alternately `rounds` times, the best of each; with the read
    of the same bytes: the data behind `kernels.mx_fold_redo_for`."""
    rows = []
    for x_dtype, dtype in TORCH_DTYPES.items():
        for n, k, m, cfg, read in _fold_points(shapes, tokens, x_dtype):
            fold = _ab_fields(cfg)
            variants = {"general": _general_of(cfg), "vote": dict(fold, mx_fold_redo=False),
                        "redo": dict(fold, mx_fold_redo=True)}
            times = _best_of(n, k, m, "mxfp4", dtype, variants, rounds)
            _logged(rows, log, dict(n=n, k=k, m=m, x=x_dtype, read_us=round(read, 3),
                                    **{f"{name}_us": round(t, 3) for name, t in times.items()},
                                    redo_over_vote=round(times["redo"] / times["vote"], 4),
                                    redo_over_general=round(times["redo"] / times["general"], 4),
                                    config=_mx_config(m, n, k, dtype)))
    if csv_path:
        write_csv(rows, csv_path)
    return rows


def zero_blocks_ab(shapes=SHAPES, tokens=(1, 4, 16), shares=(0.0, 0.001, 0.01), rounds=2, csv_path=None,
                   log=print, x_dtype="bf16"):
    """µs per call of MXFP4 with x_dtype x where the launcher takes the scale fold (bf16: over the whole K with a
    redo, mx_fold_redo; fp16: a vote a step), with a share of all-zero blocks of scale 2^-127 (MXFP4_ZERO_BLOCKS; the
    rest checkpoint-like, MXFP4_SCALES): the dispatched config ("checked": bf16, a pass over the scales and the
    codes below the fold's range before a redo; fp16, such codes checked where a step's vote fails;
    mx_fold_zero_blocks), the same without it ("redo" or "vote": a zero block sends the warp's K, or the rest of it,
    to the general path) and the general path, alternately `rounds` times, the best of each; with the read of the
    same bytes."""
    dtype = TORCH_DTYPES[x_dtype]
    plain = "redo" if x_dtype == "bf16" else "vote"
    rows = []
    for n, k, m, cfg, read in _fold_points(shapes, tokens, x_dtype):
        variants = {"general": _general_of(cfg), plain: dict(_ab_fields(cfg), mx_fold_zero_blocks=False),
                    "checked": _ab_fields(cfg)}
        for share in shares:
            with _drawn_with(MXFP4_ZERO_BLOCKS=share):
                times = _best_of(n, k, m, "mxfp4", dtype, variants, rounds)
            _logged(rows, log, dict(n=n, k=k, m=m, x=x_dtype, zero_blocks=share, read_us=round(read, 3),
                                    **{f"{name}_us": round(t, 3) for name, t in times.items()},
                                    **{f"checked_over_{plain}": round(times["checked"] / times[plain], 4)},
                                    checked_over_general=round(times["checked"] / times["general"], 4),
                                    config=_mx_config(m, n, k, dtype)))
    if csv_path:
        write_csv(rows, csv_path)
    return rows


# (N, K, M) of MXFP4 with fp16 x where the fold's one-group, one-tile split takes two K parts or x in fragment order
# (the splits whose registers mx_fold_cap now caps at one group of one tile too), and a few where it caps nothing new.
MX_FOLD_CAP_POINTS = (
    (4096, 14336, 3), (4096, 14336, 4), (8192, 28672, 3), (8192, 28672, 4), (4096, 7168, 4), (4096, 4096, 3),
    (4096, 4096, 4), (5760, 2880, 4), (2048, 768, 1), (6144, 4096, 5), (6144, 4096, 8), (8192, 28672, 6),
    (8192, 28672, 8), (14336, 4096, 6), (14336, 4096, 8), (3584, 18048, 3), (512, 25344, 12), (4096, 7168, 1),
    (28672, 4096, 4), (4096, 7168, 8),
)


@contextlib.contextmanager
def _kernels_patched(**attrs):
    """Within: the launcher's rules with `attrs` (names in nvfp4_gemv.linear.kernels) replaced, as they were before
    a change, for an A/B in one process; config_for runs at each call of `ours` with an override, so the timing
    must run inside too."""
    from nvfp4_gemv.linear import kernels

    kept = {name: getattr(kernels, name) for name in attrs}
    for name, value in attrs.items():
        setattr(kernels, name, value)
    try:
        yield
    finally:
        for name, value in kept.items():
            setattr(kernels, name, value)


def mx_fold_cap_ab(points=MX_FOLD_CAP_POINTS, rounds=2, csv_path=None, log=print):
    """µs per call of MXFP4 with fp16 x at each (N, K, M): the dispatched config (the scale fold, registers capped by
    `kernels.mx_fold_cap`) and the same uncapped, alternately `rounds` times, the best of each; with the read of the
    same bytes: the data behind mx_fold_cap's cap at one group of one tile."""
    from nvfp4_gemv.linear import kernels

    rows = []
    for n, k, m in points:
        read = _time(lambda: B.stream_read_variant(weight_bytes(n, k, "mxfp4")))
        capped = _ab_fields(kernels.config_for(m, n, k, "mxfp4", "plain", "fp16", False, False))
        times = {"capped": math.inf, "uncapped": math.inf}
        for _ in range(rounds):
            for name in times:
                # max_registers 0 with the fold means mx_fold_cap's cap (config_for): uncapped, the cap is off
                with _kernels_patched(**({"mx_fold_cap": lambda *args: 0} if name == "uncapped" else {})):
                    ov = dict(capped, max_registers=0) if name == "uncapped" else capped
                    times[name] = min(times[name], _time(lambda: ours(n, k, m, "mxfp4", torch.float16, **ov)))
        row = dict(n=n, k=k, m=m, read_us=round(read, 3), **{f"{a}_us": round(b, 3) for a, b in times.items()},
                   capped_over_uncapped=round(times["capped"] / times["uncapped"], 4),
                   config=_mx_config(m, n, k, torch.float16))
        _logged(rows, log, row)
    if csv_path:
        write_csv(rows, csv_path)
    return rows


def fragments_fp16_ab(shapes=SHAPES, tokens=(9, 12, 16), rounds=2, csv_path=None, log=print):
    """µs per call of NVFP4 with fp16 x (and a global scale) at 9-16 tokens where the launcher takes x in fragment
    order: the dispatched config (FRAGMENT_REGISTERS' fp16 entry and its cap, FRAGMENT_CAPS) against the config the
    rules gave without them (fp16 counted at REGISTERS, uncapped), alternately `rounds` times, the best of each; with
    the read of the same bytes. Points where the two configs are the same are skipped."""
    from nvfp4_gemv.linear import kernels

    table = {key: regs for key, regs in kernels.FRAGMENT_REGISTERS.items() if key[2] != "fp16"}
    return rules_ab(dict(FRAGMENT_REGISTERS=table, FRAGMENT_CAPS=()), False, shapes, tokens, ("nvfp4",),
                    (torch.float16,), rounds, csv_path, log)


def _before_now(n, k, m, fmt, dtype, before, now, rounds, rules=None) -> dict:
    """µs per call of one point's config under the rules before a change and now, alternately `rounds` times, the
    best of each, as row fields. `rules`: {"before" or "now": names in nvfp4_gemv.linear.kernels patched while that
    config runs} (config_for completes an override by the rules in force: a register cap where it names none)."""
    times = {"before": math.inf, "now": math.inf}
    for _ in range(rounds):
        for name, cfg in (("before", before), ("now", now)):
            with _kernels_patched(**(rules or {}).get(name, {})):
                ov = _ab_fields(cfg)
                times[name] = min(times[name], _time(lambda: ours(n, k, m, fmt, dtype, **ov)))
    return dict(before_us=round(times["before"], 3), now_us=round(times["now"], 3),
                now_over_before=round(times["now"] / times["before"], 4),
                before=_label(before), now=_label(now))


def _label(cfg) -> str:
    """A config's split in a few fields: groups, k-warps, cluster, register cap, token tiles (and x in fragment
    order)."""
    return (f"g{cfg.groups} kw{cfg.k_warps} ks{cfg.k_splits} r{cfg.max_registers} t{cfg.token_tiles}"
            + (" xf" if cfg.x_fragments else ""))


def _rule_ab(shapes, tokens, formats, dtypes, rounds, pair, csv_path, log, rules=None):
    """µs per call at every (shape, M, format, x dtype) where `pair(m, n, k, fmt, x_dtype, dispatched)` gives two
    configs (before, now) to time (None: the point is skipped), alternately `rounds` times, the best of each, each
    under its `rules` (_before_now); with the read of the same bytes."""
    from nvfp4_gemv.linear import kernels

    rows = []
    for n, k in shapes:
        for fmt in formats:
            read = None
            for dtype in dtypes:
                xd = kernels._X_DTYPES[dtype]
                for m in tokens:
                    dispatched = kernels.config_for(m, n, k, fmt, "plain", xd, False, fmt == "nvfp4")
                    configs = pair(m, n, k, fmt, xd, dispatched)
                    if configs is None or configs[0] == configs[1]:
                        continue
                    if read is None:
                        read = _time(lambda: B.stream_read_variant(weight_bytes(n, k, fmt)))
                    row = dict(n=n, k=k, m=m, fmt=fmt, x=xd, read_us=round(read, 3),
                               **_before_now(n, k, m, fmt, dtype, *configs, rounds, rules))
                    row["now_over_read"] = round(row["now_us"] / read, 4)
                    _logged(rows, log, row)
    if csv_path:
        write_csv(rows, csv_path)
    return rows


def rules_ab(patch: dict, proposed: bool = True, shapes=SHAPES, tokens=(9, 12, 16), formats=FORMATS,
             dtypes=(torch.bfloat16,), rounds=2, csv_path=None, log=print):
    """µs per call at every (shape, M, format, x dtype) where the launcher's rules with `patch` (names in
    nvfp4_gemv.linear.kernels replaced, as `_kernels_patched` does) give another config than the dispatched one:
    the two alternately `rounds` times, the best of each; with the read of the same bytes. `proposed`: the patched
    rules are the change to try ("now"); else the rules as they were before a change ("before")."""
    from nvfp4_gemv.linear import kernels

    def pair(m, n, k, fmt, xd, dispatched):
        with _kernels_patched(**patch):
            other = kernels.config_for(m, n, k, fmt, "plain", xd, False, fmt == "nvfp4")
        return (dispatched, other) if proposed else (other, dispatched)

    return _rule_ab(shapes, tokens, formats, dtypes, rounds, pair, csv_path, log,
                    {"now" if proposed else "before": patch})


def k_warps_ab(shapes=SHAPES, tokens=(1, 4, 8, 12, 16), formats=FORMATS, dtypes=(torch.bfloat16,), rounds=2,
               csv_path=None, log=print):
    """µs per call at every (shape, M, format, x dtype) where `kernels.widen_k_warps` changes the launcher's split:
    the dispatched config against the one the rules give with k-warps in powers of two (WIDEN_K_WARPS False),
    alternately `rounds` times, the best of each; with the read of the same bytes. Points where the two configs are
    the same are skipped."""
    return rules_ab(dict(WIDEN_K_WARPS=False), False, shapes, tokens, formats, dtypes, rounds, csv_path, log)


def fragments_capped(groups: int, registers: int, x_dtypes=("bf16",)) -> dict:
    """A `rules_ab` patch: 16-token CTAs of `groups` row groups with x in fragment order (x of `x_dtypes`, not the scale
    fold) counted at, and capped to, `registers` a thread wherever the cap leaves 2 or more CTAs an SM. sm_90a
    (nvdisasm, the K loop's instructions a 128-K step; 2026-12-05):
    - one group at 64 (uncapped: 76 with NVFP4 and bf16 x, 66 with MXFP4; FRAGMENT_REGISTERS counts 72): 208 against
      203 with NVFP4 and bf16 x at 4, 8 and 16 k-warps (211 with the 128x4 scale layout and a bias), 189 against 179
      with fp16 x, 237-240 against 236 with MXFP4; no spill in the loop, 10-20 spill loads and stores outside it. 16
      k-warps then hold 2 CTAs an SM (32 warps) instead of 1, 8 hold 4 instead of 3; and on a tie in warps the
      rules' one group now holds as many as two groups, so 8192 x 28672 at 16 tokens goes from two groups of 8
      k-warps (15.5 warps an SM) to one (31).
    - two groups at 96 (uncapped: 128): with NVFP4, bf16 x and plain scales, 405 against 382 at 5, 6, 9 and 10
      k-warps and nothing spilled, but 4 k-warps take 43 spill loads and stores in the loop, the 128x4 scale layout
      with a bias 18 (5 k-warps), fp16 x 27 (396 against 337); MXFP4 466 against 442, its 34 outside the loop. At 3
      and 7 k-warps the cap's CTAs (7 and 3: 21 warps) put 6 warps on one of the SM's four register-file partitions,
      so ptxas gets 16384 / (6 x 32) -> 80 registers, not 96, and spills (57 in the loop) (the resident-warp model,
      `dispatch.ctas_per_sm`, counts the whole register file and does not see this). So a rule from it would need
      those classes and k-warp counts apart."""
    from nvfp4_gemv.linear import kernels

    keys = [(groups, 2, d) for d in x_dtypes]
    return dict(FRAGMENT_REGISTERS={**kernels.FRAGMENT_REGISTERS, **{key: registers for key in keys}},
                FRAGMENT_CAPS=tuple(dict.fromkeys(kernels.FRAGMENT_CAPS + tuple(keys))))


# The launcher's rules before each rule the A/B runs of 2026-12-05 adopted, as `rules_ab` patches (names in
# nvfp4_gemv.linear.kernels): one group at 16 tokens, 32-token CTAs, the register file's partitions.
RULES_BEFORE = {"one_group": dict(ONE_GROUP_FRAGMENTS=()), "token_tiles": dict(TOKEN_TILES_4_X_DTYPES=()),
                "register_partitions": dict(resident_ctas=ctas_per_sm),
                "one_group_fold": dict(ONE_GROUP_FRAGMENTS=("bf16",)),
                "mx_fold_min_cap": dict(MX_FOLD_MIN_CAP_FRAGMENTS=56),
                "mx_fold_uncapped": dict(UNCAPPED_FRAGMENTS=())}


def _before_ab(rule: str, tokens, formats, dtypes):
    """An `ab` run of one adopted rule: `rules_ab` with the rules before it (RULES_BEFORE[rule]) against the dispatched
    ones, on the bench shapes and 40 drawn ones (seed 1205)."""
    return lambda **kw: rules_ab(RULES_BEFORE[rule], False, SHAPES + tuple(drawn_shapes(40, 1205)), tokens, formats,
                                 dtypes, **kw)


def one_group_ab(shapes=SHAPES, tokens=(12, 16), formats=FORMATS, dtypes=(torch.bfloat16,), rounds=2, csv_path=None,
                 log=print):
    """µs per call at every (shape, M, format, x dtype) where `kernels.ONE_GROUP_FRAGMENTS` changes the launcher's
    split: the two-group split of 16-token CTAs the rules gave before it (before) against the dispatched one-group
    split (now), alternately `rounds` times, the best of each; with the read of the same bytes."""
    return rules_ab(RULES_BEFORE["one_group"], False, shapes, tokens, formats, dtypes, rounds, csv_path, log)


def token_tiles_ab(shapes=None, tokens=(17, 24, 32, 48, 64, 96, 127), formats=FORMATS, dtypes=(torch.bfloat16,),
                   rounds=2, csv_path=None, log=print):
    """µs per call at every (shape, M, format, x dtype) where `kernels.TOKEN_TILES_4_X_DTYPES` changes the launcher's
    config: the 16-token CTAs the rules gave before it (before) against the dispatched 32-token ones (now),
    alternately `rounds` times, the best of each; with the read of the same bytes (shapes: MANY_TOKENS_SHAPES by
    default)."""
    shapes = MANY_TOKENS_SHAPES if shapes is None else shapes
    return rules_ab(RULES_BEFORE["token_tiles"], False, shapes, tokens, formats, dtypes, rounds, csv_path, log)


# (M, N, K, format, global scale) whose dispatched config with fp16 x is one the register caps of 2026-12-04 touch:
# the fold with two K parts (8 and 16 warps a CTA), the fold with x in fragment order, NVFP4's 16-token fragment
# CTAs capped at 72 (with and without a global scale), and the fold in a cluster (uncapped).
CAPPED_CASES = ((4, 1024, 4096, "mxfp4", False), (4, 3072, 4096, "mxfp4", False), (6, 2048, 8192, "mxfp4", False),
                (12, 3072, 4096, "nvfp4", True), (16, 3072, 6144, "nvfp4", False), (3, 512, 6144, "mxfp4", False))
# ... and whose split widen_k_warps widens (k-warps not a power of two, capped at the model's registers): 14 k-warps of
# 16 tokens with x in fragment order, 3 (the scale fold with fp16 x), 12, 9 of two K parts, 14 of MXFP4, and 9 of one
# part (1216 x 1088 at 16 tokens, from two groups of two parts).
WIDENED_CASES = ((16, 2368, 6912, "nvfp4", True), (16, 9152, 768, "mxfp4", False), (8, 2880, 2880, "mxfp4", False),
                 (1, 2368, 6912, "nvfp4", True), (12, 2880, 5376, "mxfp4", False), (16, 1216, 1088, "nvfp4", True))


def dispatched_against_reference(cases=CAPPED_CASES, dtype=torch.float16, log=print) -> float:
    """Run each case through `fp4_linear` as dispatched (random codes, the bench's scales) and return the largest
    relative error against the fp32 reference on the CPU; small enough to run under compute-sanitizer."""
    from nvfp4_gemv.linear import fp4_linear, kernels
    from nvfp4_gemv.linear.reference import linear_reference

    worst = 0.0
    for m, n, k, fmt, gs in cases:
        w, sf = random_weights(n, k, fmt)
        x = torch.randn(m, k, device="cuda").to(dtype)
        g = 0.5 if gs else None
        y = fp4_linear(x, w, sf, fmt, g).cpu().float()
        ref = linear_reference(x.cpu(), w.cpu(), sf.cpu(), fmt, g, None, "plain").float()
        err = ((y - ref).norm() / ref.norm()).item()
        worst = max(worst, err)
        log(f"{m} x {n} x {k} {fmt}: {kernels.describe(m, n, k, fmt, dtype).split('MMA, ')[-1]}: rel err {err:.2e}")
    return worst


# Four and eight K parts a row (LinearW4A16Config.k_parts): at 8 parts a warp's W load is 512 contiguous bytes of one
# row and its scale load 64, and x's registers serve 2 rows a group, so more groups reuse them without the thin grids
# of 4 groups of 16 rows. Per token count, the splits timed against the dispatched config: (k_parts, token_tiles,
# groups, row_warps, k_warps, x in fragment order). Measured on an H100 without the fragment-order rows
# (docs/linear_h100_k_parts_many.csv; BENCHMARKS.md, "An H100 session"): at 8 parts each lane's x chunks lie 64 bytes
# apart, 16 lines a load instruction; in fragment order 8 (the 8 parts' steps), which the added rows time.
K_PARTS_MANY = {1: [(8, 1, 1, 1, 4, False), (8, 1, 2, 1, 1, False), (8, 1, 2, 1, 2, False), (8, 1, 2, 1, 4, False),
                    (8, 1, 2, 2, 2, False), (8, 1, 4, 1, 1, False), (8, 1, 4, 1, 2, False), (4, 1, 2, 1, 4, False),
                    (8, 1, 1, 1, 4, True), (8, 1, 2, 1, 1, True), (8, 1, 2, 1, 2, True), (8, 1, 4, 1, 2, True)],
                2: [(8, 2, 2, 1, 2, False), (8, 2, 2, 1, 4, False), (8, 2, 4, 1, 1, False), (4, 1, 2, 1, 4, False),
                    (4, 1, 2, 2, 2, False), (8, 2, 2, 1, 2, True), (4, 1, 2, 1, 4, True)],
                4: [(4, 2, 2, 1, 2, False), (4, 2, 2, 1, 4, False), (4, 2, 1, 1, 4, False)]}


def k_parts_many_sweep(shapes=SHAPES, formats=("nvfp4",), csv_path=None, log=print, **_):
    """`sweep` of K_PARTS_MANY's splits and the dispatched config at 1, 2 and 4 tokens, bf16 x."""
    rows = []
    for m, splits in K_PARTS_MANY.items():
        configs = [{}] + [dict(k_parts=p, token_tiles=t, groups=g, row_warps=rw, k_warps=kw, x_fragments=xf)
                          for p, t, g, rw, kw, xf in splits]
        rows += sweep(configs, shapes, (m,), formats, None, log)
    if csv_path:
        write_csv(rows, csv_path)
    return rows


def _field_ab(field: str, before, now, shapes, tokens, formats, dtypes, rounds, csv_path, log, applies=None,
              variant=None):
    """`_rule_ab` of the dispatched split (with the fields `variant` overrides) with one config field at `before` and
    at `now`; where `applies(dispatched)` is false, the point is skipped."""
    import dataclasses

    def pair(m, n, k, fmt, xd, dispatched):
        if applies is not None and not applies(dispatched):
            return None
        base = dataclasses.replace(dispatched, **(variant or {}))
        return tuple(dataclasses.replace(base, **{field: v}) for v in (before, now))

    return _rule_ab(shapes, tokens, formats, dtypes, rounds, pair, csv_path, log)


def w_l2_prefetch_ab(size=128, shapes=SHAPES, tokens=(1, 4, 8, 16), formats=FORMATS, rounds=2, csv_path=None,
                     log=print):
    """µs per call of the dispatched split with W's loads plain (before) and `.L2::<size>B` (now), alternately
    `rounds` times, the best of each, bf16 x; with the read of the same bytes: the data behind
    `kernels.W_L2_PREFETCH`."""
    return _field_ab("w_l2_prefetch", 0, size, shapes, tokens, formats, (torch.bfloat16,), rounds, csv_path, log)


def shifts_on_fma_ab(shapes=SHAPES, tokens=(1, 4, 16), formats=FORMATS, dtypes=(torch.bfloat16, torch.float16),
                     rounds=2, csv_path=None, log=print):
    """µs per call of the dispatched split with the decode's right shifts on the ALU (SHF, before) and on the FMA
    pipe (`mul.hi`, IMAD.HI; now), alternately `rounds` times, the best of each; with the read of the same bytes."""
    return _field_ab("shifts_on_fma", False, True, shapes, tokens, formats, dtypes, rounds, csv_path, log)


def pdl_ab(shapes=SHAPES, tokens=(1, 2, 4, 8, 16), formats=FORMATS, rounds=2, csv_path=None, log=print):
    """µs per call of the dispatched split launched plainly (before) and programmatically dependent on the grid
    before it (`pdl`, now: its CTAs start while that grid drains, and wait before their first load), alternately
    `rounds` times, the best of each, bf16 x; with the read of the same bytes. The graph timer's calls follow each
    other, as a model's layers do. Points whose dispatched kernel launches two grids a call (x in fragment order,
    block columns) are skipped."""
    return _field_ab("pdl", False, True, shapes, tokens, formats, (torch.bfloat16,), rounds, csv_path, log,
                     applies=lambda cfg: not (cfg.x_fragments or cfg.block_columns))


def pdl_fragments_ab(shapes=SHAPES, tokens=(4, 8, 16), formats=FORMATS, rounds=2, csv_path=None, log=print):
    """`pdl_ab` where the dispatched call takes x in fragment order: its x pass launched plainly (before) and
    programmatically dependent on the grid before it (now); the other points are skipped."""
    return _field_ab("pdl", False, True, shapes, tokens, formats, (torch.bfloat16,), rounds, csv_path, log,
                     applies=lambda cfg: cfg.x_fragments)


# The variants of the dispatched config that `pdl_variants_ab` launches plainly and programmatically dependent: the
# probe of the one point of `pdl_fragments_ab` that pdl slowed (BENCHMARKS.md, "x in fragment order launched
# programmatically dependent, and the read launched the same way").
PDL_VARIANTS = {"dispatched": {}, "r72": dict(max_registers=72), "r80": dict(max_registers=80),
                "no_xf": dict(x_fragments=False), "kw8": dict(k_warps=8)}


def pdl_variants_ab(shapes=((10240, 8192), (14336, 4096)), tokens=(16,), formats=("nvfp4",), rounds=3, csv_path=None,
                    log=print):
    """`pdl_ab` on each of PDL_VARIANTS of the dispatched config (a register cap, one grid, 8 k-warps), bf16 x: which
    of them pdl slows. Rows carry the variant's name."""
    rows = []
    for name, over in PDL_VARIANTS.items():
        log(f"-- {name}")
        rows += [dict(variant=name, **row) for row in _field_ab("pdl", False, True, shapes, tokens, formats,
                                                                (torch.bfloat16,), rounds, None, log, variant=over)]
    if csv_path:
        write_csv(rows, csv_path)
    return rows


HELD_OUT_SEED = 1207  # none of the rules' A/B runs drew from it (they used 1205)


def held_out_ab(rounds=2, csv_path=None, log=print):
    """The three rules adopted from the A/B runs of 2026-12-05, each against the rules before it, on shapes drawn
    with HELD_OUT_SEED (bf16 and fp16 x; a rule that leaves a point's config as it was skips it): one group at 12 and
    16 tokens (`ONE_GROUP_FRAGMENTS`) and the register file's partitions at 1-16 tokens (`resident_ctas`) on 64
    shapes, 32-token CTAs at 32 and 64 tokens (`TOKEN_TILES_4_X_DTYPES`) on the first 16. One CSV; `rule` names
    the rule of each row."""
    shapes = tuple(drawn_shapes(64, HELD_OUT_SEED))
    dtypes = (torch.bfloat16, torch.float16)
    runs = (("one_group", shapes, (12, 16)), ("token_tiles", shapes[:16], (32, 64)),
            ("register_partitions", shapes, (1, 2, 4, 8, 16)))
    rows = []
    for rule, rule_shapes, tokens in runs:
        for row in rules_ab(RULES_BEFORE[rule], False, rule_shapes, tokens, FORMATS, dtypes, rounds, None, log):
            rows.append(dict(rule=rule, **row))
    if csv_path and rows:
        write_csv(rows, csv_path)
    return rows


MANY_TOKENS_SHAPES = ((8192, 28672), (28672, 4096), (4096, 14336), (4096, 4096), (5760, 2880), (2880, 2880),
                      (2048, 768))


def chunked(n, k, m, fmt, dtype=torch.bfloat16, chunk_bytes=None, epilogue="separate", bias=False):
    """The dequantize-and-GEMM path (nvfp4_gemv/linear/prefill.py) at any M, as the op runs it from
    PREFILL_MIN_TOKENS tokens (chunks of prefill.CHUNK_BYTES, or of `chunk_bytes`; `epilogue` as prefill.bind takes
    it), with the global scale of NVFP4 (and a bias)."""
    from nvfp4_gemv.linear import prefill

    x = torch.randn(m, k, device="cuda").to(dtype)
    pool = _pool(lambda: random_weights(n, k, fmt), weight_bytes(n, k, fmt))
    run = prefill.bind(n, k, x.device, dtype, pool[0][1].dtype, fmt, "plain", chunk_bytes or prefill.CHUNK_BYTES,
                       epilogue)
    y = torch.empty(m, n, device="cuda", dtype=dtype)
    gs = torch.full((1,), 0.5, device="cuda") if fmt == "nvfp4" else None
    b = torch.randn(n, device="cuda").to(dtype) if bias else None
    return (lambda d: run(y, x, d[0], d[1], gs, b)), pool


def dequant_chunk(n, k, fmt):
    """One chunk of the dequantizer alone (as many rows as prefill.chunk_rows gives), for its bytes a second."""
    from cute_kernels.compile import compile_kernel, raw_function
    from cute_kernels.dequant_fp4 import DequantFp4, DequantFp4Config
    from cute_kernels.targets import target
    from cute_kernels.tc_workspace import capability
    from nvfp4_gemv.linear import prefill

    rows = min(prefill.chunk_rows(n, k), n)
    pool = _pool(lambda: random_weights(rows, k, fmt), weight_bytes(rows, k, fmt))
    cfg = DequantFp4Config(fmt=fmt, sf_dtype="e4m3" if fmt == "nvfp4" else "u8")
    fn = raw_function(compile_kernel(DequantFp4, cfg, target(capability(torch.device("cuda"))), stream="torch"))
    out = torch.empty(rows, k, dtype=torch.bfloat16, device="cuda")
    return (lambda d: fn(d[0], d[1], out)), pool


def many_tokens_sweep(shapes=MANY_TOKENS_SHAPES, tokens=(33, 64, 96, 128, 192, 256, 512), fmt="nvfp4", csv_path=None,
                      log=print):
    """Past 16 tokens, µs per call of: the fp4 kernel with the launcher's split in both grid orders (m_major off
    and on), the dequantize-and-GEMM path, and cuBLAS bf16 on a ready bf16 weight; with the read of the fp4 bytes
    and, per shape, one dequantized chunk alone (its reads and writes a second)."""
    from nvfp4_gemv.linear import kernels, prefill

    rows = []
    for n, k in shapes:
        read = _time(lambda: B.stream_read_variant(weight_bytes(n, k, fmt)))
        r = min(prefill.chunk_rows(n, k), n)
        t = _time(lambda: dequant_chunk(n, k, fmt))
        tb_s = (weight_bytes(r, k, fmt) + 2 * r * k) / t / 1e6
        rows.append(dict(n=n, k=k, m=0, variant=f"dequantize one chunk of {r} rows", read_us=read, us=t,
                         ratio=t / read))
        log(f"{n:>6}x{k:<6} dequantize {r} rows: {t:.2f} us, {tb_s:.2f} TB/s of reads and writes")
        for m in tokens:
            cfg = kernels.config_for(m, n, k, fmt, "plain", "bf16", False, fmt == "nvfp4")
            split = dict(groups=cfg.groups, k_warps=cfg.k_warps, max_registers=cfg.max_registers, k_splits=1)
            res = {
                "fp4 kernel, row tiles first": _time(lambda: ours(n, k, m, fmt, **split, m_major=False)),
                "fp4 kernel, token tiles first": _time(lambda: ours(n, k, m, fmt, **split, m_major=True)),
                "dequantize + cuBLAS": _time(lambda: chunked(n, k, m, fmt)),
                "cuBLAS bf16 alone": _time(lambda: cublas(n, k, m)),
            }
            for name, t in res.items():
                rows.append(dict(n=n, k=k, m=m, variant=name, read_us=read, us=t, ratio=t / read))
            log(f"{n:>6}x{k:<6} {m:>5} read {read:7.2f}  " + "  ".join(f"{a}: {b:8.2f}" for a, b in res.items()))
    if csv_path:
        write_csv(rows, csv_path)
    return rows


def chunk_bytes_sweep(shapes=MANY_TOKENS_SHAPES, tokens=(128, 256, 512), chunk_mb=(8, 16, 24, 32, 64), fmt="nvfp4",
                      epilogues=("separate", "fused"), rounds=2, csv_path=None, log=print):
    """µs per call of the dequantize-and-GEMM path (NVFP4: a global scale and a bias) with W dequantized in chunks of
    each size in `chunk_mb` (MB of 16-bit values; the library's is prefill.CHUNK_BYTES) and each of `epilogues`
    (prefill.bind's), alternately `rounds` times, the best of each; with the read of the fp4 bytes and cuBLAS bf16 on
    a ready bf16 weight. The questions: whether a chunk the L2 holds, which the GEMM then reads from the L2 rather
    than DRAM, pays for the more, narrower GEMMs it takes, and what one epilogue kernel a chunk saves."""
    from nvfp4_gemv.linear import prefill

    rows = []
    for n, k in shapes:
        read = _time(lambda: B.stream_read_variant(weight_bytes(n, k, fmt)))
        for m in tokens:
            best = {}
            for _ in range(rounds):
                for mb, epi in itertools.product(chunk_mb, epilogues):
                    t = _time(lambda: chunked(n, k, m, fmt, chunk_bytes=mb << 20, epilogue=epi, bias=True))
                    best[mb, epi] = min(best.get((mb, epi), math.inf), t)
            cub = _time(lambda: cublas(n, k, m))
            for (mb, epi), t in best.items():
                rows.append(dict(n=n, k=k, m=m, chunk_mb=mb, epilogue=epi,
                                 chunk_rows=prefill.chunk_rows(n, k, mb << 20), read_us=read, us=t, ratio=t / read,
                                 cublas_us=cub))
            log(f"{n:>6}x{k:<6} {m:>4} read {read:7.2f} cuBLAS {cub:8.2f}  "
                + "  ".join(f"{mb} MB {epi}: {t:8.2f}" for (mb, epi), t in best.items()))
    if csv_path:
        write_csv(rows, csv_path)
    return rows


# The A/B runs `nvfp4-gemv ab` offers: name -> (what it times, the call). Each writes linear_ab_<name>.csv; the ones
# that check a rule the launcher took name the BENCHMARKS.md section that records them.
AB_RUNS = {
    "k_warps": ("any number of k-warps (widen_k_warps) against powers of two", k_warps_ab),
    "pdl": ("the default kernel launched programmatically dependent on the call before it, against a plain launch",
            pdl_ab),
    "pdl_fragments": ("x in fragment order with its x pass launched programmatically dependent on the call before "
                      "it, against a plain launch", pdl_fragments_ab),
    "pdl_variants": ("pdl against a plain launch on variants of the dispatched config at 10240 x 8192 and 14336 x "
                     "4096, 16 tokens (register caps, one grid, 8 k-warps)", pdl_variants_ab),
    "x_fragments": ("x in fragment order forced on and off at the launcher's split", x_fragments_ab),
    "x_fragments_few": ("at 1-2 tokens, x in fragment order with one and with two K parts a row",
                        lambda **kw: x_fragments_ab(tokens=(1, 2), more={"parts2": dict(k_parts=2, x_fragments=True)},
                                                    **kw)),
    "fragments_fp16": ("fp16 x's fragment register entry and cap against none", fragments_fp16_ab),
    "mx_fold": ("MXFP4's scale fold with fp16 x against the general path", mx_fold_ab),
    "mx_fold_bf16": ("MXFP4's scale fold with bf16 x against the general path",
                     lambda **kw: mx_fold_ab(x_dtype="bf16", **kw)),
    "mx_fold_designs": ("MXFP4's scale fold with a vote a step against the whole K and a redo, and the general "
                        "path, bf16 and fp16 x", mx_fold_designs_ab),
    "zero_blocks": ("bf16 x on MXFP4's whole-K fold with 0, 0.1 and 1 % all-zero blocks of scale 2^-127: a pass over "
                    "the codes before a redo, against the redo alone and the general path", zero_blocks_ab),
    "zero_blocks_fp16": ("fp16 x on MXFP4's fold (a vote a step) with 0 and 0.1 % all-zero blocks of scale 2^-127 at "
                         "1 and 4 tokens: their codes checked where a vote fails, against the vote alone and the "
                         "general path",
                         lambda **kw: zero_blocks_ab(tokens=(1, 4), shares=(0.0, 0.001), x_dtype="fp16", **kw)),
    "one_group": ("16-token CTAs of one group and more warps against two groups under 18 warps an SM (the bench "
                  "shapes and 40 drawn ones)",
                  lambda **kw: one_group_ab(shapes=SHAPES + tuple(drawn_shapes(40, 1205)), **kw)),
    "fragments_capped_64": ("16-token one-group CTAs with x in fragment order capped at 64 registers",
                            lambda **kw: rules_ab(fragments_capped(1, 64), **kw)),
    "fragments_capped_96": ("16-token two-group CTAs with x in fragment order capped at 96 registers",
                            lambda **kw: rules_ab(fragments_capped(2, 96), **kw)),
    "token_tiles": ("32-token CTAs (W decoded once per 32 tokens) against 16-token ones, 17-127 tokens",
                    token_tiles_ab),
    "chunk_bytes": ("the many-token path's chunk size: 8-64 MB at 128-512 tokens",
                    chunk_bytes_sweep),
    "held_out": ("the three rules of 2026-12-05 (one group at 12-16 tokens, 32-token CTAs at 32 and 64, the register "
                 "file's partitions at 1-16) against the rules before each, on shapes drawn with a seed none was "
                 "read from, bf16 and fp16 x", held_out_ab),
    "columns_or_fold": ("MXFP4 at 1-2 tokens where block columns are dispatched, against the rules without them (the "
                        "scale fold, or the general path), the bench shapes and 24 drawn ones: fp16 x (bf16 x took "
                        "them from 24 MB until this run on an H200 had the fold faster)",
                        lambda **kw: rules_ab(dict(COLUMNS_MIN_WEIGHT_BYTES={"fp16": 1 << 62}),
                                              shapes=SHAPES + tuple(drawn_shapes(24, 1209)), tokens=(1, 2),
                                              formats=("mxfp4",), dtypes=(torch.bfloat16, torch.float16), **kw)),
    "one_group_fold": ("16-token CTAs of MXFP4's scale fold with x in fragment order: two groups (the rules before "
                       "the fold's keys joined ONE_GROUP_FRAGMENTS) against the dispatched one group, 9-16 tokens, "
                       "fp16 and bf16 x, the bench shapes and 40 drawn ones",
                       _before_ab("one_group_fold", (9, 12, 16), ("mxfp4",), (torch.float16, torch.bfloat16))),
    "mx_fold_min_cap": ("bf16 x on MXFP4 with x in fragment order under the 48-register cap: the general path (the "
                        "rules before MX_FOLD_MIN_CAP_FRAGMENTS) against the dispatched scale fold, 1-8 tokens, the "
                        "bench shapes and 40 drawn ones",
                        _before_ab("mx_fold_min_cap", (1, 2, 3, 4, 6, 8), ("mxfp4",), (torch.bfloat16,))),
    "mx_fold_uncapped": ("fp16 x on MXFP4's scale fold with x in fragment order: the split under the 48-register cap "
                         "(CAPS; the rules before UNCAPPED_FRAGMENTS) against the dispatched one without it, 1-8 "
                         "tokens, the bench shapes and 40 drawn ones",
                         _before_ab("mx_fold_uncapped", (1, 2, 3, 4, 6, 8), ("mxfp4",), (torch.float16,))),
    "k_parts_many": ("four and eight K parts a row against the dispatched config, 1, 2 and 4 tokens",
                     k_parts_many_sweep),
    "w_l2_prefetch": ("W's loads with .L2::128B against without, 1-16 tokens", w_l2_prefetch_ab),
    "shifts_on_fma": ("the decode's right shifts as mul.hi (IMAD.HI, FMA pipe) against SHF (ALU pipe), 1, 4 and 16 "
                      "tokens, bf16 and fp16 x", shifts_on_fma_ab),
    "register_partitions": ("splits chosen with the register file's sub-partitions counted (kernels.resident_ctas) "
                            "against the whole file (dispatch.ctas_per_sm), 1-16 tokens, bf16 and fp16 x, the bench "
                            "shapes and 40 drawn ones",
                            _before_ab("register_partitions", (1, 2, 3, 4, 6, 8, 9, 12, 16), FORMATS,
                                       (torch.bfloat16, torch.float16))),
}


def quack(n, k, m, fmt):
    """quack's `gemm_w4a16` on bf16 x, the only activation type it takes (it asserts bf16), whatever x ours gets."""
    from quack.gemm_w4 import gemm_w4a16, prepare_w4_weight

    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)

    def make():
        w, sf = random_weights(n, k, fmt)
        return prepare_w4_weight(w, sf, wformat=fmt)

    pool = _pool(make, weight_bytes(n, k, fmt))
    return (lambda d: gemm_w4a16(x, d[0], d[1], wformat=fmt, n_out=n)), pool


def cublas(n, k, m, dtype=torch.bfloat16):
    x = torch.randn(m, k, device="cuda").to(dtype)
    pool = _pool(lambda: torch.randn(n, k, device="cuda").to(dtype), 2 * n * k)
    return (lambda w: torch.nn.functional.linear(x, w)), pool


def host_table(n=4096, k=4096, m=1, log=print) -> dict:
    """Wall µs per call, issued back to back on a small shape (the GPU keeps up: host time), of the eager op and
    of what it is made of: the launch alone, the raw TVM-FFI function, the output allocation; torch's own
    `F.linear` on a tiny bf16 shape beside them for scale."""
    from nvfp4_gemv.linear import fp4_linear, kernels

    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    w, sf = random_weights(n, k, "nvfp4")
    gs = torch.full((1,), 0.5, device="cuda")
    fp4_linear(x, w, sf, "nvfp4", 0.5)
    launch = kernels.bind(n, k, x.device, x.dtype, sf.dtype, "nvfp4", "plain", True, False)
    launch(y, x, w, sf, gs, None)
    fn, _, bias_dummy, _ = kernels.plan_for(m, n, k, x.device, x.dtype, sf.dtype, "nvfp4", "plain", True, False,
                                            x_fragments=False)
    xs = torch.randn(1, 256, device="cuda").to(torch.bfloat16)
    ws = torch.randn(256, 256, device="cuda").to(torch.bfloat16)
    # MXFP4 with fp16 x on 24 MB of codes takes the block-columns kernel: a workspace and two kernels a call.
    n_bc, k_bc = 8192, 6144
    w_bc, sf_bc = random_weights(n_bc, k_bc, "mxfp4")
    x_bc = torch.randn(m, k_bc, device="cuda").to(torch.float16)
    assert kernels.config_for(m, n_bc, k_bc, "mxfp4", "plain", "fp16", False, False).block_columns
    # The same path forced on the small weight, where the GPU keeps up with the host whatever the path.
    w_mx, sf_mx = random_weights(n, k, "mxfp4")
    launch_bc = kernels.bind(n, k, x.device, x.dtype, sf_mx.dtype, "mxfp4", "plain", False, False,
                             block_columns=True)
    launch_bc(y, x, w_mx, sf_mx, None, None)
    # x in fragment order (a first kernel writes x for the main loop) forced, and the default kernel forced.
    launch_xf = kernels.bind(n, k, x.device, x.dtype, sf.dtype, "nvfp4", "plain", True, False, x_fragments=True)
    launch_xf(y, x, w, sf, gs, None)
    launch_one = kernels.bind(n, k, x.device, x.dtype, sf.dtype, "nvfp4", "plain", True, False, x_fragments=False)
    launch_one(y, x, w, sf, gs, None)
    rows = {
        "fp4_linear (eager op)": lambda d: fp4_linear(x, w, sf, "nvfp4", 0.5),
        f"fp4_linear, MXFP4 {n_bc} x {k_bc}, fp16 x (block columns)": lambda d: fp4_linear(x_bc, w_bc, sf_bc, "mxfp4"),
        "bound launch (size check + plan + launch)": lambda d: launch(y, x, w, sf, gs, None),
        "bound launch, one kernel (x_fragments off)": lambda d: launch_one(y, x, w, sf, gs, None),
        "bound launch, x in fragment order forced": lambda d: launch_xf(y, x, w, sf, gs, None),
        f"bound launch, block columns forced, MXFP4 {n} x {k}": lambda d: launch_bc(y, x, w_mx, sf_mx, None, None),
        "raw TVM-FFI function": lambda d: fn(x, w, sf, y, gs, bias_dummy),
        "torch.empty of y": lambda d: torch.empty(m, n, dtype=torch.bfloat16, device="cuda"),
        "F.linear, 1 x 256 x 256 bf16": lambda d: torch.nn.functional.linear(xs, ws),
    }
    out = {}
    for name, fn_ in rows.items():
        out[name] = B.host_cost_us(fn_, None)
        log(f"  host {name}: {out[name]:.1f} us a call")
    return out


# ncu's view of the dispatched kernel: where a call's time goes. `ncu_launches` makes the launches, ncu measures
# them (`NCU_COMMAND`), and `ncu_table` reads ncu's CSV back as one row a point.
NCU_POINTS = tuple((n, k, m, fmt) for n, k in ((8192, 28672), (4096, 14336), (4096, 4096)) for m in (1, 4, 8, 16)
                   for fmt in FORMATS)
NCU_TIME = "gpu__time_duration.sum"
NCU_TO_US = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}  # ncu's duration units
NCU_METRICS = {
    NCU_TIME: "us",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram %",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue %",
    "smsp__warps_active.avg.per_cycle_active": "warps",
    "smsp__warps_eligible.avg.per_cycle_active": "eligible",
    "l1tex__data_pipe_lsu_wavefronts.avg.pct_of_peak_sustained_active": "lsu %",
    "sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active": "alu %",
    "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active": "fma %",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor %",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "long sb",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio": "short sb",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio": "pipe thr",
    "smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio": "lg thr",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio": "mio thr",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio": "barrier",
    "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "wait",
    "smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio": "not sel",
    "smsp__inst_executed.sum": "inst",
    "launch__registers_per_thread": "regs",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
}
NCU_KERNEL = "regex:^kernel_cutlass_kernel_cute_kernelslinear_w4a16"  # the main kernel (not x's first pass)
# Then: ncu_table(open("ncu.csv").read(), [s.strip() for s in open("ncu_points.txt") if " M=" in s]).
NCU_COMMAND = ("ncu --clock-control none --kernel-name " + NCU_KERNEL + " --csv --log-file ncu.csv --metrics "
               + ",".join(NCU_METRICS) + " python -c 'from nvfp4_gemv.linear import bench as LB; LB.ncu_launches()'"
               + " > ncu_points.txt")
NCU_REPEATS = 2  # launches a point; the table keeps the last (code and constants warm, the L2 cold)


def ncu_launches(points=NCU_POINTS, dtype=torch.bfloat16, log=print) -> list[str]:
    """For ncu (`NCU_COMMAND`): the dispatched op at each (N, K, M, format) NCU_REPEATS times, each call after a
    1 GiB write that leaves none of W in the L2, in the order given. Logs and returns each point's label (shape,
    tokens, format, config) in that order, which `ncu_table` pairs with the profiled launches."""
    from nvfp4_gemv.linear import fp4_linear, kernels

    flush = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    labels = []
    for n, k, m, fmt in points:
        x = torch.randn(m, k, device="cuda").to(dtype)
        w, sf = random_weights(n, k, fmt)
        gs = 0.5 if fmt == "nvfp4" else None
        cfg = kernels.config_for(m, n, k, fmt, "plain", kernels._X_DTYPES[dtype], False, gs is not None,
                                 kernels.sm_count(torch.cuda.current_device()))
        for _ in range(NCU_REPEATS):
            flush.fill_(1)
            fp4_linear(x, w, sf, fmt, gs)
        torch.cuda.synchronize()
        labels.append(f"{n}x{k} M={m} {fmt} ({_label(cfg)})")
        log(labels[-1])
    return labels


def ncu_table(csv_text: str, labels: list[str], log=print) -> list[dict]:
    """ncu's `--csv` output of `NCU_COMMAND` as one row a point: the last of its NCU_REPEATS launches, every metric
    in NCU_METRICS under its short name. Raises if ncu profiled another number of launches than the points made."""
    lines = csv_text[csv_text.find('"ID"'):].splitlines()
    launches: dict[str, dict] = {}
    for r in csv.DictReader(lines):
        value = r["Metric Value"].replace(",", "")
        if value.replace(".", "", 1).isdigit():
            value = float(value) * (NCU_TO_US.get(r["Metric Unit"], 1.0) if r["Metric Name"] == NCU_TIME else 1.0)
        launches.setdefault(r["ID"], {})[NCU_METRICS.get(r["Metric Name"], r["Metric Name"])] = value
    if len(launches) != NCU_REPEATS * len(labels):
        raise ValueError(f"ncu profiled {len(launches)} launches; {len(labels)} points make {NCU_REPEATS} each")
    order = sorted(launches, key=int)
    rows = []
    for i, label in enumerate(labels):
        row = dict(point=label, **launches[order[NCU_REPEATS * i + NCU_REPEATS - 1]])
        rows.append(row)
        log("  ".join(f"{key} {val:.3g}" if isinstance(val, float) else f"{key} {val}" for key, val in row.items()))
    return rows


def _time(factory):
    try:
        fn, pool = factory()
        return B.graph_time_us(fn, pool)
    except Exception as e:  # a peer that does not run here is reported, not fatal
        print(f"  ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})")
        return math.nan


def run(shapes=SHAPES, tokens=TOKENS, formats=FORMATS, peers: bool = True, csv_path=None, plot_path=None, log=print,
        dtype=torch.bfloat16):
    """Time every (shape, M, format) with x of `dtype` (bf16 or fp16; cuBLAS runs in the same dtype); print the
    table; optionally write CSV and a plot. Returns the rows.

    Two reads of W's bytes stand beside each point: the read launched plainly (`read`, the project's yardstick) and
    launched programmatically dependent as the linear is up to `kernels.PDL_MAX_TOKENS` tokens (`read_pdl`): with
    calls back to back, each call's start then overlaps the last one's end, which the plain read does not get."""
    from cute_kernels.stream_read import StreamReadConfig
    from nvfp4_gemv.linear import kernels

    x_dtype = kernels._X_DTYPES[dtype]
    rows = []
    log(f"x {x_dtype}" + ("" if x_dtype == "bf16" else " (quack takes bf16 x only: its column is timed on bf16 x)"))
    log(f"{'N x K':>13} {'M':>3} {'fmt':>5} {'read':>7} {'ours':>7} {'/read':>6} {'/rpdl':>6} {'quack':>7} "
        f"{'q/ours':>6} {'cuBLAS':>7} {'c/ours':>6}  config")
    for n, k in shapes:
        cub = {m: (_time(lambda: cublas(n, k, m, dtype)) if peers else math.nan) for m in tokens}
        for fmt in formats:
            read = _time(lambda: B.stream_read_variant(weight_bytes(n, k, fmt)))
            read_pdl = _time(lambda: B.stream_read_variant(weight_bytes(n, k, fmt), config=StreamReadConfig(pdl=True)))
            for m in tokens:
                t = _time(lambda: ours(n, k, m, fmt, dtype))
                q = _time(lambda: quack(n, k, m, fmt)) if peers else math.nan
                cfg = kernels.config_for(m, n, k, fmt, "plain", x_dtype, False, fmt == "nvfp4")
                desc = (f"g{cfg.groups} kw{cfg.k_warps} t{cfg.token_tiles}"
                        + (f" p{cfg.k_parts}" if cfg.k_parts > 1 else "")
                        + (f" a{cfg.acc_sets}" if cfg.acc_sets > 1 else "")
                        + (f" s{cfg.k_splits}" if cfg.k_splits > 1 else "")
                        + (f" r{cfg.max_registers}" if cfg.max_registers else "")
                        + (" bc" if cfg.block_columns else "") + (" xf" if cfg.x_fragments else "")
                        + (" fold" if cfg.mx_fold else ""))
                row = dict(n=n, k=k, m=m, fmt=fmt, x_dtype=x_dtype, read_us=read, ours_us=t, ratio=t / read,
                           quack_us=q, quack_over_ours=q / t, cublas_us=cub[m], cublas_over_ours=cub[m] / t,
                           config=desc, read_pdl_us=read_pdl, ratio_pdl=t / read_pdl)
                rows.append(row)
                log(f"{n:>6}x{k:<6} {m:>3} {fmt:>5} {read:7.2f} {t:7.2f} {t / read:6.2f} {t / read_pdl:6.2f} "
                    f"{q:7.2f} {q / t:6.2f} {cub[m]:7.2f} {cub[m] / t:6.2f}  {desc}")
    for key, name in (("ratio", "read"), ("ratio_pdl", "read launched pdl")):
        ratios = [r[key] for r in rows if r[key] == r[key]]
        if ratios:
            log(f"geomean ours / {name}: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f} over "
                f"{len(ratios)} points")
    if csv_path:
        write_csv(rows, csv_path)
    if plot_path:
        plot(rows, plot_path)
    return rows


# (E, N, K, top_k, format) of routed MoE projections: gpt-oss-20b and -120b (MXFP4; gate_up's 2 x 2880 rows, down),
# and Qwen3-30B-A3B's experts (gate_up 2 x 768 rows, down) as an NVFP4 checkpoint holds them.
EXPERT_SHAPES = ((32, 5760, 2880, 4, "mxfp4"), (32, 2880, 2880, 4, "mxfp4"), (128, 5760, 2880, 4, "mxfp4"),
                 (128, 2880, 2880, 4, "mxfp4"), (128, 1536, 2048, 8, "nvfp4"), (128, 2048, 768, 8, "nvfp4"))
EXPERT_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LOOP_MAX_TOKENS = 16  # the loop of one fp4_linear a slot, timed up to this many tokens
EXPERT_ROUTINGS = ("distinct", "random")


def _expert_ids(e: int, t: int, top_k: int, calls: int, routing: str = "distinct", device="cuda"):
    """`calls` id tensors (T, top_k) and each call's count of distinct experts. "distinct": each call's slots name
    the next experts round the E (no two slots of a call share one while T·top_k <= E, and consecutive calls find
    few of theirs in L2); "random": each token's top_k distinct experts drawn uniformly, as a router with balanced
    load gives them (tokens share experts as often as chance has it)."""
    g = torch.Generator().manual_seed(t * 1000 + top_k)
    pool, distinct = [], []
    for c in range(calls):
        if routing == "distinct":
            flat = (c * t * top_k + torch.arange(t * top_k)) % e
        else:
            flat = torch.stack([torch.randperm(e, generator=g)[:top_k] for _ in range(t)]).flatten()
        pool.append(flat.view(t, top_k).to(device))
        distinct.append(len(set(flat.tolist())))
    return pool, distinct


def _expert_points(shapes, tokens, routings, dtype):
    """Each point of an experts bench, shape by shape (one stack of random experts a shape, scales in the bench's
    range): ((E, N, K, top_k, fmt), T, routing, per_expert bytes, the pool of id tensors, each call's count of
    distinct experts, x, (weight, weight_scale, global_scale), and `by(eager)`: a call of `eager` (an EagerExperts)
    on an id tensor)."""
    for e, n, k, top_k, fmt in shapes:
        w = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device="cuda")
        block = 16 if fmt == "nvfp4" else 32
        lo, hi = (0x28, 0x40) if fmt == "nvfp4" else MXFP4_SCALES
        sf = torch.randint(lo, hi + 1, (e, n, k // block), dtype=torch.uint8, device="cuda")
        if fmt == "nvfp4":
            sf = sf.view(torch.float8_e4m3fn)
        gs = torch.full((e,), 0.5, device="cuda") if fmt == "nvfp4" else None
        per_expert = weight_bytes(n, k, fmt)
        for t in tokens:
            for routing in routings if t > 1 else routings[:1]:
                calls = max(2, -(-POOL_BYTES // (per_expert * min(e, t * top_k))))
                pool, distinct = _expert_ids(e, t, top_k, calls, routing)
                x = torch.randn(t, k, device="cuda").to(dtype)

                def by(eager, x=x, w=w, sf=sf, fmt=fmt, gs=gs):
                    return lambda ids: eager(x, w, sf, ids, fmt, gs, None)

                yield (e, n, k, top_k, fmt), t, routing, per_expert, pool, distinct, x, (w, sf, gs), by


def _forced_experts(**route):
    """An EagerExperts on the routed kernel with `route`'s config fields forced (expert_group, expert_runs,
    token_tiles), at any token count."""
    import functools

    from nvfp4_gemv.linear import kernels
    from nvfp4_gemv.linear.experts import EagerExperts

    return EagerExperts(bind=functools.partial(kernels.bind_experts, **route), max_tokens=1 << 30)


def run_table_ab(shapes=EXPERT_SHAPES, tokens=(1, 8, 16, 32, 64, 128, 256), routings=EXPERT_ROUTINGS,
                 dtype=torch.bfloat16, csv_path=None, log=print):
    """µs per call, graph-timed, of the routed kernel with its runs of 8 slots from a table made by torch ops
    (`run_table_torch`) and by one launch of `cute_kernels.run_table` (RUN_TABLE_KERNEL on), and its runs of 16
    slots (two token tiles) from the kernel's table, beside the scanned groups and one slot a CTA row, at every
    (E, N, K, top_k, format), T and routing; and the table alone, both ways (`table_torch_us`, `table_kernel_us`).
    Returns the rows."""
    from nvfp4_gemv.linear import kernels

    slot_kernel, group_kernel = _forced_experts(expert_group=False), _forced_experts(expert_group=True)
    runs_kernel = _forced_experts(expert_runs=True, token_tiles=1)
    runs16_kernel = _forced_experts(expert_runs=True, token_tiles=2)
    rows = []
    log(f"{'E':>4} {'N x K':>11} {'top_k':>5} {'fmt':>5} {'T':>3} {'routing':>8} {'slot':>7} {'group':>7} "
        f"{'runs.t':>7} {'runs.k':>7} {'k/t':>5} {'runs16':>7} {'16/8':>5} {'tab.t':>6} {'tab.k':>6}")
    for (e, n, k, top_k, fmt), t, routing, _, pool, _, _, _, by in _expert_points(shapes, tokens, routings, dtype):
        slot_us = B.graph_time_us(by(slot_kernel), pool)
        group_us = B.graph_time_us(by(group_kernel), pool)
        with _kernels_patched(RUN_TABLE_KERNEL=False):
            runs_torch = B.graph_time_us(by(runs_kernel), pool)
            table_torch = B.graph_time_us(lambda ids: kernels.run_table(ids, e), pool)
        with _kernels_patched(RUN_TABLE_KERNEL=True):
            runs_kernel_us = B.graph_time_us(by(runs_kernel), pool)
            runs16_us = B.graph_time_us(by(runs16_kernel), pool)
            table_kernel = B.graph_time_us(lambda ids: kernels.run_table(ids, e), pool)
        row = dict(experts=e, n=n, k=k, top_k=top_k, t=t, routing=routing, fmt=fmt,
                   x_dtype=str(dtype).split(".")[-1], slot_us=slot_us, group_us=group_us,
                   runs_torch_us=runs_torch, runs_kernel_us=runs_kernel_us,
                   kernel_over_torch=runs_kernel_us / runs_torch, runs16_kernel_us=runs16_us,
                   runs16_over_runs8=runs16_us / runs_kernel_us, table_torch_us=table_torch,
                   table_kernel_us=table_kernel)
        rows.append(row)
        log(f"{e:>4} {n:>5}x{k:<5} {top_k:>5} {fmt:>5} {t:>3} {routing:>8} {slot_us:7.2f} {group_us:7.2f} "
            f"{runs_torch:7.2f} {runs_kernel_us:7.2f} {runs_kernel_us / runs_torch:5.2f} {runs16_us:7.2f} "
            f"{runs16_us / runs_kernel_us:5.2f} {table_torch:6.2f} {table_kernel:6.2f}")
    if csv_path:
        write_csv(rows, csv_path)
    return rows


def run_table_placement_ab(experts=(8, 32, 128, 256, 511, 512, 1023), slots=(32, 256, 1024, 2048, 4096, 16384),
                           csv_path=None, log=print):
    """µs per call, graph-timed, of the run table from one launch of `cute_kernels.run_table` with the warps placing
    a chunk's slots side by side (`buckets` run_table.buckets_for(E): 16 warps up to 511 experts, 8 up to 1,023) and
    with warp 0 placing them alone (`buckets` BUCKETS), on a router's random ids (int64), and whether the two tables
    are equal. Returns the rows."""
    from cute_kernels.run_table import BUCKETS, buckets_for, placers
    from nvfp4_gemv.linear import kernels

    rows = []
    log(f"{'E':>4} {'warps':>5} {'slots':>6} {'side':>7} {'warp0':>7} {'s/w0':>5} {'equal':>5}")
    for e in experts:
        side_buckets = buckets_for(e)
        for n in slots:
            pool = [torch.randint(0, e, (n,), device="cuda") for _ in range(8)]
            side = B.graph_time_us(lambda ids: kernels.run_table_kernel(ids, e, buckets=side_buckets), pool)
            alone = B.graph_time_us(lambda ids: kernels.run_table_kernel(ids, e, buckets=BUCKETS), pool)
            equal = all(torch.equal(kernels.run_table_kernel(ids, e, buckets=side_buckets),
                                    kernels.run_table_kernel(ids, e, buckets=BUCKETS)) for ids in pool)
            rows.append(dict(experts=e, placers=placers(side_buckets), slots=n, side_by_side_us=side, warp0_us=alone,
                             equal=equal))
            log(f"{e:>4} {placers(side_buckets):>5} {n:>6} {side:7.2f} {alone:7.2f} {side / alone:5.2f} "
                f"{str(equal):>5}")
    if csv_path:
        write_csv(rows, csv_path)
    return rows


def experts_run(shapes=EXPERT_SHAPES, tokens=EXPERT_TOKENS, routings=EXPERT_ROUTINGS, dtype=torch.bfloat16,
                csv_path=None, log=print):
    """µs per call of the routed launch (`fp4_experts_linear` up to EXPERTS_MAX_TOKENS tokens) at every (E, N, K,
    top_k, format), T and routing, against the read of the bytes of the experts a call names. Beside it, in the same
    graph timer: the routed kernel one slot a CTA (no groups: each slot reads its expert), the routed kernel with the
    slots that share an expert grouped (expert_group forced), the same runs from a table made on the device
    (expert_runs forced; `ours` takes one of the three), and up to LOOP_MAX_TOKENS
    tokens the loop users write with one module an expert (an fp4_linear a (token, expert) slot). Eager wall µs a
    call issued back to back (`host`: the host's time where the GPU keeps up) of `fp4_experts_linear` as dispatched
    (past EXPERTS_MAX_TOKENS, each expert's tokens through fp4_linear with the ids read on the host) and, past
    LOOP_MAX_TOKENS, of that host path (`host_path`). Returns the rows."""
    from nvfp4_gemv.linear import fp4_experts_linear, fp4_linear
    from nvfp4_gemv.linear.experts import EagerExperts

    slot_kernel, group_kernel = _forced_experts(expert_group=False), _forced_experts(expert_group=True)
    runs_kernel = _forced_experts(expert_runs=True)
    routed = EagerExperts(max_tokens=1 << 30)
    host_path = EagerExperts(max_tokens=0)
    rows = []
    log(f"{'E':>4} {'N x K':>11} {'top_k':>5} {'fmt':>5} {'T':>3} {'routing':>8} {'experts':>7} {'read':>7} "
        f"{'ours':>7} {'/read':>6} {'slot':>7} {'s/ours':>6} {'group':>7} {'g/ours':>6} {'runs':>7} {'r/ours':>6} "
        f"{'loop':>7} {'l/ours':>6} {'host':>7} {'h.path':>7}")
    for point in _expert_points(shapes, tokens, routings, dtype):
        (e, n, k, top_k, fmt), t, routing, per_expert, pool, distinct, x, (w, sf, gs), by = point
        def loop(ids):  # ids as host lists, as a loop over modules has them
            for i, row in enumerate(ids):
                for ex in row:
                    fp4_linear(x[i:i + 1], w[ex], sf[ex], fmt, None if gs is None else gs[ex:ex + 1])

        ours_us = B.graph_time_us(by(routed), pool)
        slot_us = B.graph_time_us(by(slot_kernel), pool)
        group_us = B.graph_time_us(by(group_kernel), pool)
        runs_us = B.graph_time_us(by(runs_kernel), pool)
        loop_us = B.graph_time_us(loop, [p.tolist() for p in pool]) if t <= LOOP_MAX_TOKENS else float("nan")
        one = lambda ids: fp4_experts_linear(x, w, sf, ids, fmt, gs)  # noqa: E731
        host = B.host_cost_us(one, pool[0], iters=500 if t <= LOOP_MAX_TOKENS else 20)
        path = B.host_cost_us(by(host_path), pool[0], iters=20) if t > LOOP_MAX_TOKENS else float("nan")
        nbytes = per_expert * round(sum(distinct) / len(distinct))
        read = _time(lambda: B.stream_read_variant(nbytes))
        row = dict(experts=e, n=n, k=k, top_k=top_k, t=t, routing=routing, fmt=fmt,
                   x_dtype=str(dtype).split(".")[-1], distinct=nbytes // per_expert, read_us=read,
                   ours_us=ours_us, ratio=ours_us / read, slot_us=slot_us, slot_over_ours=slot_us / ours_us,
                   group_us=group_us, group_over_ours=group_us / ours_us,
                   runs_us=runs_us, runs_over_ours=runs_us / ours_us,
                   loop_us=loop_us, loop_over_ours=loop_us / ours_us, host_us=host, host_path_us=path)
        rows.append(row)
        log(f"{e:>4} {n:>5}x{k:<5} {top_k:>5} {fmt:>5} {t:>3} {routing:>8} {row['distinct']:>7} {read:7.2f} "
            f"{ours_us:7.2f} {ours_us / read:6.2f} {slot_us:7.2f} {slot_us / ours_us:6.2f} {group_us:7.2f} "
            f"{group_us / ours_us:6.2f} {runs_us:7.2f} {runs_us / ours_us:6.2f} {loop_us:7.2f} "
            f"{loop_us / ours_us:6.2f} {host:7.1f} {path:7.1f}")
    if csv_path:
        write_csv(rows, csv_path)
    return rows


def plot(rows, path):
    """Time against M per shape: the reads (plain, and launched pdl where the rows have it), ours and quack per
    format, cuBLAS in x's dtype."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({(r["n"], r["k"]) for r in rows}, key=lambda s: s[0] * s[1])
    cols = 4
    fig, axes = plt.subplots(-(-len(shapes) // cols), cols, figsize=(4 * cols, 3 * -(-len(shapes) // cols)),
                             squeeze=False)
    for ax, (n, k) in zip(axes.flat, shapes):
        sub = [r for r in rows if (r["n"], r["k"]) == (n, k)]
        ms = sorted({r["m"] for r in sub})
        for fmt, style in (("nvfp4", "-"), ("mxfp4", "--")):
            f = [r for r in sub if r["fmt"] == fmt]
            if not f:
                continue
            ax.plot(ms, [r["read_us"] for r in f], "k" + style, lw=1, label=f"read ({fmt} bytes)")
            if "read_pdl_us" in f[0]:
                ax.plot(ms, [r["read_pdl_us"] for r in f], style, color="0.6", lw=1,
                        label=f"read launched pdl ({fmt})")
            ax.plot(ms, [r["ours_us"] for r in f], "C0" + style, marker="o", label=f"nvfp4-gemv {fmt}")
            ax.plot(ms, [r["quack_us"] for r in f], "C1" + style, marker="s", label=f"quack {fmt}")
        ax.plot(ms, [r["cublas_us"] for r in sub if r["fmt"] == sub[0]["fmt"]], "C3:", marker="^",
                label=f"cuBLAS {sub[0]['x_dtype']}")
        ax.set_title(f"{n} x {k}, x {sub[0]['x_dtype']}", fontsize=9)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms, [str(m) for m in ms])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("tokens M", fontsize=8)
        ax.set_ylabel("µs", fontsize=8)
    for ax in list(axes.flat)[len(shapes):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
