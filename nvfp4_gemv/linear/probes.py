"""Load probes of the W4A16 linear: its kernel with the block-scale loads, the x loads, or both taken out of the K
loop, to measure on a GPU what each kind of load costs the loop. The values a dropped load would bring are made from
a number the compiler cannot see (the step index masked by a pointer's sign bit, or x's row length shifted to zero),
so the decode, the scale conversion and the MMAs stay in the loop: a scale made from the step index is converted
every step, as a loaded one is; x made from the row length is the same every step, so its pairing (PRMT) leaves the
loop with its loads. The outputs are wrong by construction: probes are never dispatched, only timed beside the
kernel they come from (`load_probe_sweep`, `nvfp4-gemv probes`), and `tests/test_linear_probes.py` checks in the
sm_90a PTX that each drops exactly its loads.
"""

from __future__ import annotations

import math

import torch

PROBES = ("scales", "x", "both")  # which loads a probe drops
_MADE = {}


def probe_class(drop: str):
    """`LinearW4A16` with the loads `drop` names ("scales", "x" or "both") replaced by values made in registers."""
    if drop not in PROBES:
        raise ValueError(f"drop must be one of {PROBES}, got {drop!r}")
    cls = _MADE.get(drop)
    if cls is not None:
        return cls
    import cutlass
    import cutlass.cute as cute
    from cutlass import Uint32, const_expr

    from cute_kernels.linear_w4a16 import LinearW4A16

    no_scales, no_x = drop in ("scales", "both"), drop in ("x", "both")

    class LinearW4A16LoadProbe(LinearW4A16):
        @cute.jit
        def load_scales(self, rS, sf, s, rows, c):
            if const_expr(no_scales):
                # the scale bytes of a finite scale (e4m3 1.0 twice; e8m0 2^0, inside MX_FOLD's range), or'ed with
                # the step index masked by the scale pointer's sign bit (zero at run time): a value a step that the
                # compiler can neither fold nor hoist, so the scale's conversion stays in the loop (one per row, as
                # the rows' scales differ)
                step = Uint32(s) & Uint32(sf.iterator.toint() >> 63)
                for g in cutlass.range_constexpr(self.cfg.groups):
                    for h in cutlass.range_constexpr(2):
                        i = 2 * g + h
                        rS[h, g] = step | Uint32(0x3838 + 0x101 * i if self.cfg.fmt == "nvfp4" else 127 - i)
            else:
                LinearW4A16.load_scales(self, rS, sf, s, rows, c)

        @cute.jit
        def load_step(self, regs, x_words, w_words, sf, s, rows, toks, c, live):
            LinearW4A16.load_step(self, regs, x_words, w_words, sf, s, rows, toks, c, live)
            if const_expr(no_x):
                # x overwritten before any use, so its loads are dead and go: bf16 pairs near 1.0, or'ed with x's row
                # length shifted to zero (a runtime value the same every step)
                zero = Uint32(x_words.shape[1]) >> 31
                rX = regs[1]
                for t in cutlass.range_constexpr(self.cfg.token_tiles):
                    for e in cutlass.range_constexpr(16):
                        rX[e, t] = zero | Uint32(0x3F803F80 + 0x10001 * e)

    LinearW4A16LoadProbe.__name__ = LinearW4A16LoadProbe.__qualname__ = f"LinearW4A16Drop{drop.capitalize()}"
    _MADE[drop] = LinearW4A16LoadProbe
    return LinearW4A16LoadProbe


def probe_config(m: int, n: int, k: int, fmt: str, sms: int):
    """The launcher's config for a call (NVFP4 with a global scale, bf16 x, plain scales) with x as it comes and no
    block columns, the kernel the probes derive from."""
    from nvfp4_gemv.linear import kernels

    return kernels.config_for(m, n, k, fmt, "plain", "bf16", False, fmt == "nvfp4", sms,
                              sf_dtype="e4m3" if fmt == "nvfp4" else "u8", x_fragments=False, block_columns=False)


def load_probe_sweep(shapes=None, tokens=(1, 4), formats=("nvfp4",), csv_path=None, log=print):
    """µs per call of the kernel (`probe_config`'s) and of each probe of it, at every (shape, M, format), beside the
    read of the same bytes; graph timer as `bench`. The kernel's output is first checked bit for bit against
    `fp4_linear` forced to the same config, so the harness calls what the launcher calls."""
    from cute_kernels.compile import compile_kernel, raw_function
    from cute_kernels.linear_w4a16 import LinearW4A16
    from cute_kernels.targets import target
    from cute_kernels.tc_workspace import capability
    from nvfp4_gemv import bench as B
    from nvfp4_gemv.linear import bench as LB
    from nvfp4_gemv.linear import kernels

    device = torch.device("cuda", torch.cuda.current_device())
    tgt = target(capability(device))
    sms = kernels.sm_count(device.index)
    rows = []
    for n, k in shapes or LB.SHAPES:
        for fmt in formats:
            read = LB._time(lambda: B.stream_read_variant(LB.weight_bytes(n, k, fmt)))
            for m in tokens:
                cfg = probe_config(m, n, k, fmt, sms)
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                gs = torch.full((1,), 0.5, device="cuda")
                bias = torch.zeros(1, device="cuda", dtype=torch.bfloat16)
                pool = LB._pool(lambda: LB.random_weights(n, k, fmt), LB.weight_bytes(n, k, fmt))
                base = raw_function(compile_kernel(LinearW4A16, cfg, tgt, stream="torch"))
                w0, sf0 = pool[0]
                base(x, w0, sf0, y, gs, bias)
                want = torch.empty_like(y)
                # the scales as they are (float8 for NVFP4, as the op passes them): the launcher then picks this very
                # config, already compiled, instead of compiling its uint8 twin
                kernels.run(want, x, w0, sf0, fmt, "plain", gs if fmt == "nvfp4" else None, None,
                            x_fragments=False, block_columns=False)
                if not torch.equal(y, want):
                    raise AssertionError(f"{n}x{k} M={m} {fmt}: the probes' base kernel differs from fp4_linear's")
                variants = {"kernel": base}
                variants.update({f"drop {d}": raw_function(compile_kernel(probe_class(d), cfg, tgt, stream="torch"))
                                 for d in PROBES})
                for name, fn in variants.items():
                    t = LB._time(lambda: ((lambda d, fn=fn: fn(x, d[0], d[1], y, gs, bias)), pool))
                    rows.append(dict(n=n, k=k, m=m, fmt=fmt, variant=name, read_us=read, us=t, ratio=t / read,
                                     config=f"g{cfg.groups} kw{cfg.k_warps} t{cfg.token_tiles} p{cfg.k_parts} "
                                            f"r{cfg.max_registers}"))
                    log(f"{n:>6}x{k:<6} {m:>3} {fmt:>5} {read:7.2f} {t:7.2f} {t / read:6.3f}  {name}")
    if csv_path:
        LB.write_csv(rows, csv_path)
    for name in ("kernel", *(f"drop {d}" for d in PROBES)):
        r = [row["ratio"] for row in rows if row["variant"] == name and row["ratio"] == row["ratio"]]
        if r:
            log(f"geomean {name} / read: {math.exp(sum(map(math.log, r)) / len(r)):.3f} over {len(r)} points")
    return rows
