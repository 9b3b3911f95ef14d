"""Bring-up of the Blackwell variants on a first B200: adversarial probes, a verdict table, and the verdict file
that dispatch then follows.

No kernel of this project has run on a B200. `nvfp4-gemv check --bringup` runs every variant in
`nvfp4_gemv.dispatch.SM100_VARIANTS` (tcgen05 with MMA N = 8, tcgen05 with N = 128, the CUDA-core kernel with the
hardware fp4 decode) on probes built to catch what a data-path bug would do, compares each output with the fp32
reference of the same call (the contest's tolerance, NaN status included), prints a table and writes the variants
that passed every probe, in order, to the verdict file. On other GPUs the same probes run against this GPU's own
dispatched kernel, which checks the probes; without a GPU against the reference alone.

The probes:
- contest data and full-range data on ragged shapes (M tails, K tails of 64, L > 1);
- one-hot K vectors (one nonzero element of b), which pin the K order, the nibble order and the scale indexing;
- NaN and huge values in b's rows 1..127 and their scales (an N = 8 or N = 128 MMA multiplies them into other
  columns, never into column 0);
- NaN in the padded rows of A's permuted scales (rows past M of the last 128-row block).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

VERDICT_ENV = "NVFP4_GEMV_VERDICT"


def verdict_path() -> Path:
    """Where the verdict lives: $NVFP4_GEMV_VERDICT, else ~/.cache/nvfp4-gemv/sm100_verdict.json."""
    return Path(os.environ.get(VERDICT_ENV) or Path.home() / ".cache" / "nvfp4-gemv" / "sm100_verdict.json")


def _poison_b_rows(data):
    """b's rows 1..127 at the largest magnitude (code 7 in both nibbles) and their scales NaN or 448."""
    a, b, sfa, sfb, sfa_p, sfb_p, c = data
    b.view(torch.uint8)[1:] = 0x77
    sfb.view(torch.uint8)[1:] = 0x7F  # NaN
    sfb.view(torch.uint8)[1::2] = 0x7E  # 448
    from layouts.convert import plain_to_permuted

    sfb_p.copy_(plain_to_permuted(sfb))
    return data


def _poison_a_scale_padding(data):
    """NaN in the permuted scales of A's rows past M (the padding of the last 128-row block)."""
    a, b, sfa, sfb, sfa_p, sfb_p, c = data
    m = a.shape[0]
    from layouts.convert import plain_to_permuted

    padded = torch.full((-(-m // 128) * 128, sfa.shape[1], sfa.shape[2]), 0x7F, dtype=torch.uint8, device=a.device)
    padded[:m] = sfa.view(torch.uint8)
    sfa_p.view(torch.uint8).copy_(plain_to_permuted(padded))
    return data


def probes(device):
    """(name, data) of every probe, generated on `device`."""
    from submission.reference import generate_full_range, generate_input, one_hot_probe

    yield "contest data 7168x2048x4", generate_input(7168, 2048, 4, seed=1, device=device)
    for m, k, l in ((129, 320, 3), (1000, 1088, 2), (1, 64, 1), (255, 16384, 1)):  # noqa: E741
        yield f"full range {m}x{k}x{l}", generate_full_range(m, k, l, seed=m + k, device=device)
    for col in (0, 1, 15, 16, 63, 64, 255, 319):
        yield f"one-hot K column {col} of 129x320x2", one_hot_probe(129, 320, 2, col, seed=col, device=device)
    yield "NaN/huge in b rows 1..127", _poison_b_rows(generate_full_range(256, 512, 2, seed=7, device=device))
    yield "NaN in A's padded scale rows", _poison_a_scale_padding(generate_full_range(129, 256, 2, seed=8,
                                                                                      device=device))


def error_line(e: Exception) -> str:
    """An exception as one line: its type and the first line of its message."""
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def launch_and_check(launch, operands, check) -> tuple[bool, str]:
    """Fill c (the last operand) with NaN, launch, wait, and return `check(c)` as (ok, message); a launch that
    raises is a failure with its error as the message. The bring-up probes and dispatch's first-contact guard use it."""
    c = operands[-1]
    try:
        c.fill_(float("nan"))
        launch(*operands)
        if c.is_cuda:
            torch.cuda.synchronize(c.device)
        return check(c)
    except Exception as e:  # a variant that fails to launch or run is a failed variant
        return False, error_line(e)


def plain_scales(a, sfa_permuted, sfb_permuted):
    """(sfa, sfb) in the plain layout, from the permuted buffers (for a reference that reads plain scales)."""
    from layouts.convert import permuted_to_plain

    m, kb, _ = a.shape
    return (permuted_to_plain(sfa_permuted, m, 2 * kb).view(torch.float8_e4m3fn),
            permuted_to_plain(sfb_permuted, 128, 2 * kb).view(torch.float8_e4m3fn))


def run_bringup(select, variants, device, log=print):
    """Rows (variant, probe, "pass" or "FAIL: ...") for each variant on each probe. `select(variant, m, k, l)` gives a
    launcher (a, b, sfa_permuted, sfb_permuted, c); a launcher that raises fails the probe. Outputs are checked
    against the exact sum within the contest's tolerance plus the fp32 summation bound (any order of the block
    terms passes, a wrong block term does not; submission.reference.check_fp32_bound), NaN status included."""
    from submission.reference import check_fp32_bound

    rows = []
    for name, data in probes(device):
        a, b, sfa, sfb, sfa_p, sfb_p, c = data
        m, kb, l = a.shape  # noqa: E741
        for variant in variants:
            try:
                launch = select(variant, m, 2 * kb, l)
            except Exception as e:  # a variant that fails to compile fails the probe
                ok, msg = False, error_line(e)
            else:
                ok, msg = launch_and_check(launch, (a, b, sfa_p, sfb_p, c), lambda out: check_fp32_bound(out, data))
            rows.append((variant, name, "pass" if ok else f"FAIL: {msg}"))
        log(f"probe {name}: done")
    return rows


def verdict(rows, variants) -> list[str]:
    """The variants that passed every probe, in `variants` order."""
    failed = {v for v, _, result in rows if result != "pass"}
    return [v for v in variants if v not in failed]


def write_verdict(passed, device_name: str, path: Path | None = None) -> Path:
    path = path or verdict_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": device_name, "passed": passed}, indent=1))
    return path


def read_verdict(path: Path | None = None) -> list[str] | None:
    """The passing variants a bring-up recorded on this machine, or None if none was recorded."""
    path = path or verdict_path()
    try:
        return list(json.loads(path.read_text())["passed"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
