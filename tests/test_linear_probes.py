"""The W4A16 linear's load probes (nvfp4_gemv/linear/probes.py): each drops exactly the loads it names from the
kernel and keeps the W loads, the MMAs and the scale conversion (sm_90a PTX, compiled on the CPU); they are timing
instruments, so nothing that dispatches may reach them."""

import collections
import os
import re

import pytest

from registers import compiled_ptx

# (config fields, the PTX load of a block scale); W loads are L1::no_allocate, x loads default-cached v4.
CASES = [
    (dict(fmt="nvfp4", global_scale=True, k_warps=8, sf_dtype="e4m3"), "ld.global.nc.u16"),
    (dict(fmt="mxfp4", k_warps=8, mx_fold=True, max_registers=64), "ld.global.nc.u8"),
    (dict(fmt="nvfp4", global_scale=True, groups=2, k_warps=8, k_parts=2), "ld.global.nc.u16"),
]
W_LOAD, X_LOAD = "ld.global.L1::no_allocate.v4.b32", "ld.global.v4.b32"


def _ptx_loads(kw: dict, drop: str, dump) -> tuple[collections.Counter, int, int]:
    """(global loads by kind, MMAs, e4m3x2 conversions) in the sm_90a PTX of the kernel (drop "") or of a probe."""
    prelude = f"from nvfp4_gemv.linear.probes import probe_class\nLinearW4A16 = probe_class({drop!r})\n" if drop else ""
    dump.mkdir(parents=True)
    text = compiled_ptx("linear_w4a16", "LinearW4A16", kw, "sm_90a", dump, prelude=prelude)
    return (collections.Counter(re.findall(r"\bld\.global[.\w:]*", text)), text.count("mma.sync"),
            text.count("cvt.rn.f16x2.e4m3x2"))


@pytest.mark.slow
@pytest.mark.parametrize("kw,scale_load", CASES, ids=lambda v: "-".join(f"{k}={x}" for k, x in v.items())
                         if isinstance(v, dict) else v)
def test_each_probe_drops_its_loads(kw, scale_load, tmp_path):
    base, mma, cvt = _ptx_loads(kw, "", tmp_path / "base")
    assert base[W_LOAD] > 0 and base[X_LOAD] > 0 and base[scale_load] > 0 and mma > 0
    for drop in ("scales", "x", "both"):
        loads, n_mma, n_cvt = _ptx_loads(kw, drop, tmp_path / drop)
        assert n_mma == mma and loads[W_LOAD] == base[W_LOAD], drop  # the W loads and the MMAs stay
        assert loads[scale_load] == (0 if drop in ("scales", "both") else base[scale_load]), drop
        assert loads[X_LOAD] == (0 if drop in ("x", "both") else base[X_LOAD]), drop
        assert n_cvt == cvt, drop  # NVFP4's scales are still converted, one per row, as loaded ones are


def test_probe_names_and_no_dispatch():
    from nvfp4_gemv.linear import probes

    with pytest.raises(ValueError, match="drop must be one of"):
        probes.probe_class("w")
    # Nothing the op or the launcher runs imports the probes.
    for module in ("op", "kernels", "module", "prefill", "bench"):
        path = os.path.join(os.path.dirname(probes.__file__), f"{module}.py")
        assert "probes" not in open(path).read(), module
