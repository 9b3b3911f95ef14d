"""The W4A16 linear's CuTe DSL kernel (cute_kernels/linear_w4a16.py): PTX facts for sm_90a and sm_100a on the CPU,
the config choice, and on a GPU the numbers: full-range data against the fp32 reference (error at most twice the
reference's own rounding to the output dtype), one-hot probes of nibble order, sign and scale indexing per format,
odd N, K = 2880, M past 16, every split the dispatcher can choose, and bit-identical results over 100 runs."""

import dataclasses
import itertools
import json

import pytest
import torch

from nvfp4_gemv.linear import kernels
from nvfp4_gemv.linear.reference import dequantize
from registers import compiled_ptx

PTX_CASES = [
    dict(fmt="nvfp4", x_dtype="bf16"),
    dict(fmt="nvfp4", x_dtype="fp16", sf_kind="permuted", token_tiles=2, bias=True, global_scale=True, sf_dtype="e4m3"),
    dict(fmt="mxfp4", x_dtype="bf16", groups=2, k_warps=4),
    dict(fmt="mxfp4", x_dtype="fp16"),
    dict(fmt="mxfp4", x_dtype="fp16", mx_fold=True),
    dict(fmt="mxfp4", x_dtype="bf16", mx_fold=True, token_tiles=2, groups=2, k_warps=4),
    dict(fmt="mxfp4", x_dtype="bf16", mx_fold=True, mx_fold_redo=True),
    dict(fmt="mxfp4", x_dtype="fp16", mx_fold=True, mx_fold_redo=True, k_parts=2),
    dict(fmt="nvfp4", x_dtype="bf16", max_registers=48),
    dict(fmt="nvfp4", x_dtype="bf16", sf_kind="permuted", token_tiles=2, k_warps=16, k_splits=8),
    dict(fmt="nvfp4", x_dtype="bf16", k_parts=2),
    dict(fmt="mxfp4", x_dtype="fp16", k_parts=2, groups=2, k_warps=4, k_splits=2),
    dict(fmt="nvfp4", x_dtype="bf16", k_parts=2, acc_sets=2),
    dict(fmt="mxfp4", x_dtype="fp16", token_tiles=2, groups=2, k_warps=2, acc_sets=2),
    dict(fmt="nvfp4", x_dtype="bf16", k_parts=8, groups=2, k_warps=2, global_scale=True),
    dict(fmt="mxfp4", x_dtype="fp16", k_parts=4, token_tiles=2, groups=2, k_warps=4, mx_fold=True),
    dict(fmt="nvfp4", x_dtype="bf16", w_l2_prefetch=128),
    dict(fmt="mxfp4", x_dtype="fp16", mx_fold=True, w_l2_prefetch=256),
    dict(fmt="nvfp4", x_dtype="bf16", shifts_on_fma=True),
    dict(fmt="nvfp4", x_dtype="fp16", shifts_on_fma=True),
    dict(fmt="nvfp4", x_dtype="bf16", pdl=True, global_scale=True, bias=True),
    dict(fmt="mxfp4", x_dtype="fp16", mx_fold=True, mx_fold_redo=True, pdl=True, k_splits=2),
]


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    cache = {}

    def get(kw, arch):
        key = (json.dumps(kw, sort_keys=True), arch)
        if key not in cache:
            cache[key] = compiled_ptx("linear_w4a16", "LinearW4A16", kw, arch, tmp_path_factory.mktemp("ptx"))
        return cache[key]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("kw", PTX_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_ptx_facts(ptx, kw, arch):
    from cute_kernels.linear_w4a16 import LinearW4A16Config

    cfg = LinearW4A16Config(**kw)
    text = ptx(kw, arch)
    ab = "bf16" if cfg.mma_dtype == "bf16" else "f16"
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32"
    # Tensor cores fed from registers; one MMA per (8 codes x 2 rows) per token tile.
    n_mma = text.count(mma)
    assert n_mma % (8 * cfg.groups * cfg.token_tiles) == 0 and n_mma > 0
    # MXFP4: steps whose scales fit the scale fold (a warp vote a step) and the general path, both in the kernel; or
    # (mx_fold_redo) the warp's K on the fold and again on the general path where one vote after the loop finds a
    # scale outside its range. With fp16 x the general path's MMAs are bf16, x as hi + lo (twice the MMAs).
    assert ("vote.sync.all" in text) == (cfg.fmt == "mxfp4" and cfg.mx_fold and not cfg.mx_fold_redo)
    assert ("vote.sync.any" in text) == cfg.mx_fold_redo
    if cfg.split_x and cfg.mx_fold:
        n_bf16 = text.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32")
        assert n_bf16 > 0 and n_bf16 % (2 * 8 * cfg.groups * cfg.token_tiles) == 0
    # x's hi + lo split keeps an infinite x infinite: its lo (inf - inf) is taken to a finite number by a max.
    assert ("max.bf16x2" in text) == cfg.split_x
    # W streams once: 16-byte loads that skip L1, asking the L2 for w_l2_prefetch bytes on a miss where it is set;
    # nothing else takes that qualifier.
    hint = f".L2::{cfg.w_l2_prefetch}B" if cfg.w_l2_prefetch else ""
    assert f"ld.global.L1::no_allocate{hint}.v4" in text
    assert text.count(".L2::") == (text.count("ld.global.L1::no_allocate") if hint else 0)
    # The decode's right shifts as mul.hi by a power of two where shifts_on_fma asks; nothing else uses mul.hi.
    assert ("mul.hi.u32" in text) == cfg.shifts_on_fma
    # pdl: one wait before the first global load (every operand may come from the grid before) and one signal that
    # the next grid may launch; none without it.
    assert text.count("griddepcontrol.wait") == int(cfg.pdl)
    assert text.count("griddepcontrol.launch_dependents") == int(cfg.pdl)
    if cfg.pdl:
        assert text.index("griddepcontrol.wait") < text.index("ld.global")
        assert text.index("griddepcontrol.launch_dependents") < text.index("st.global")
    # A register cap reaches ptxas as the minimum CTAs per SM.
    if cfg.max_registers:
        assert f".minnctapersm {cfg.min_ctas_per_sm()}" in text
    else:
        assert ".minnctapersm" not in text
    # NVFP4 scales through the hardware e4m3 conversion; the f16 path decodes codes through it too.
    assert ("cvt.rn.f16x2.e4m3x2" in text) == (cfg.fmt == "nvfp4" or cfg.mma_dtype == "fp16")
    # MXFP4's fold multiplier, 2^(s - 127) over the placed code's power of two, is one integer multiply-add.
    if cfg.fmt == "mxfp4" and cfg.mx_fold:
        k = 0x00800080 if cfg.mma_dtype == "bf16" else 0x04000400
        assert str(k) in text or f"{k:#x}" in text.lower(), k
    # K split over a cluster: rank 0 reads the other CTAs' sums from their shared memory, between cluster barriers.
    assert (text.count("barrier.cluster.wait") == 2 and "ld.shared::cluster.f32" in text) == (cfg.k_splits > 1)
    # P K parts a row: the parts of a stored value meet by butterfly shuffles, log2(P) over the lanes of the MMA
    # rows and log2(P / 2) over the lanes of the columns, per (group, token tile, row half).
    shuffles = (cfg.k_parts.bit_length() - 1) + (cfg.k_parts // 2).bit_length() - 1 if cfg.k_parts > 1 else 0
    assert text.count("shfl.sync.bfly") == 2 * cfg.groups * cfg.token_tiles * shuffles
    # Deterministic: no float atomics anywhere.
    for line in text.splitlines():
        assert not (line.strip().startswith(("atom.", "red.")) and ".f32" in line), line


def test_pdl_is_a_launch_attribute_that_block_columns_and_experts_refuse():
    """pdl asks the launch for programmatic dependence (and the kernel waits: test_ptx_facts; with x in fragment
    order, test_x_fragments_ptx_facts); block columns and the routed kernel refuse it."""
    from cute_kernels.linear_w4a16 import LinearW4A16, LinearW4A16Config

    assert LinearW4A16(LinearW4A16Config(pdl=True)).launch_shape(4, 4096).get("use_pdl") is True
    assert "use_pdl" not in LinearW4A16(LinearW4A16Config()).launch_shape(4, 4096)
    assert LinearW4A16Config(pdl=True, x_fragments=True).pdl
    for other in (dict(block_columns=True), dict(experts="i32")):
        with pytest.raises(ValueError, match="pdl is for the default kernel"):
            LinearW4A16Config(pdl=True, **other)


def test_the_launcher_takes_pdl_wherever_the_kernel_allows():
    """Every config the launcher picks for the default kernel at up to 16 tokens is launched programmatically
    dependent (kernels.PDL), x in fragment order too (its x pass so launched); block columns, the routed kernel and
    calls past 16 tokens are not, and an override still turns it off."""
    for m in (1, 2, 4, 8, 12, 16, 17, 40):
        for n, k in [(4096, 4096), (8192, 28672), (2880, 2880), (256, 64), (520, 2880)]:
            for fmt in ("nvfp4", "mxfp4"):
                for xd in ("bf16", "fp16"):
                    cfg = kernels.config_for(m, n, k, fmt, "plain", xd, False, fmt == "nvfp4")
                    want = m <= kernels.PDL_MAX_TOKENS and not cfg.block_columns
                    assert cfg.pdl == want, (m, n, k, fmt, xd, cfg)
    fragments = kernels.config_for(8, 8192, 28672, "nvfp4", "plain", "bf16", False, True)
    assert fragments.x_fragments and fragments.pdl  # a two-grid call that takes it
    columns = kernels.config_for(1, 8192, 8192, "mxfp4", "plain", "fp16", False, False)
    assert columns.block_columns and not columns.pdl  # and one that does not
    assert not kernels.config_for(1, 4096, 4096, "nvfp4", "plain", "bf16", False, True, pdl=False).pdl
    assert not kernels.experts_config(4096, 4096, "nvfp4", "bf16", "i64", False, True, tokens=4, top_k=2,
                                      experts=8).pdl
    assert "(pdl)" in kernels.describe(1, 4096, 4096, "nvfp4", "bf16")


@pytest.mark.parametrize("token_tiles", [1, 2])
def test_choose_split_fills_one_wave(token_tiles):
    waves = []
    for n, k in [(6144, 4096), (28672, 4096), (4096, 14336), (8192, 28672), (5760, 2880), (4096, 7168),
                 (2048, 768), (10240, 8192)]:
        g, q, cap = kernels.choose_split(n, k, 132, token_tiles)
        warps = -(-n // (16 * g)) * q
        wave = kernels.resident_warps(g, q, token_tiles, cap) * 132
        assert warps <= wave
        steps = kernels.k_steps(k)
        # Each k-warp shortens the chain: a power of two against half as many, a widened count against one fewer.
        assert q == 1 or kernels.chain(steps, q) < kernels.chain(steps, q // 2 if q & (q - 1) == 0 else q - 1)
        if n * k >= 2**24:  # large enough to fill half a wave
            waves.append(warps / wave)
        # A cap is taken only where the uncapped split would not fit one wave, or (a widened split) at the model's
        # registers.
        assert not cap or warps > kernels.resident_warps(g, q, token_tiles) * 132 or (
            q & (q - 1) and cap == kernels.model_registers(g, token_tiles))
    assert min(waves) > 0.5  # every large example shape fills at least half a wave
    assert kernels.choose_split(1, 64, 132) in set(kernels.candidates(1))
    # Measured on the H200 (BENCHMARKS.md): K = 768 takes 8 k-warps (6 of 8 busy); 10240 x 8192 at M <= 8 fits one
    # wave with 8 k-warps at 48 registers.
    assert kernels.choose_split(2048, 768, 132, token_tiles)[:2] == (1, 8)
    assert kernels.choose_split(10240, 8192, 132, 1) == (1, 8, 48)
    # The register file bounds resident warps: two groups with 16 warps a CTA hold one CTA (16 warps) an SM.
    assert kernels.resident_warps(2, 8, 1) == 24 and kernels.resident_warps(1, 8, 1) == 32


def test_split_rules_measured_on_shapes_no_file_named(monkeypatch):
    """The split rules of `choose_split` and `k_splits_for` on points of docs/linear_h200_split_rule_check.csv and
    docs/linear_sweep_h200_random_splits.csv (graph-timed, x the read; the old rule's pick against this one's), with
    k-warps in powers of two as they were measured (widen_k_warps comes after: test_widen_k_warps)."""
    monkeypatch.setattr(kernels, "WIDEN_K_WARPS", False)

    def split(m, n, k, fmt="nvfp4", **override):
        c = kernels.config_for(m, n, k, fmt, "plain", "bf16", False, fmt == "nvfp4", 132, **override)
        return c.groups, c.k_warps, c.max_registers, c.k_parts, c.k_splits

    assert kernels.k_steps(544) == 5 and kernels.k_steps(64) == 1  # a partial last step counts
    # 16 k-warps where 4 in a cluster of 4 were taken: 889 x 3008 at M = 1, 1.56 against 2.04.
    assert split(1, 889, 3008) == (1, 16, 0, 2, 1)
    # 8 k-warps for 5 steps (two K parts of 576), where 4 were taken: 679 x 1152, 1.38 against 1.71.
    assert split(1, 679, 1152) == (1, 8, 0, 2, 1)
    # No cluster where one k-warp in 16 has a second step (17 steps): 170 x 4160, 10-20 % faster unclustered ...
    assert split(1, 170, 4160)[4] == 1 and split(8, 170, 4160)[4] == 1
    # ... and a cluster of 2 where most have two (28 steps): 256 x 7168, 5 % faster clustered.
    assert split(1, 256, 7168) == (1, 16, 0, 2, 2)
    # A register cap only with CAP_MIN_STEPS steps a k-warp: 10240 x 8192 at M = 1 (8 a k-warp) keeps it; 9642 x
    # 1024 (one step a k-warp) does not.
    assert split(1, 10240, 8192)[:3] == (1, 8, 48) and split(1, 9642, 1024)[2] == 0
    # Ties in warps go to balanced k-warps before more groups: 5760 x 2880 at M = 4 (12 steps), 4 k-warps of one
    # group (1.43-1.52 x the read) rather than 8 of two (1.61-1.73).
    assert split(4, 5760, 2880) == (1, 4, 0, 2, 1)
    # ... and to more groups when both are balanced: two groups at 16 tokens on large W (28672 x 4096: 1.95-2.28
    # at M = 12-16 against 2.44-2.90 for one group of 1 k-warp), measured with x in its own order.
    assert split(16, 28672, 4096, x_fragments=False)[:2] == (2, 2) and split(1, 28672, 4096)[:2] == (2, 4)
    # More than 4 tokens a CTA: k-warps 3/4 busy as well (642 x 1024 at M = 8: 8 k-warps, not 16).
    assert split(8, 642, 1024)[:2] == (1, 8)
    # 16 tokens a CTA: two groups with as short a chain, of at least TWO_GROUPS_MIN_CHAIN steps, in CTAs of at most
    # 4 k-warps filling 0.6 of a wave (docs/linear_sweep_h200_t2_groups.csv, docs/linear_h200_t2_groups_check.csv):
    # 11538 x 7936 (16 steps a k-warp) 2.21 x the read against 2.68 for one group; 24323 x 13952 2.10 against 2.76.
    # Not under half a wave (4042 x 14720: 2.56 against 2.32), nor at 8 steps (5989 x 7680: 2.52 against 2.34), nor
    # in CTAs of 8 k-warps (6082 x 11840 at 10 tokens: 18 % slower with two groups).
    for m in (12, 16):
        own = dict(x_fragments=False)  # as measured then
        assert split(m, 11538, 7936, **own)[:2] == (2, 4) and split(m, 24323, 13952, **own)[:2] == (2, 2)
        assert split(m, 4042, 14720, **own)[:2] == (1, 8) and split(m, 5989, 7680, **own)[:2] == (1, 8)
        assert split(m, 6082, 11840, **own)[:2] == (1, 8)
    # With x in fragment order (the rule takes it on these weights), the most warps of one wave, no two-group test:
    # 28672 x 4096 at 16 tokens 1.57 x the read with one group of 2 k-warps against 1.87 with two
    # (docs/linear_sweep_h200_m16_x_fragments.csv); 10240 x 8192 1.74 against 2.19; a tie in warps still goes to two
    # groups (8192 x 28672: 1.78 against 1.98 for one group of 4 k-warps; with k-warps widened, as dispatched, one
    # group holds more warps and takes it: test_one_group_rule).
    for m in (9, 12, 16):
        assert kernels.x_fragments_for(m, 28672, 4096, "nvfp4") and kernels.x_fragments_for(m, 10240, 8192, "mxfp4")
        assert split(m, 28672, 4096)[:2] == (1, 2) and split(m, 10240, 8192, "mxfp4")[:2] == (1, 4)
        assert split(m, 8192, 28672)[:2] == (2, 8)
        # MXFP4 with fp16 x takes the same rule with the scale fold (one group 0.82-0.89 of two's time at 10-16
        # tokens, docs/linear_h200_mx_fold_rules.csv), its registers capped at the model's 80.
        mx16 = kernels.config_for(m, 22315, 15680, "mxfp4", "plain", "fp16", False, False, 132)
        nv16 = kernels.config_for(m, 22315, 15680, "nvfp4", "plain", "fp16", False, True, 132)
        assert mx16.x_fragments and (mx16.groups, mx16.k_warps, mx16.max_registers) == (1, 2, 80)
        assert nv16.x_fragments and (nv16.groups, nv16.k_warps) == (1, 2)


def test_widen_k_warps(monkeypatch):
    """Any number of k-warps (widen_k_warps) where the power-of-two split's grid holds under WIDEN_BELOW_WARPS warps
    an SM: the shortest chain that still fits one wave, capped at the model's registers; never a longer chain, never
    past one wave. Graph-timed on the H200 (nvfp4_gemv.linear.bench.k_warps_ab, docs/linear_h200_k_warps_*.csv)."""

    def cfg(m, n, k, fmt="nvfp4", xd="bf16"):
        return kernels.config_for(m, n, k, fmt, "plain", xd, False, fmt == "nvfp4", 132)

    # 4096 x 14336 at 16 tokens: 8 k-warps (15.5 warps an SM, 14 steps each) -> 14 (8 steps), 0.89 of the time.
    c = cfg(16, 4096, 14336)
    assert (c.groups, c.k_warps, c.max_registers, c.x_fragments) == (1, 14, 72, True) and c.min_ctas_per_sm() == 2
    # 17664 x 18688 at 16 tokens: 2 -> 3 k-warps, 0.91; 2880 x 2880 at 8 tokens: 8 -> 12, 0.93-0.95.
    assert cfg(16, 17664, 18688).k_warps == 3 and cfg(8, 2880, 2880).k_warps == 12
    # Not where the grid already holds 19 warps an SM: 10240 x 8192 at 16 tokens stays at 4 k-warps (5: 1.05 x).
    assert cfg(16, 10240, 8192).k_warps == 4 and cfg(16, 5120, 18624).k_warps == 8
    # Not the block-columns kernel.
    assert kernels.widen_k_warps(2048, 4096, 132, 1, "mxfp4", True, "", (1, 4, 0)) == (1, 4, 0)
    for (n, k), m, fmt, xd in itertools.product(
        [(4096, 14336), (2880, 2880), (17664, 18688), (2368, 6912), (1216, 1088), (9152, 768), (181, 8320),
         (28672, 4096), (8192, 28672), (640, 2048)], (1, 2, 4, 8, 12, 16), ("nvfp4", "mxfp4"), ("bf16", "fp16")):
        with monkeypatch.context() as mp:  # the widening alone: the one-group rule (test_one_group_rule) set aside
            mp.setattr(kernels, "ONE_GROUP_FRAGMENTS", ())
            now = cfg(m, n, k, fmt, xd)
            mp.setattr(kernels, "WIDEN_K_WARPS", False)
            pow2 = cfg(m, n, k, fmt, xd)
        if now == pow2:
            continue
        # k_parts_for weighs the widened split too, so two K parts a row may give way to one (1216 x 1088 at 8 and
        # 16 tokens: 8 k-warps of two parts -> 9 of one, 0.96 and 0.86 of the time); with the same parts, the same
        # groups and tiles with more k-warps and a shorter chain.
        if now.k_parts == pow2.k_parts:
            steps = kernels.k_steps(k // now.k_parts)
            assert now.k_warps > pow2.k_warps and (now.groups, now.token_tiles) == (pow2.groups, pow2.token_tiles)
            assert kernels.chain(steps, now.k_warps * now.k_splits) < kernels.chain(
                steps, pow2.k_warps * pow2.k_splits), (n, k, m, fmt, xd)
        frag = kernels.fragments_key(xd, now.mx_fold) if now.x_fragments else ""
        assert now.max_registers in (pow2.max_registers, kernels.model_registers(now.groups, now.token_tiles, "", frag))
        rows = kernels._split(m, n, k, 132, now.k_parts, now.token_tiles, "", frag)[0]  # the rows the split sees
        assert kernels.grid_warps(rows, now.groups, now.k_warps) <= 132 * kernels.resident_warps(
            now.groups, now.k_warps, now.token_tiles, now.max_registers, "", frag)


def test_one_group_rule():
    """Where 16-token CTAs with bf16 x in fragment order, or MXFP4's scale fold with either x, would be two groups (a
    tie in warps) on a grid of fewer than WIDEN_BELOW_WARPS warps an SM, the launcher takes the one-group split
    (ONE_GROUP_FRAGMENTS), which holds one wave of more warps; NVFP4 with fp16 x and other points are as before. And
    the shapes `bench.drawn_shapes` draws for such checks: reproducible, aligned, in range."""
    from nvfp4_gemv.linear import bench

    def pair(m, n, k, fmt="nvfp4", xd="bf16"):
        now = kernels.config_for(m, n, k, fmt, "plain", xd, False, fmt == "nvfp4", 132)
        with bench._kernels_patched(ONE_GROUP_FRAGMENTS=()):
            before = kernels.config_for(m, n, k, fmt, "plain", xd, False, fmt == "nvfp4", 132)
        return before, now

    before, now = pair(16, 8192, 28672)
    assert (before.groups, before.k_warps, before.max_registers) == (2, 8, 0)
    assert (now.groups, now.k_warps, now.max_registers, now.token_tiles) == (1, 7, 72, 2)
    before16, now16 = pair(16, 8192, 28672, xd="fp16")
    assert before16 == now16
    shapes = bench.drawn_shapes(60, 1205)
    assert shapes == bench.drawn_shapes(60, 1205) and len(set(shapes)) == 60
    assert all(n % 8 == 0 and k % 64 == 0 and 1024 <= n <= 32768 and 1024 <= k <= 28672 for n, k in shapes)
    # MXFP4's fold with fp16 x (14336 x 4096 at 16 tokens: 0.88 of the two-group split's time on an H100)
    before16, now16 = pair(16, 14336, 4096, "mxfp4", "fp16")
    assert (before16.groups, before16.k_warps, before16.max_registers) == (2, 4, 128)
    assert (now16.groups, now16.k_warps, now16.max_registers, now16.mx_fold) == (1, 3, 80, True)
    found = {"bf16": 0, "fp16": 0}
    for (n, k), m, fmt, xd in itertools.product(list(bench.SHAPES) + shapes, (9, 12, 16), ("nvfp4", "mxfp4"),
                                                ("bf16", "fp16")):
        before, now = pair(m, n, k, fmt, xd)
        if before == now:
            continue
        assert xd == "bf16" or now.mx_fold, (n, k, m, fmt, xd)
        found[xd] += 1
        assert (before.groups, before.token_tiles, now.groups, now.token_tiles) == (2, 2, 1, 2)
        assert now.x_fragments and now.k_parts == 1
        frag = kernels.fragments_key(xd, now.mx_fold)
        warps, wave = kernels.grid_warps(n, 1, now.k_warps), 132 * kernels.resident_warps(
            1, now.k_warps, 2, now.max_registers, "", frag)
        assert kernels.grid_warps(n, 2, before.k_warps) < kernels.WIDEN_BELOW_WARPS * 132 and warps <= wave
    assert found["bf16"] >= 10 and found["fp16"] >= 10, found


def test_thirty_two_tokens_rule():
    """Past 16 tokens with bf16 x in fragment order, CTAs of 32 tokens where they take no more token tiles than
    16-token ones (ceil(M / 16) even); 16 tokens or fewer, odd counts, fp16 x and x as it is keep what they had."""
    for m in (17, 24, 32, 49, 64, 96, 113, 127, 128, 1024):
        assert kernels.token_tiles_for(m, 8192, 28672, "bf16", True) == 4, m
        assert kernels.token_tiles_for(m, 8192, 28672, "fp16", True) == 2, m
        assert kernels.token_tiles_for(m, 8192, 28672, "bf16", False) == 2, m
    for m in (33, 48, 65, 80, 97, 112, 999):
        assert kernels.token_tiles_for(m, 8192, 28672, "bf16", True) == 2, m
    for m in range(1, 17):
        assert kernels.token_tiles_for(m, 8192, 28672, "bf16", True) == kernels.token_tiles_for(m, 8192, 28672)
    weights = ((8192, 28672), (28672, 4096), (4096, 4096), (5760, 2880))
    for (n, k), fmt in itertools.product(weights, ("nvfp4", "mxfp4")):
        for m in (17, 32, 64, 96, 127):
            cfg = kernels.config_for(m, n, k, fmt, "plain", "bf16", False, fmt == "nvfp4", 132)
            assert cfg.token_tiles == 4 and cfg.x_fragments and cfg.k_parts == 1, (n, k, m, fmt)
            assert kernels.config_for(m, n, k, fmt, "plain", "fp16", False, False, 132).token_tiles == 2
        assert kernels.config_for(48, n, k, fmt, "plain", "bf16", False, fmt == "nvfp4", 132).token_tiles == 2
    for n, k in ((2880, 2880), (2048, 768)):  # x as it is
        assert kernels.config_for(32, n, k, "nvfp4", "plain", "bf16", False, True, 132).token_tiles == 2


def test_bind_keeps_a_plan_per_token_tile_count(monkeypatch):
    """Past 32 tokens the token tiles depend on ceil(M / 16)'s parity: bind keeps a plan for each."""
    made = []

    def plan_for(m, n, k, *args, **override):
        made.append(kernels.config_for(m, n, k, "nvfp4", "plain", "bf16", False, False).token_tiles)
        return (lambda *a: None), None, None, None

    monkeypatch.setattr(kernels, "plan_for", plan_for)
    launch = kernels.bind(8192, 28672, torch.device("cpu"), torch.bfloat16, torch.uint8, "nvfp4", "plain", False,
                          False)
    for m in (64, 48, 96, 80, 33, 127):
        launch(torch.empty(m, 8192), torch.empty(m, 28672), None, None, None, None)
    assert made == [4, 2]


def test_resident_ctas_count_the_register_files_partitions():
    """The sub-partition count of `kernels.resident_ctas` against the sm_90a compiles it was read from: a cap tells
    ptxas the CTAs, and it allows 16384 / (32 x the warps one partition holds), rounded down to 8."""
    from nvfp4_gemv.dispatch import ctas_per_sm

    part = kernels.resident_ctas

    differ = {r: [w for w in range(1, 17) if part(r, w) != ctas_per_sm(r, w)] for r in (48, 56, 64, 72, 80, 96, 128)}
    assert differ == {48: [2, 3, 6, 7, 14], 56: [], 64: [], 72: [], 80: [1, 5], 96: [1, 3, 7], 128: []}
    assert (ctas_per_sm(80, 5), part(80, 5)) == (5, 4)  # five CTAs: 25 warps, 7 on a partition, 72 registers
    assert (ctas_per_sm(96, 7), part(96, 7)) == (3, 2)  # three: 21 warps, 6 on a partition, 80 registers


def test_small_weights_split_9_to_16_tokens_over_two_ctas():
    """At 9-16 tokens a W of at most SPLIT_TOKENS_MAX_WEIGHT elements takes two 8-token CTAs along M, and the split
    is chosen for twice the rows (docs/linear_sweep_h200_m16_t1b.csv); larger W, M <= 8 and M > 16 are as before."""
    cap = kernels.SPLIT_TOKENS_MAX_WEIGHT
    for n, k in [(512, 2048), (2048, 768), (2880, 2880), (1024, 4096), (896, 4864), (128, 16384)]:
        assert n * k <= cap
        for m in (9, 12, 16):
            cfg = kernels.config_for(m, n, k, "nvfp4", "plain", "bf16", False, True)
            assert cfg.token_tiles == 1, (n, k, m)
            assert (cfg.groups, cfg.k_warps, cfg.max_registers) == kernels.choose_split(2 * n, k, 132, 1)
        assert kernels.config_for(17, n, k, "nvfp4", "plain", "bf16", False, True).token_tiles == 2
        assert kernels.token_tiles_for(8, n, k) == 1
    for n, k in [(4096, 4096), (5760, 2880), (2048, 7168), (8192, 28672)]:
        assert n * k > cap and kernels.token_tiles_for(16, n, k) == 2, (n, k)
    assert "token_tiles=1" in kernels.describe(16, 512, 2048, "nvfp4", "bf16")
    assert "token_tiles=2" in kernels.describe(16, 4096, 4096, "nvfp4", "bf16")


def test_two_k_parts_at_3_4_tokens_and_on_thin_or_uneven_grids():
    """k_parts_for: two K parts at 3-4 tokens; at 1-2 only where one part's grid is under half a wave or its CTAs
    leave the SMs' last round under 90 % full (docs/linear_h200_k_parts.csv); at 5-16 only where one part takes a
    cluster (docs/linear_h200_k_parts_tokens.csv); never past 16. Two parts take one token tile, and the split is
    chosen for twice the rows of half the K."""
    for n, k in [(8192, 28672), (10240, 8192), (4096, 14336), (6144, 4096), (28672, 4096), (5760, 2880)]:
        assert [kernels.k_parts_for(m, n, k, 132) for m in (1, 2, 3, 4, 5, 8, 16)] == [1, 1, 2, 2, 1, 1, 1], (n, k)
    for n, k in [(1536, 2048), (2880, 2880), (2048, 768), (3072, 8192)]:  # thin, or 192 CTAs on 132 SMs
        assert [kernels.k_parts_for(m, n, k, 132) for m in (1, 2, 4, 5, 16)] == [2, 2, 2, 1, 1], (n, k)
    for n, k in [(256, 4096), (512, 7168), (128, 16384)]:  # one part takes a cluster at 5-16 tokens
        assert kernels.config_for(8, n, k, "nvfp4", "plain", "bf16", False, False, k_parts=1).k_splits > 1
        assert [kernels.k_parts_for(m, n, k, 132) for m in (1, 4, 5, 8, 16, 17)] == [2, 2, 2, 2, 2, 1], (n, k)
    # Where the two-part split would be CTAs of one 8-row group and 2 warps (each re-reading x), one part stays.
    assert kernels.choose_split(2 * 18944, 3584 // 2, 132, 1)[:2] == (1, 2)
    assert [kernels.k_parts_for(m, 18944, 3584, 132) for m in (1, 3, 4)] == [1, 1, 1]
    cfg = kernels.config_for(4, 8192, 28672, "nvfp4", "plain", "bf16", False, True)
    assert (cfg.k_parts, cfg.token_tiles, cfg.tokens_per_cta, cfg.rows_per_cta) == (2, 1, 4, 8 * cfg.groups)
    assert (cfg.groups, cfg.k_warps, cfg.max_registers) == kernels.choose_split(2 * 8192, 28672 // 2, 132, 1)
    assert kernels.config_for(48, 256, 1024, "nvfp4", "plain", "bf16", False, False, k_parts=2).token_tiles == 1
    assert "k_parts=2" in kernels.describe(3, 4096, 4096, "nvfp4", "bf16")
    assert "k_parts" not in kernels.describe(1, 4096, 4096, "nvfp4", "bf16")
    from cute_kernels.linear_w4a16 import LinearW4A16Config

    for bad in (dict(k_parts=3), dict(k_parts=0)):
        with pytest.raises(ValueError, match="k_parts"):
            LinearW4A16Config(**bad)


def test_one_config_per_token_class():
    """bind keeps one plan per token class (M <= 2, 3-4, 5-8, 9-12, 13-16, 17-32, and past 32 by ceil(M / 16)'s
    parity): config_for gives every M of a class the same config, over N, K and both formats."""
    for n in (1, 128, 200, 512, 896, 2048, 2880, 4096, 8192, 28672):
        for k in (64, 768, 2880, 4096, 14336):
            for fmt in ("nvfp4", "mxfp4"):
                for lo, hi in ((1, 2), (3, 4), (5, 8), (9, 12), (13, 16), (17, 32)):
                    got = {kernels.config_for(m, n, k, fmt, "plain", "bf16", False, False) for m in range(lo, hi + 1)}
                    assert len(got) == 1, (n, k, fmt, lo, hi, got)


def test_k_splits_only_where_few_rows_leave_the_gpu_idle():
    """A cluster shares K only where choose_split's warps fill at most half a wave; then it shortens each warp's K
    steps and keeps the grid within half a wave (docs/linear_sweep_h200_k_splits.csv)."""
    for n, k in [(6144, 4096), (28672, 4096), (4096, 14336), (8192, 28672), (4096, 7168), (10240, 8192),
                 (2048, 768), (1536, 2048)]:
        for t in (1, 2):
            assert kernels.k_splits_for(n, k, 132, t, *kernels.choose_split(n, k, 132, t)) == 1, (n, k, t)
    for n, k in [(128, 16384), (256, 7168), (64, 4096), (512, 14336)]:
        for t in (1, 2):
            g, q, cap = kernels.choose_split(n, k, 132, t)
            s = kernels.k_splits_for(n, k, 132, t, g, q, cap)
            assert s > 1, (n, k, t)
            assert 2 * -(-n // (16 * g)) * q * s <= kernels.resident_warps(g, q, t) * 132  # at most half a wave
            assert -(-(k // 128) // (q * s)) < -(-(k // 128) // q)  # fewer steps a warp
    assert "k_splits=8 (a cluster)" in kernels.describe(5, 128, 16384, "nvfp4", "bf16", k_parts=1)
    assert "k_parts=2 k_splits=4 (a cluster)" in kernels.describe(1, 128, 16384, "nvfp4", "bf16")
    with pytest.raises(ValueError, match="k_splits"):
        kernels.LinearW4A16Config(k_splits=3)
    with pytest.raises(ValueError, match="k_splits"):
        kernels.LinearW4A16Config(k_warps=8, max_registers=48, k_splits=2)


@pytest.mark.slow
def test_register_table_matches_ptxas(tmp_path):
    """kernels.REGISTERS bounds what ptxas gives each (groups, token_tiles) for sm_90a (k_warps 4 and 8, rounded up
    to the allocation step of 8), and is reached by one of them: the resident-warp model is neither loose nor short.
    kernels.CAPS are met exactly."""

    from registers import allocated_registers

    def allocated(g, t, kw, cap=0, sets=1, extra=""):
        return allocated_registers(
            "linear_w4a16", "LinearW4A16",
            f"groups={g}, token_tiles={t}, k_warps={kw}, max_registers={cap}, acc_sets={sets}{extra}",
            tmp_path / f"g{g}t{t}kw{kw}c{cap}a{sets}{len(extra)}",
        )

    for (g, t), table in kernels.REGISTERS.items():
        got = [allocated(g, t, kw) for kw in (4, 8)]
        assert max(got) == table, ((g, t), got, table)
    # Two accumulator sets are taken only where the table already counts what they need (kernels.acc_sets_for).
    for kw in (4, 8):
        assert allocated(2, 2, kw, sets=kernels.acc_sets_for(2, 2, "nvfp4", "bf16")) <= kernels.REGISTERS[(2, 2)]
    for (g, t), cap in kernels.CAPS.items():
        for kw in (4, 8):
            assert allocated(g, t, kw, cap) == cap, ((g, t), kw, cap)
    # MXFP4's scale fold (fp16 x, as dispatched) holds two loops: within the table with mx_fold_cap's cap.
    for (g, t), table in kernels.REGISTERS.items():
        cap = kernels.mx_fold_cap(g, 4, t)
        got = allocated(g, t, 4, cap, extra=", fmt='mxfp4', x_dtype='fp16', mx_fold=True")
        assert got <= table and (cap == 0 or got <= cap), ((g, t), cap, got, table)
    # ... one group of one tile with two K parts or x in fragment order too, which take 72-80 registers uncapped
    # (one CTA an SM fewer than the model counts: one-wave grids became two, BENCHMARKS.md "The fold's registers").
    from registers import allocation, compiled_registers_all

    for kw in (4, 8):
        cap = kernels.mx_fold_cap(1, kw, 1)
        for fragments in (False, True):
            regs = compiled_registers_all(
                "linear_w4a16_fragments" if fragments else "linear_w4a16",
                "LinearW4A16Fragments" if fragments else "LinearW4A16",
                f"fmt='mxfp4', x_dtype='fp16', mx_fold=True, k_warps={kw}, k_parts=2, max_registers={cap}, "
                f"x_fragments={fragments}", tmp_path / f"fold_p2_kw{kw}_xf{fragments}", "linear_w4a16",
                "LinearW4A16Config",
            )
            assert allocation(max(regs)) <= cap == kernels.REGISTERS[(1, 1)], (kw, fragments, regs, cap)
    # x in fragment order takes the same splits: its main kernel (and its first) must fit the same table.

    for (g, t), table in kernels.REGISTERS.items():
        regs = compiled_registers_all(
            "linear_w4a16_fragments", "LinearW4A16Fragments",
            f"groups={g}, token_tiles={t}, k_warps=8, acc_sets={kernels.acc_sets_for(g, t, 'nvfp4', 'bf16')}, "
            "x_fragments=True", tmp_path / f"fragments_g{g}t{t}", "linear_w4a16", "LinearW4A16Config",
        )
        assert len(regs) == 2 and allocation(max(regs)) <= table, ((g, t), regs, table)
    # ... and within kernels.FRAGMENT_REGISTERS where that counts fewer (both formats; with fp16 x, MXFP4 takes the
    # fold, counted at REGISTERS), with the cap the launcher gives them (FRAGMENT_CAPS), with and without a global
    # scale (NVFP4 with fp16 x takes 78 uncapped without one, 65 with one).
    for (g, t, x_dtype), table in kernels.FRAGMENT_REGISTERS.items():
        for fmt, gs in (("nvfp4", False), ("nvfp4", True), ("mxfp4", False)):
            if kernels.mx_fold_for(fmt, x_dtype):
                continue
            for kw in (2, 4):
                cap = kernels.fragments_cap(g, kw, t, x_dtype)
                regs = compiled_registers_all(
                    "linear_w4a16_fragments", "LinearW4A16Fragments",
                    f"fmt={fmt!r}, x_dtype={x_dtype!r}, groups={g}, token_tiles={t}, k_warps={kw}, "
                    f"global_scale={gs}, acc_sets={kernels.acc_sets_for(g, t, fmt, x_dtype)}, x_fragments=True, "
                    f"max_registers={cap}",
                    tmp_path / f"fragments_{fmt}_{x_dtype}_g{g}t{t}kw{kw}gs{gs}", "linear_w4a16",
                    "LinearW4A16Config",
                )
                assert allocation(max(regs)) <= table, ((g, t, x_dtype, fmt, kw, gs), regs, table)


@pytest.mark.slow
def test_dispatched_configs_fit_the_resident_warp_model(tmp_path):
    """Every kernel config the launcher dispatches on a grid of shapes (the bench's 12, four long-K or few-row ones),
    1-16, 24 and 64 tokens (32-token CTAs past 16), both formats and x dtypes (NVFP4 with a global scale, as
    checkpoints have it), gets from ptxas (sm_90a) no more registers than let an SM hold the CTAs the resident-warp
    model counts for it: the split is chosen to fill one wave, and one CTA an SM fewer can make that two (MXFP4's fold
    uncapped at one group of one tile did: 8192 x 28672 at 4 tokens, fp16 x, 2.15 x the read against 1.34 capped). And
    none spills in its K loop (sm_90a SASS) but at the register caps taken for warps and timed as they spill: CAPS'
    one-group cap (1 spill instruction in the loop with bf16 x, 4 with fp16) and the scale fold's (mx_fold_cap: 2-25
    in the fold's loop; the general loop after it, which a warp runs only to redo its K, up to 54);
    BENCHMARKS.md, "Fewer registers at 16 tokens a CTA"."""
    from nvfp4_gemv.linear.bench import SHAPES

    configs = {}
    for (n, k), m, fmt, xd in itertools.product(
        list(SHAPES) + [(512, 25344), (3584, 18048), (32768, 24448), (181, 8320)], (1, 2, 3, 4, 6, 8, 12, 16, 24, 64),
        ("nvfp4", "mxfp4"), ("bf16", "fp16"),
    ):
        c = kernels.config_for(m, n, k, fmt, "plain", xd, False, fmt == "nvfp4", kernels.H200_SMS)
        configs.setdefault(config_key(c), c)
    assert_configs_fit(configs.values(), tmp_path)


def config_key(c) -> tuple:
    """What sets a linear config's registers and loop: one compile stands for every config of the same key."""
    return (c.fmt, c.x_dtype, c.groups, c.token_tiles, c.k_parts, c.acc_sets, c.x_fragments, c.mx_fold,
            c.block_columns, c.max_registers, c.k_warps, c.k_splits > 1, c.experts, c.expert_group, c.expert_runs)


def assert_configs_fit(configs, tmp_path):
    """Each config's registers (sm_90a, ptxas) let an SM hold the CTAs the resident-warp model counts, and its K loop
    spills nothing but at the register caps taken for warps (test_dispatched_configs_fit_the_resident_warp_model)."""
    from concurrent.futures import ThreadPoolExecutor

    from nvfp4_gemv.dispatch import ctas_per_sm
    from registers import allocation, compiled_registers_all, k_loop_spills

    configs = list(configs)

    def registers(i_c):
        i, c = i_c
        kernel = kernels.kernel_class(c)[0]
        mod, cls = kernel.__module__.rsplit(".", 1)[1], kernel.__name__
        args = ", ".join(f"{f.name}={getattr(c, f.name)!r}" for f in dataclasses.fields(c))
        regs = compiled_registers_all(mod, cls, args, tmp_path / f"c{i}", "linear_w4a16", "LinearW4A16Config")
        return allocation(max(regs)), k_loop_spills(tmp_path / f"c{i}")

    with ThreadPoolExecutor(2) as pool:  # each compile runs in its own child process
        got = list(pool.map(registers, enumerate(configs)))
    short, spilled = [], []
    for c, (regs, spills) in zip(configs, got):
        counted = kernels.resident_warps(c.groups, c.k_warps, c.token_tiles, c.max_registers,
                                         c.fmt if c.block_columns else "",
                                         kernels.fragments_key(c.x_dtype, c.mx_fold) if c.x_fragments else "")
        if ctas_per_sm(regs, c.k_warps) * c.k_warps < counted:
            short.append((regs, counted, c))
        assert spills, c  # the K loop was found
        capped_for_warps = c.max_registers in kernels.CAPS.values() or (c.mx_fold and c.max_registers)
        # MXFP4's fold holds the fold's loop first and the general one, which a warp runs only where a scale leaves
        # the fold's range (the rest of its K after a vote a step, or all of it again), after it: its spills are paid
        # on that path only (up to 54 under the fold's caps).
        loops = spills[:1] if c.mx_fold else spills
        if max(loops) > (25 if capped_for_warps else 0) or max(spills) > 64:
            spilled.append((spills, c))
    assert not short, short
    assert not spilled, spilled


@pytest.mark.slow
def test_column_register_table_matches_ptxas(tmp_path):
    """kernels.COLUMN_REGISTERS bounds what ptxas gives the block-columns main kernel with fp16 x for sm_90a (the
    largest count of the call's two kernels; k_warps 4 and 8, rounded up to the allocation step of 8), and is
    reached."""
    from registers import allocation, compiled_registers_all

    for (fmt, g), table in kernels.COLUMN_REGISTERS.items():
        got = [allocation(max(compiled_registers_all(
            "linear_w4a16_columns", "LinearW4A16Columns",
            f"fmt={fmt!r}, block_columns=True, groups={g}, k_warps={kw}, x_dtype='fp16'", tmp_path / f"{fmt}g{g}kw{kw}",
            "linear_w4a16", "LinearW4A16Config"))) for kw in (4, 8)]
        assert max(got) == table, (fmt, g, got, table)


def test_two_accumulator_sets_only_where_registers_are_already_counted_at_128():
    """acc_sets_for: two sets for 16-token CTAs of two groups (kernels.REGISTERS[(2, 2)] is 128 already), except
    MXFP4 with fp16 x; one set at every other (groups, token tiles), and an override of either wins."""
    from cute_kernels.linear_w4a16 import LinearW4A16Config

    big = kernels.config_for(16, 8192, 28672, "nvfp4", "plain", "fp16", False, True)
    assert (big.groups, big.token_tiles, big.acc_sets, big.x_fragments) == (2, 2, 2, True)
    assert "acc_sets=2" in kernels.describe(16, 8192, 28672, "nvfp4", "fp16")
    one = kernels.config_for(16, 8192, 28672, "nvfp4", "plain", "bf16", False, True)  # ONE_GROUP_FRAGMENTS
    assert (one.groups, one.token_tiles, one.acc_sets, one.x_fragments) == (1, 2, 1, True)
    own = kernels.config_for(16, 28672, 4096, "nvfp4", "plain", "bf16", False, True, x_fragments=False)
    assert (own.groups, own.token_tiles, own.acc_sets) == (2, 2, 2)
    mx = kernels.config_for(16, 28672, 4096, "mxfp4", "plain", "fp16", False, False)
    assert (mx.groups, mx.token_tiles, mx.acc_sets) == (2, 2, 1)
    assert kernels.config_for(16, 28672, 4096, "mxfp4", "plain", "bf16", False, False, x_fragments=False).acc_sets == 2
    for m in (1, 2, 4, 8):
        assert kernels.config_for(m, 28672, 4096, "nvfp4", "plain", "bf16", False, True).acc_sets == 1, m
    assert kernels.config_for(16, 6144, 4096, "nvfp4", "plain", "bf16", False, True).acc_sets == 1  # one group
    assert kernels.config_for(16, 28672, 4096, "nvfp4", "plain", "bf16", False, True, groups=1).acc_sets == 1
    assert kernels.config_for(16, 28672, 4096, "nvfp4", "plain", "bf16", False, True, acc_sets=1).acc_sets == 1
    with pytest.raises(ValueError, match="acc_sets"):
        LinearW4A16Config(acc_sets=3)


def test_too_large_for_int32_offsets_is_refused_before_launch():
    from cute_kernels.linear_w4a16 import LinearW4A16

    assert LinearW4A16.can_implement(16, 28672, 8192) and LinearW4A16.can_implement(1, 1, 64)
    assert not LinearW4A16.can_implement(1, 2**20, 2**14)  # N·K = 2^34
    assert not LinearW4A16.can_implement(2**18, 4096, 2**14)  # M·K = 2^32
    assert not LinearW4A16.can_implement(2**16, 2**15, 64)  # M·N = 2^31
    assert not LinearW4A16.can_implement(1, 1, 96)  # K % 64
    # kernels.run checks sizes before anything touches a device (meta tensors hold no memory).
    x = torch.empty(2**18, 2**14, dtype=torch.bfloat16, device="meta")
    w = torch.empty(1, 2**13, dtype=torch.uint8, device="meta")
    with pytest.raises(ValueError, match="too large"):
        kernels.run(None, x, w, w, "nvfp4", "plain", None, None)


def test_past_the_grid_limit_m_is_launched_in_chunks(monkeypatch):
    """MXFP4 with fp16 x stays on the fp4 kernels at every M; past M_CHUNK rows the launcher splits the call along M,
    so no grid's token dimension passes 65535 CTAs (checked on meta tensors, with the compiled kernel stubbed)."""
    from cute_kernels.linear_w4a16 import LinearW4A16

    calls = []

    def plan_for(m, n, k, *args, **override):
        cfg = kernels.config_for(m, n, k, "mxfp4", "plain", "fp16", False, False)
        grid = LinearW4A16(cfg).launch_shape(m, n)["grid"]
        assert max(grid[1:]) <= 65535 and -(-m // 8) <= 65535  # the main grid, and the x-fragment pass's
        return (lambda x2d, w, sf, out2d, gs, b: calls.append((x2d.shape[0], out2d.shape[0])), None, None, None)

    monkeypatch.setattr(kernels, "plan_for", plan_for)
    m, n, k = 2 * kernels.M_CHUNK + 40, 8, 64
    x = torch.empty(m, k, dtype=torch.float16, device="meta")
    y = torch.empty(m, n, dtype=torch.float16, device="meta")
    w = torch.empty(n, k // 2, dtype=torch.uint8, device="meta")
    sf = torch.empty(n, k // 32, dtype=torch.uint8, device="meta")
    kernels.run(y, x, w, sf, "mxfp4", "plain", None, None)
    assert calls == [(kernels.M_CHUNK, kernels.M_CHUNK)] * 2 + [(40, 40)]
    assert kernels.M_CHUNK % 16 == 0
    calls.clear()
    kernels.run(y[:kernels.M_CHUNK], x[:kernels.M_CHUNK], w, sf, "mxfp4", "plain", None, None)
    assert calls == [(kernels.M_CHUNK, kernels.M_CHUNK)]
    assert f"3 launches of at most {kernels.M_CHUNK} rows" in kernels.describe(m, n, k, "mxfp4", torch.float16)
    assert "launches of" not in kernels.describe(kernels.M_CHUNK, n, k, "mxfp4", torch.float16)
    # The size check is each chunk's: x of 2^32 bytes and more is fine where a chunk's offsets fit in int32.
    k = 8192
    assert not LinearW4A16.can_implement(m, n, k) and LinearW4A16.can_implement(kernels.M_CHUNK, n, k)
    calls.clear()
    kernels.run(y, torch.empty(m, k, dtype=torch.float16, device="meta"), torch.empty(n, k // 2, dtype=torch.uint8,
                device="meta"), torch.empty(n, k // 32, dtype=torch.uint8, device="meta"), "mxfp4", "plain", None, None)
    assert calls == [(kernels.M_CHUNK, kernels.M_CHUNK)] * 2 + [(40, 40)]


def test_decode_rows_keep_their_plan(monkeypatch):
    """A bound launch plans once a token class and keeps a call's plan by M up to DECODE_ROWS rows, so that a decode
    step's call asks neither the prefill rule nor the size check again; past DECODE_ROWS every call asks both (checked
    on meta tensors, with the compiled kernel stubbed)."""
    from nvfp4_gemv.linear import prefill

    planned, calls, asked = [], [], []

    def plan_for(m, n, k, *args, **override):
        planned.append(m)
        return (lambda x2d, w, sf, out2d, gs, b: calls.append(x2d.shape[0]), None, None, None)

    takes = prefill.takes
    monkeypatch.setattr(kernels, "plan_for", plan_for)
    monkeypatch.setattr(prefill, "takes", lambda m, *args: (asked.append(m), takes(m, *args))[1])
    n, k, past = 64, 128, kernels.DECODE_ROWS + 1
    assert past < prefill.PREFILL_MIN_TOKENS
    launch = kernels.bind(n, k, torch.device("meta"), torch.bfloat16, torch.uint8, "nvfp4", "plain", False, False)
    w = torch.empty(n, k // 2, dtype=torch.uint8, device="meta")
    sf = torch.empty(n, k // 16, dtype=torch.uint8, device="meta")
    rows = [1, 1, 2, 1, 16, 16, past, past]
    for m in rows:
        launch(torch.empty(m, n, dtype=torch.bfloat16, device="meta"),
               torch.empty(m, k, dtype=torch.bfloat16, device="meta"), w, sf, None, None)
    assert calls == rows
    assert planned == [1, 16, past]  # 1 and 2 tokens are one token class
    assert asked == [1, 2, 16, past, past]


def test_register_cap_rules():
    from cute_kernels.linear_w4a16 import LinearW4A16Config

    assert LinearW4A16Config(k_warps=8, max_registers=48).min_ctas_per_sm() == 5  # 5 x 256 threads x 48 <= 64K
    # Not a multiple of 8; a CTA of one warp would need 42 CTAs an SM (32 at most); 16 warps at 248 fit no 2 CTAs.
    for bad in (dict(max_registers=44), dict(k_warps=1, max_registers=48), dict(k_warps=16, max_registers=248)):
        with pytest.raises(ValueError, match="max_registers"):
            LinearW4A16Config(**bad)
    assert all(LinearW4A16Config(groups=g, k_warps=q, max_registers=c) for g, q, c in kernels.candidates(1))
    cfg = kernels.config_for(1, 10240, 8192, "nvfp4", "plain", "bf16", False, False)
    assert cfg.max_registers == 48 and "max_registers=48" in kernels.describe(1, 10240, 8192, "nvfp4", "bf16")


def test_config_for_token_tiles_and_describe():
    assert kernels.config_for(8, 4096, 4096, "nvfp4", "plain", "bf16", False, False).token_tiles == 1
    assert kernels.config_for(9, 4096, 4096, "nvfp4", "swizzled", "fp16", True, True).token_tiles == 2
    assert kernels.config_for(9, 4096, 4096, "nvfp4", "swizzled", "fp16", True, True).sf_kind == "permuted"
    text = kernels.describe(40, 4096, 4096, "mxfp4", torch.float16)
    assert "scale folded" in text and "x as bf16 hi+lo" in text and "token tiles" in text


def test_mx_fold_rule(monkeypatch):
    """MXFP4 takes the scale fold (mx_fold_for): with fp16 x a vote a step, its registers capped at the resident-warp
    model's (one group of one tile included: with two K parts or x in fragment order it takes 72-80 uncapped); with
    bf16 x the whole K then a redo where a scale does not fit (mx_fold_redo), from 6 MB of codes at 1-16 tokens, at
    the general path's own split and not under its register cap below MX_FOLD_MIN_CAP (with x in fragment order,
    MX_FOLD_MIN_CAP_FRAGMENTS). NVFP4 and block columns (fp16 x only) do not."""
    for m, n, k in [(1, 6144, 4096), (4, 6144, 4096), (16, 28672, 4096), (16, 4096, 14336), (1, 300, 4096),
                    (4, 8192, 28672), (4, 4096, 7168), (8, 8192, 28672)]:
        cfg = kernels.config_for(m, n, k, "mxfp4", "plain", "fp16", False, False)
        assert cfg.mx_fold and not cfg.mx_fold_redo and cfg.mma_dtype == "fp16" and cfg.split_x
        if cfg.k_splits == 1:  # the fold's kernels are counted at REGISTERS, with x in fragment order too
            assert cfg.max_registers == kernels.REGISTERS[(cfg.groups, cfg.token_tiles)], cfg
        assert "a step's scales fit" in kernels.describe(m, n, k, "mxfp4", torch.float16)
        cfg = kernels.config_for(m, n, k, "nvfp4", "plain", "fp16", False, False)
        assert not cfg.mx_fold and cfg.mma_dtype == "fp16"
    # bf16 x: where the fold is taken, the split (and anything else the rules choose) is the general path's
    folded = 0
    for (n, k), m in itertools.product([(6144, 4096), (28672, 4096), (4096, 14336), (8192, 28672), (5760, 2880),
                                        (4096, 4096), (2880, 2880), (10240, 8192), (2048, 768)],
                                       (1, 2, 3, 4, 6, 8, 9, 12, 16, 24)):
        cfg = kernels.config_for(m, n, k, "mxfp4", "plain", "bf16", False, False)
        with monkeypatch.context() as mp:
            mp.setitem(kernels.MX_FOLD_MIN_CODE_BYTES, "bf16", 1 << 62)
            general = kernels.config_for(m, n, k, "mxfp4", "plain", "bf16", False, False)
        assert not general.mx_fold and cfg.mma_dtype == ("fp16" if cfg.block_columns else "bf16")
        # naming the fold off keeps every other rule: the general path's config, x in fragment order included
        assert kernels.config_for(m, n, k, "mxfp4", "plain", "bf16", False, False, mx_fold=False) == general
        if cfg.mx_fold:
            folded += 1
            assert cfg.mx_fold_redo and n * k // 2 >= 6 << 20 and m <= 16, cfg
            assert dataclasses.replace(cfg, mx_fold=False, mx_fold_redo=False) == dataclasses.replace(
                general, max_registers=cfg.max_registers), (cfg, general)
            assert cfg.max_registers in (general.max_registers, kernels.mx_fold_cap(cfg.groups, cfg.k_warps,
                                                                                     cfg.token_tiles))
            assert not 0 < general.max_registers < (kernels.MX_FOLD_MIN_CAP_FRAGMENTS if cfg.x_fragments else
                                                    kernels.MX_FOLD_MIN_CAP)
            assert "the warp's K again in bf16" in kernels.describe(m, n, k, "mxfp4", torch.bfloat16)
        else:
            assert cfg == general
    assert folded >= 30
    for n, k in [(5760, 2880), (4096, 4096), (6144, 4096), (2880, 2880), (2048, 768), (3072, 2048)]:
        assert kernels.mx_fold_for("mxfp4", "bf16", n, k) == (n * k // 2 >= 6 << 20)
    # Under a split's cap below 56 registers the fold's loop spills: the general path there (10240 x 8192, 1 token),
    # unless x is in fragment order (4 tokens: the fold at 0.98 of the general path's time on an H100).
    cfg = kernels.config_for(1, 10240, 8192, "mxfp4", "plain", "bf16", False, False)
    assert 0 < cfg.max_registers < kernels.MX_FOLD_MIN_CAP and not cfg.mx_fold and not cfg.x_fragments
    cfg = kernels.config_for(4, 10240, 8192, "mxfp4", "plain", "bf16", False, False)
    assert 0 < cfg.max_registers < kernels.MX_FOLD_MIN_CAP and cfg.mx_fold and cfg.x_fragments
    assert not kernels.config_for(1, 8192, 28672, "mxfp4", "plain", "fp16", False, False).mx_fold  # block columns
    assert kernels.config_for(1, 8192, 28672, "mxfp4", "plain", "bf16", False, False).mx_fold_redo  # not columns
    assert not kernels.config_for(1, 8192, 28672, "mxfp4", "plain", "fp16", False, False).mx_fold  # block columns
    assert not kernels.config_for(4, 6144, 4096, "mxfp4", "plain", "fp16", False, False, mx_fold=False).mx_fold
    forced = kernels.config_for(4, 2048, 768, "mxfp4", "plain", "bf16", False, False, mx_fold=True)
    assert forced.mx_fold and forced.mx_fold_redo
    # A split the launcher never chooses (4 groups, which REGISTERS does not count) runs uncapped, not a KeyError.
    four = kernels.config_for(1, 203, 960, "mxfp4", "plain", "fp16", False, False, k_parts=8, groups=4, k_warps=2)
    assert four.mx_fold and four.max_registers == 0
    for bad in (dict(fmt="nvfp4"), dict(block_columns=True)):
        with pytest.raises(ValueError, match="mx_fold"):
            kernels.LinearW4A16Config(**{"fmt": "mxfp4", "mx_fold": True, **bad})
    with pytest.raises(ValueError, match="mx_fold_redo"):
        kernels.LinearW4A16Config(fmt="mxfp4", mx_fold_redo=True)


def test_block_columns_rule():
    """block_columns_for: MXFP4 with fp16 x at 1-2 tokens on weights of COLUMNS_MIN_WEIGHT_BYTES and more whose
    columns split is one-group CTAs; never bf16 x (its whole-K scale fold is faster), NVFP4, 3+ tokens, smaller
    weights, or a sweep's named config."""
    big = (5120, 8192)  # 20 MB of codes, the threshold with fp16 x
    assert kernels.COLUMNS_MIN_WEIGHT_BYTES == {"fp16": big[0] * big[1] // 2}
    for m in (1, 2):
        cfg = kernels.config_for(m, *big, "mxfp4", "plain", "fp16", False, False)
        assert cfg.block_columns and cfg.groups == 1 and cfg.k_parts == 1 and cfg.mma_dtype == "fp16"
        assert cfg.tokens_per_cta == 2 and cfg.output_factor() == 2.0**6
        assert "block columns" in kernels.describe(m, *big, "mxfp4", torch.float16)
        assert not kernels.config_for(m, 4096, 8192, "mxfp4", "plain", "fp16", False, False).block_columns
        for shape in (big, (8192, 28672), (16384, 16384)):  # the scale fold or the general path, as its rules say
            assert not kernels.config_for(m, *shape, "mxfp4", "plain", "bf16", False, False).block_columns
    assert kernels.config_for(1, 8192, 28672, "mxfp4", "plain", "fp16", True, False).block_columns
    assert not kernels.config_for(3, *big, "mxfp4", "plain", "fp16", False, False).block_columns
    assert not kernels.config_for(1, *big, "nvfp4", "plain", "fp16", False, False).block_columns
    for xd in ("bf16", "fp16"):
        assert not kernels.config_for(1, 6144, 4096, "mxfp4", "plain", xd, False, False).block_columns
    assert not kernels.config_for(1, 2048, 768, "mxfp4", "plain", "fp16", False, False).block_columns
    assert not kernels.block_columns_for(1, 12288, 4096, "mxfp4", 132, "fp16")  # its columns split is two-group CTAs
    assert not kernels.config_for(1, *big, "mxfp4", "plain", "fp16", False, False, k_warps=4).block_columns
    assert kernels.config_for(1, 64, 64, "nvfp4", "plain", "bf16", False, False, block_columns=True).block_columns
    with pytest.raises(ValueError, match="block_columns"):
        kernels.LinearW4A16Config(block_columns=True, k_parts=2)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("kw", [dict(fmt="nvfp4", x_dtype="bf16"),
                                dict(fmt="mxfp4", x_dtype="fp16", token_tiles=2, groups=2, k_warps=4),
                                dict(fmt="nvfp4", x_dtype="bf16", token_tiles=2, pdl=True)],
                         ids=["nvfp4-bf16", "mxfp4-fp16-t2g2", "nvfp4-bf16-t2-pdl"])
def test_x_fragments_ptx_facts(tmp_path, arch, kw):
    """x in fragment order compiles for both archs as two kernels: the x pass (one 16-byte load, the B pairs by
    PRMT, one 16-byte store a thread; it lets the main kernel launch at once) and the main kernel, which waits for
    it before its K loop and forms no x pair itself (its only PRMT are the scale's, two a row group and step). With
    pdl the pass waits for the grid before it, ahead of its load and store, and the main kernel signals the next grid
    after its K loop, before its store."""
    from cute_kernels.linear_w4a16 import LinearW4A16Config

    cfg = LinearW4A16Config(x_fragments=True, **kw)
    text = compiled_ptx("linear_w4a16_fragments", "LinearW4A16Fragments", dict(x_fragments=True, **kw), arch,
                        tmp_path, "linear_w4a16", "LinearW4A16Config")
    entries = text.split(".entry ")[1:]
    assert len(entries) == 2
    prep, main = sorted(entries, key=lambda e: "mma.sync" in e)
    assert "griddepcontrol.launch_dependents" in prep and "mma.sync" not in prep
    assert prep.count("prmt.b32") == 4 and "ld.global.v4" in prep and "st.global.v4" in prep
    assert main.count("griddepcontrol.wait") == 1 and prep.count("griddepcontrol.wait") == int(cfg.pdl)
    assert main.count("griddepcontrol.launch_dependents") == int(cfg.pdl)
    if cfg.pdl:
        assert prep.index("griddepcontrol.wait") < min(prep.index("ld.global"), prep.index("st.global"))
        assert main.index("griddepcontrol.launch_dependents") < main.index("st.global")
    ab = "bf16" if cfg.mma_dtype == "bf16" else "f16"
    assert main.count(f"mma.sync.aligned.m16n8k16.row.col.f32.{ab}.{ab}.f32") > 0
    (tmp_path / "plain").mkdir()
    plain = compiled_ptx("linear_w4a16", "LinearW4A16", kw, arch, tmp_path / "plain")
    assert main.count("prmt.b32") < plain.count("prmt.b32")


def test_x_fragments_rule():
    """x_fragments_for: never at 1-2 tokens; from 28 MB of codes at 3-4 tokens, 8 MB at 5-8, 6 MB at 9 and more (the
    cuts between the measured losses and wins), for either x dtype and format; one answer a token class; not with
    block columns or a config override."""
    mb = 1 << 20
    cases = [(1, 8192, 28672, False), (2, 28672, 4096, False), (3, 4096, 14336, True), (4, 4096, 7168, False),
             (3, 28 * mb // 4096 * 2 - 2, 4096, False), (5, 4096, 4096, True), (8, 5760, 2880, False),
             (9, 5760, 2880, True), (16, 2880, 2880, False), (40, 4096, 4096, True), (16, 6 * mb // 1024, 2048, True)]
    for m, n, k, want in cases:
        assert kernels.x_fragments_for(m, n, k, "nvfp4") is want, (m, n, k)
        assert kernels.config_for(m, n, k, "mxfp4", "plain", "bf16", False, False).x_fragments is want, (m, n, k)
    assert not kernels.config_for(1, 8192, 28672, "mxfp4", "plain", "bf16", False, False).x_fragments  # columns
    for m in (3, 8, 9):
        assert kernels.config_for(m, 8192, 28672, "mxfp4", "plain", "fp16", False, False).x_fragments, m
    assert not kernels.config_for(8, 8192, 28672, "nvfp4", "plain", "bf16", False, False, k_warps=4).x_fragments
    assert kernels.config_for(8, 64, 64, "nvfp4", "plain", "bf16", False, False, x_fragments=True).x_fragments
    with pytest.raises(ValueError, match="x_fragments"):
        kernels.LinearW4A16Config(block_columns=True, x_fragments=True)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_block_columns_ptx_facts(tmp_path, arch, fmt):
    """The block-columns call is two kernels, the x pass first and the main kernel launched to overlap it (PDL):
    the main kernel waits on the grid dependency, multiplies f16 (8 MMAs a 128-K step, W and x in f16) and puts
    the block scales on fp32 sums (no packed HMUL2 of codes by scales)."""
    text = compiled_ptx("linear_w4a16_columns", "LinearW4A16Columns", dict(fmt=fmt, block_columns=True, k_warps=8),
                        arch, tmp_path, "linear_w4a16", "LinearW4A16Config")
    assert text.count(".entry") == 2 and "griddepcontrol.wait" in text and "griddepcontrol.launch_dependents" in text
    assert text.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") % 8 == 0
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16" not in text
    assert "mul.rn.f16x2" not in text and "mul.rn.bf16x2" not in text
    assert "cvt.rn.f16x2.f32" in text  # the x pass: bf16 x times 2^-e into f16
    assert ("ld.global.nc.u32" in text) == (fmt == "nvfp4")


# ---------------------------------------------------------------- on a GPU

E2M1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6]


def _operands(n, k, fmt, layout, full=True, seed=0):
    from test_linear_reference import swizzle

    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    if fmt == "nvfp4":
        lo, hi = (0, 0x7E) if full else (0x28, 0x40)  # every finite e4m3 (subnormals included) / moderate
        plain = torch.randint(lo, hi + 1, (n, k // 16), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)
        scale = swizzle(plain) if layout == "swizzled" else plain
    else:
        lo, hi = (90, 165) if full else (118, 130)
        plain = scale = torch.randint(lo, hi, (n, k // 32), dtype=torch.uint8, generator=g)
    return w, scale, plain


def _cuda_operands(n, k, fmt, layout, dtype):
    """Full-range W and scales on the GPU, the plain scales (for the reference), a global scale for NVFP4 and a
    bias."""
    w, scale, plain = _operands(n, k, fmt, layout)
    gs = torch.tensor([0.37], device="cuda") if fmt == "nvfp4" else None
    return w.cuda(), scale.cuda(), plain, gs, torch.randn(n).to(dtype).cuda()


def _unit_scales(n, k, fmt, layout):
    """Scales of 1.0 in `layout` (NVFP4 e4m3 0x38, MXFP4 e8m0 127): with codes and small-integer x every partial sum
    is exact, so configs that add the same products in another order must agree bit for bit."""
    from test_linear_reference import swizzle

    if fmt == "nvfp4":
        unit = torch.full((n, k // 16), 0x38, dtype=torch.uint8).view(torch.float8_e4m3fn)
        return swizzle(unit) if layout == "swizzled" else unit
    return torch.full((n, k // 32), 127, dtype=torch.uint8)


def _run(x, w, scale, fmt, layout, gs=None, bias=None, **override):
    y = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    kernels.run(y, x, w.view(torch.uint8), scale.view(torch.uint8), fmt, layout, gs, bias, **override)
    return y


def _check(y, x, w, plain, fmt, gs=None, bias=None):
    """Max error at most twice the reference's own rounding to the output dtype (plus fp32-accumulation noise)."""
    wd = dequantize(w.cpu(), plain.cpu(), fmt, "plain", None if gs is None else gs.cpu()).to(x.device)
    ref32 = x.float() @ wd.T + (0 if bias is None else bias.float())
    ref_err = (ref32.to(x.dtype).float() - ref32).abs().max().item()
    err = (y.float() - ref32).abs().max().item()
    noise = 1e-6 * (x.float().abs() @ wd.abs().T).max().item()
    assert err <= 2 * ref_err + noise, (err, ref_err, noise)


LAYOUTS = [("nvfp4", "plain"), ("nvfp4", "swizzled"), ("mxfp4", "plain")]
DTYPES = [torch.bfloat16, torch.float16]


@pytest.mark.gpu
def test_past_the_grid_limit_on_the_gpu():
    """M_CHUNK + 24 rows of fp16 x on MXFP4 (the fp4 kernels at every M): two launches, both right, the last one's
    rows the same bits as a call of those rows alone."""
    m, n, k = kernels.M_CHUNK + 24, 24, 128
    w, scale, plain = _operands(n, k, "mxfp4", "plain")
    w, scale = w.cuda(), scale.cuda()
    x = torch.randn(m, k).to(torch.float16).cuda()
    y = _run(x, w, scale, "mxfp4", "plain")
    _check(y, x, w, plain, "mxfp4")
    assert torch.equal(y[kernels.M_CHUNK:], _run(x[kernels.M_CHUNK:], w, scale, "mxfp4", "plain"))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k,override", [(1, 4096, 4096, {}), (16, 520, 2880, dict(token_tiles=2)),
                                            (4, 256, 4160, dict(k_parts=2)), (8, 384, 4096, dict(k_splits=2)),
                                            (3, 200, 7168, dict(groups=2, k_warps=4, acc_sets=2)),
                                            (8, 384, 4096, dict(x_fragments=True)),
                                            (12, 520, 2880, dict(x_fragments=True, token_tiles=2))], ids=str)
def test_pdl_waits_for_the_grid_before(fmt, layout, m, n, k, override):
    """The default kernel launched programmatically dependent (pdl) gives the same bits as a plain launch, and so
    does x in fragment order with its x pass launched so. In a CUDA graph, with the grid just before the call writing
    x, W, its scales, the global scale or the bias (each in turn, the others written earlier), or reading y, the call
    reads what was written and leaves y for the reader: its waits come before every global load and store."""
    import functools

    dtype = torch.bfloat16
    w, scale, plain, gs, bias = _cuda_operands(n, k, fmt, layout, dtype)
    x = torch.randn(m, k).to(dtype).cuda()
    kw = dict(fmt=fmt, layout=layout, gs=gs, bias=bias, **override)
    y = _run(x, w, scale, **kw)
    _check(y, x, w, plain, fmt, gs, bias)
    assert torch.equal(_run(x, w, scale, pdl=False, **kw), y)  # the launcher may set pdl itself (kernels.PDL)
    assert torch.equal(_run(x, w, scale, pdl=True, **kw), y)
    w2, scale2, plain2 = (t.cuda() for t in _operands(n, k, fmt, layout, seed=1))  # other codes and scales
    x2, bias2 = torch.randn(m, k).to(dtype).cuda(), torch.randn(n).to(dtype).cuda()
    gs2 = None if gs is None else torch.tensor([0.81], device="cuda")
    want = _run(x2, w2, scale2, fmt=fmt, layout=layout, gs=gs2, bias=bias2, **override)
    _check(want, x2, w2, plain2, fmt, gs2, bias2)
    originals, srcs = dict(x=x, w=w, scale=scale, gs=gs, bias=bias), dict(x=x2, w=w2, scale=scale2, gs=gs2, bias=bias2)
    for last in ("x", "w", "scale", "gs", "bias", "y"):
        if last == "gs" and gs is None:
            continue  # MXFP4 has no global scale
        dsts = {name: None if t is None else t.clone() for name, t in originals.items()}
        out, seen = torch.full_like(y, 7.0), torch.empty_like(y)
        steps = {name: functools.partial(dst.copy_, srcs[name]) for name, dst in dsts.items() if dst is not None}
        steps["y"] = functools.partial(seen.copy_, out)  # y's old values, read
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for name in [name for name in steps if name != last] + [last]:
                steps[name]()
            kernels.run(out, dsts["x"], dsts["w"].view(torch.uint8), dsts["scale"].view(torch.uint8), fmt, layout,
                        dsts["gs"], dsts["bias"], pdl=True, **override)
        graph.replay()
        torch.cuda.synchronize()
        assert (seen == 7.0).all(), last
        assert torch.equal(out, want), last


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("m,n,k", [(1, 256, 1024), (2, 130, 2880), (4, 1000, 4096), (8, 17, 192), (9, 384, 7168),
                                   (16, 4096, 512), (17, 1, 64), (40, 200, 2048)])
def test_full_range_against_reference(fmt, layout, dtype, m, n, k):
    w, scale, plain = _operands(n, k, fmt, layout)
    x = torch.randn(m, k).to(dtype).cuda()
    gs = torch.tensor([0.37], device="cuda") if fmt == "nvfp4" else None
    bias = torch.randn(n).to(dtype).cuda()
    y = _run(x, w.cuda(), scale.cuda(), fmt, layout, gs, bias)
    _check(y, x, w.cuda(), plain, fmt, gs, bias)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("scales", ["fit", "low", "mixed", "full", "zero_blocks", "zero_blocks_and_low"])
@pytest.mark.parametrize("m,n,k,override", [(1, 300, 4096, {}), (4, 256, 2880, {}), (8, 200, 7168, {}),
                                            (16, 512, 4160, {}), (12, 640, 8192, dict(x_fragments=True)),
                                            (16, 384, 4096, dict(groups=2, k_warps=4)),
                                            (4, 512, 4096, dict(x_fragments=True)),
                                            (6, 300, 2880, dict(x_fragments=True)),
                                            (16, 520, 4096, dict(x_fragments=True, groups=1, k_warps=3, k_parts=1,
                                                                 token_tiles=2))], ids=str)
def test_mxfp4_scale_fold(dtype, scales, m, n, k, override):
    """MXFP4's scale fold (one multiply a placed pair where the scales are in range: bf16 on the whole-K fold from
    2^-63 to 2^17, f16 from 2^-20 to 2^9; mx_fold_window) against the reference and against the general path on
    every step (mx_fold False): scales all in range (up to its top, and its lowest 27), in range but for a few
    blocks scattered over K and rows (warps leave the fold in mid-K), over the full test range (most warps
    general), and in range but for all-zero blocks (codes +0 and -0) with scales below the fold's (e8m0 byte 0 among
    them, as an amax rule gives a zero block), alone (with bf16 x the fold's sums stand: mx_fold_zero_blocks) and
    with three nonzero blocks below it too (the warp's K redone). With bf16 x both paths multiply the same exact
    products in the same order, the fold's 2^-16 of them put back exactly: bit-identical."""
    from cute_kernels.linear_w4a16 import mx_fold_window

    g = torch.Generator().manual_seed(k + m)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    key = "bf16" if dtype == torch.bfloat16 else "fp16"
    _, _, least, most = mx_fold_window(key, kernels.mx_fold_redo_for(key))  # bf16: 2^-63 to 2^17, fp16 2^-20 to 2^9
    lo, hi = {"fit": (max(least, 112), most), "low": (least, least + 26), "mixed": (118, 128),
              "full": (40, 165)}.get(scales, (max(least, 112), min(most, 130)))
    sf = torch.randint(lo, hi + 1, (n, k // 32), dtype=torch.uint8, generator=g)
    if scales.startswith("zero_blocks"):
        zero = torch.rand(n, k // 32, generator=g) < 0.02
        zero[0, 0] = zero[n - 1, k // 32 - 1] = True
        sf[zero] = torch.randint(0, least, (int(zero.sum()),), dtype=torch.uint8, generator=g)
        sf[0, 0] = 0
        signs = torch.randint(0, 2, w.shape, dtype=torch.uint8, generator=g) * 0x88  # +0 and -0 codes
        w.view(n, k // 32, 16)[zero] = signs.view(n, k // 32, 16)[zero]
        if scales == "zero_blocks_and_low":
            for r, col, byte in ((1, 3, 0), (n // 2, k // 64, 5), (n - 2, k // 32 - 2, least - 1)):
                sf[r, col] = byte
                w[r, col * 16] = 0x21  # codes 0.5 and 1
    if scales == "mixed":
        rows = torch.randint(0, n, (6,), generator=g)
        cols = torch.randint(k // 64, k // 32, (6,), generator=g)  # the second half of K
        sf[rows, cols] = torch.tensor([90, 150, 160, 100, 140, 95], dtype=torch.uint8)
    x = torch.randn(m, k, generator=g).to(dtype).cuda()
    y = _run(x, w.cuda(), sf.cuda(), "mxfp4", "plain", mx_fold=True, **override)
    y_general = _run(x, w.cuda(), sf.cuda(), "mxfp4", "plain", mx_fold=False, **override)
    _check(y, x, w.cuda(), sf, "mxfp4")
    _check(y_general, x, w.cuda(), sf, "mxfp4")
    if dtype == torch.bfloat16:
        assert torch.equal(y, y_general)
    assert torch.equal(y, _run(x, w.cuda(), sf.cuda(), "mxfp4", "plain", mx_fold=True, **override))


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,dtype,want", [
    (16, 14336, 4096, torch.float16, dict(groups=1, k_warps=3, max_registers=80)),  # ONE_GROUP_FRAGMENTS, the fold
    (12, 8144, 4416, torch.float16, dict(groups=1, k_warps=6, max_registers=80)),
    (4, 10240, 8192, torch.bfloat16, dict(k_parts=2, max_registers=48)),  # MX_FOLD_MIN_CAP_FRAGMENTS
    (4, 18488, 8768, torch.float16, dict(groups=2, k_warps=3, k_parts=2, max_registers=72)),  # UNCAPPED_FRAGMENTS
    (8, 10240, 8192, torch.float16, dict(groups=2, k_warps=8, k_parts=1, max_registers=72)),
], ids=str)
def test_mxfp4_scale_fold_dispatched(m, n, k, dtype, want):
    """The fold where the launcher takes it on a split the fold's A/B runs chose (one group of 16 tokens; bf16's fold
    under the 48-register cap with x in fragment order; fp16's fold with x in fragment order, no 48-register cap):
    the config as dispatched, against the reference with
    checkpoint-like scales and a few out of the fold's range, and with bf16 x bit-identical to the general path."""
    cfg = kernels.config_for(m, n, k, "mxfp4", "plain", "bf16" if dtype == torch.bfloat16 else "fp16", False, False)
    assert cfg.mx_fold and cfg.x_fragments and all(getattr(cfg, f) == v for f, v in want.items()), cfg
    g = torch.Generator().manual_seed(n + m)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    sf = torch.randint(112, 129, (n, k // 32), dtype=torch.uint8, generator=g)
    sf[torch.randint(0, n, (8,), generator=g), torch.randint(0, k // 32, (8,), generator=g)] = 150
    x = torch.randn(m, k, generator=g).to(dtype).cuda()
    w, sfc = w.cuda(), sf.cuda()
    y = _run(x, w, sfc, "mxfp4", "plain")
    _check(y, x, w, sf, "mxfp4")
    assert torch.equal(y, _run(x, w, sfc, "mxfp4", "plain"))
    if dtype == torch.bfloat16:
        general = kernels.config_for(m, n, k, "mxfp4", "plain", "bf16", False, False, mx_fold=False)
        assert dataclasses.replace(cfg, mx_fold=False, mx_fold_redo=False) == general
        assert torch.equal(y, _run(x, w, sfc, "mxfp4", "plain", mx_fold=False))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("scales", ["fit", "full", "zero_blocks"])
def test_mxfp4_scale_fold_with_inf_and_nan_in_x(dtype, scales):
    """x holding inf and NaN, on the fold and on the general path (with fp16 x, x as a bf16 hi + lo pair there):
    inf, -inf and NaN exactly where the fp32 reference has them, and the finite row within the tolerance. With bf16
    x the fold (the warp's K redone on the general path where a scale does not fit) gives the general path's bits;
    also where all-zero blocks of scale 2^-127 meet the infinite x (0 · inf: NaN, and no redo)."""
    n, k, m = 300, 2880, 4
    g = torch.Generator().manual_seed(7)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    # "full": most steps on the general path; with fp16 x up to 2^-2, so that the finite sums stay finite in fp16
    lo, hi = {"fit": (112, 128), "full": (90, 165 if dtype == torch.bfloat16 else 125)}.get(scales, (112, 128))
    sf = torch.randint(lo, hi + 1, (n, k // 32), dtype=torch.uint8, generator=g)
    if scales == "zero_blocks":  # the blocks of k = 5 and 77 (block 0, 2) in even rows: zero codes, scale byte 0
        sf[0::2, 0] = sf[0::2, 2] = 0
        w.view(n, k // 32, 16)[0::2, 0] = 0x80
        w.view(n, k // 32, 16)[0::2, 2] = 0
    x = torch.randn(m, k, generator=g).to(dtype)
    x[1, 5] = float("inf")
    x[2, 2000] = float("nan")
    x[3, 77] = -float("inf")
    ref = (x.float() @ dequantize(w, sf, "mxfp4").T).to(dtype)
    assert ref[1].isinf().any() and ref[1].isnan().any() and ref[2].isnan().all()
    x = x.cuda()
    ys = {}
    for fold in (True, False):
        y = ys[fold] = _run(x, w.cuda(), sf.cuda(), "mxfp4", "plain", mx_fold=fold).cpu()
        for row in range(1, m):
            assert torch.equal(y[row].isnan(), ref[row].isnan()), (fold, row)
            assert torch.equal(y[row].isinf(), ref[row].isinf()), (fold, row)
            assert torch.equal(y[row][y[row].isinf()], ref[row][ref[row].isinf()]), (fold, row)
        _check(y[:1].cuda(), x[:1], w.cuda(), sf, "mxfp4")
    if dtype == torch.bfloat16:
        assert torch.equal(ys[True].view(torch.int16), ys[False].view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("split", [(m, *c) for m in (3, 5, 11) for c in kernels.candidates(1 if m < 8 else 2)],
                         ids=str)
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_every_split(split, fmt):
    """Every (groups, k_warps, register cap) the launcher can choose, for 4 tokens a CTA with two K parts a row
    (M = 3), 8 tokens with one part (M = 5) and 16 with one part (M = 11)."""
    m, groups, k_warps, cap = split
    tiles = dict(k_parts=2, token_tiles=1) if m <= 4 else dict(k_parts=1, token_tiles=1 if m < 8 else 2)
    w, scale, plain = _operands(200, 2880, fmt, "plain")
    x = torch.randn(m, 2880).to(torch.bfloat16).cuda()
    y = _run(x, w.cuda(), scale.cuda(), fmt, "plain", groups=groups, k_warps=k_warps, max_registers=cap, **tiles)
    _check(y, x, w.cuda(), plain, fmt)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("k", [2880, 2944, 3008, 3072, 64, 192])
def test_two_k_parts_a_row(fmt, layout, dtype, k):
    """k_parts = 2 (each row on two MMA rows, 4 tokens x 2 parts on the columns) against the reference at M = 1-4
    and past 4 tokens (several CTAs along M), with every remainder of K by the 256-K step (64, 128, 192, 0, and K
    below one step), odd N, a cluster and several k-warp counts; and the same bits as k_parts = 1 on small-integer
    data with unit scales, where every sum is exact."""
    n = 203
    w, scale, plain, gs, bias = _cuda_operands(n, k, fmt, layout, dtype)
    for m, cfg in [(1, {}), (2, dict(k_warps=4)), (3, dict(k_warps=16, k_splits=2)), (4, dict(groups=2, k_warps=2)),
                   (2, dict(row_warps=2, k_warps=4)), (7, dict(k_warps=8)), (8, dict(token_tiles=2)),
                   (13, dict(token_tiles=2, groups=2, k_warps=4))]:
        x = torch.randn(m, k).to(dtype).cuda()
        y = _run(x, w, scale, fmt, layout, gs, bias, k_parts=2, **cfg)
        _check(y, x, w, plain, fmt, gs, bias)
    unit = _unit_scales(n, k, fmt, layout)
    xi = torch.randint(-2, 3, (3, k)).to(dtype).cuda()
    one = _run(xi, w, unit.cuda(), fmt, layout, k_parts=1, k_warps=4)
    two = _run(xi, w, unit.cuda(), fmt, layout, k_parts=2, k_warps=4)
    assert torch.equal(one.view(torch.int16), two.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout,dtype", [("nvfp4", "plain", torch.bfloat16), ("nvfp4", "swizzled", torch.float16),
                                              ("mxfp4", "plain", torch.bfloat16), ("mxfp4", "plain", torch.float16)],
                         ids=["nvfp4-bf16", "swizzled-fp16", "mxfp4-bf16", "mxfp4-fp16"])
@pytest.mark.parametrize("k", [2880, 960, 64])
@pytest.mark.parametrize("parts", [4, 8])
def test_four_and_eight_k_parts_a_row(fmt, layout, dtype, k, parts):
    """k_parts = 4 and 8 (each row on 4 or 8 MMA rows, 8 / parts tokens x parts on the columns; a warp's W load one
    row's 512 contiguous bytes at 8 parts) against the reference at 1-5 tokens (several CTAs along M), with K's
    remainder by the (parts x 128)-K step of many sizes, K below one step, odd N, 1, 2 and 4 groups, a cluster,
    row-warps, two token tiles and x in fragment order; and the same bits as k_parts = 1 on small-integer data with
    unit scales."""
    n = 203
    w, scale, plain, gs, bias = _cuda_operands(n, k, fmt, layout, dtype)
    for m, cfg in [(1, dict(groups=2, k_warps=4)), (2, dict(groups=4, k_warps=2)), (3, dict(k_warps=8, k_splits=2)),
                   (2, dict(row_warps=2, k_warps=4)), (5, dict(token_tiles=2, k_warps=3, acc_sets=2)),
                   (3, dict(groups=2, k_warps=2, x_fragments=True))]:
        x = torch.randn(m, k).to(dtype).cuda()
        y = _run(x, w, scale, fmt, layout, gs, bias, k_parts=parts, **cfg)
        _check(y, x, w, plain, fmt, gs, bias)
    unit = _unit_scales(n, k, fmt, layout)
    xi = torch.randint(-2, 3, (3, k)).to(dtype).cuda()
    one = _run(xi, w, unit.cuda(), fmt, layout, k_parts=1, k_warps=4)
    more = _run(xi, w, unit.cuda(), fmt, layout, k_parts=parts, groups=2, k_warps=4)
    assert torch.equal(one.view(torch.int16), more.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_two_accumulator_sets(fmt, layout, dtype):
    """acc_sets = 2 (a step's MMAs alternate between two accumulator sets, added once after the K loop) against the
    reference with one and two K parts, a partial last step, a cluster and two token tiles; and the same bits as one
    set on small-integer data with unit scales, where every sum is exact."""
    n, k = 203, 2880 + 64
    w, scale, plain, gs, bias = _cuda_operands(n, k, fmt, layout, dtype)
    for m, cfg in [(1, dict(k_parts=1)), (1, dict(k_parts=2)), (4, dict(k_parts=2, groups=2, k_warps=2)),
                   (5, dict(k_parts=1, k_warps=4, k_splits=2)), (16, dict(k_parts=1, token_tiles=2, groups=2))]:
        x = torch.randn(m, k).to(dtype).cuda()
        y = _run(x, w, scale, fmt, layout, gs, bias, acc_sets=2, **cfg)
        _check(y, x, w, plain, fmt, gs, bias)
    unit = _unit_scales(n, k, fmt, layout)
    xi = torch.randint(-2, 3, (3, k)).to(dtype).cuda()
    one = _run(xi, w, unit.cuda(), fmt, layout, k_warps=4)
    two = _run(xi, w, unit.cuda(), fmt, layout, k_warps=4, acc_sets=2)
    assert torch.equal(one.view(torch.int16), two.view(torch.int16))


ANY_K_WARPS = [
    (1, dict(k_warps=3)), (1, dict(k_warps=12, max_registers=64)), (2, dict(k_parts=2, k_warps=5)),
    (4, dict(k_parts=2, k_warps=7, k_splits=2)), (6, dict(k_warps=13)), (8, dict(groups=2, k_warps=6)),
    (12, dict(token_tiles=2, k_warps=14, max_registers=72, x_fragments=True)),
    (16, dict(token_tiles=2, k_warps=11, max_registers=72, x_fragments=True)),
    (16, dict(token_tiles=2, k_warps=5, x_fragments=True)), (16, dict(token_tiles=2, groups=2, k_warps=3)),
    (9, dict(token_tiles=2, k_warps=9, k_splits=2)), (3, dict(k_warps=15, x_fragments=True)),
    (16, dict(token_tiles=2, groups=2, k_warps=10, max_registers=96, x_fragments=True, acc_sets=2)),
    (16, dict(token_tiles=2, k_warps=16, max_registers=64, x_fragments=True)),
]
# Each case in two of the six (format, scale layout, x dtype) combinations, all six over the cases (compiles are the
# cost: one kernel a config and combination).
ANY_K_WARPS_COMBOS = [(f, lay, d) for f, lay in LAYOUTS for d in DTYPES]


# 32 tokens a CTA (token_tiles = 4: W decoded once per 32 tokens; dispatched past 16 tokens where
# test_thirty_two_tokens_rule says):
# (M, config) each in two of the six combinations. M = 17, 33 and 70 leave a partial last CTA along M.
THIRTY_TWO_TOKENS = [
    (17, dict(token_tiles=4, k_warps=8)), (32, dict(token_tiles=4, k_warps=4, x_fragments=True)),
    (33, dict(token_tiles=4, groups=2, k_warps=4)), (70, dict(token_tiles=4, k_warps=8, x_fragments=True)),
    (64, dict(token_tiles=4, groups=2, k_warps=5, x_fragments=True, m_major=True)),
    (100, dict(token_tiles=4, k_warps=3, k_splits=2)),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case,combo", [(i, (i + j) % 6) for i in range(len(THIRTY_TWO_TOKENS)) for j in (0, 3)],
                         ids=str)
def test_32_tokens_a_cta(case, combo):
    """Four token tiles a CTA: against the reference (full range, a global scale and a bias, a partial last step,
    odd N) and repeatable; on small-integer data with unit scales bit for bit against two tiles a CTA of the same
    split (each token's MMAs and sums are the same)."""
    m, cfg = THIRTY_TWO_TOKENS[case]
    _check_split(m, cfg, ANY_K_WARPS_COMBOS[combo], dict(cfg, acc_sets=1), dict(cfg, token_tiles=2, acc_sets=1))


@pytest.mark.gpu
@pytest.mark.parametrize("case,combo", [(i, (i + j) % 6) for i in range(len(ANY_K_WARPS)) for j in (0, 3)], ids=str)
def test_any_number_of_k_warps(case, combo):
    """CTAs of k-warps that are not a power of two (widen_k_warps) split K the same way: against the reference with
    a partial last step and odd N (full range, a global scale and a bias), and on small-integer data with unit scales
    (every partial sum exact) bit for bit against 8 k-warps of the same split."""
    m, cfg = ANY_K_WARPS[case]
    _check_split(m, cfg, ANY_K_WARPS_COMBOS[combo], cfg, dict(cfg, k_warps=8, max_registers=0, k_splits=1))


def _check_split(m, cfg, combo, exact, other):
    """`cfg` at M tokens in (format, layout, x dtype) `combo`: against the reference on full-range data (a partial
    last step, odd N, a global scale and a bias) and repeatable; then on small-integer data with unit scales (every
    partial sum exact) config `exact` bit for bit against config `other`."""
    fmt, layout, dtype = combo
    n, k = 203, 2880 + 64
    w, scale, plain, gs, bias = _cuda_operands(n, k, fmt, layout, dtype)
    x = torch.randn(m, k).to(dtype).cuda()
    y = _run(x, w, scale, fmt, layout, gs, bias, **cfg)
    _check(y, x, w, plain, fmt, gs, bias)
    assert torch.equal(y.view(torch.int16), _run(x, w, scale, fmt, layout, gs, bias, **cfg).view(torch.int16))
    unit = _unit_scales(n, k, fmt, layout).cuda()
    xi = torch.randint(-2, 3, (m, k)).to(dtype).cuda()
    assert torch.equal(_run(xi, w, unit, fmt, layout, **exact).view(torch.int16),
                       _run(xi, w, unit, fmt, layout, **other).view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [(1, 16, 8), (1, 4, 2), (2, 16, 4), (2, 8, 8)], ids=str)
@pytest.mark.parametrize("fmt,layout", LAYOUTS)
def test_k_split_over_a_cluster(splits, fmt, layout):
    """K shared by the CTAs of a cluster (summed in rank order by rank 0), with a K that leaves some warps a
    partial step or none, against the reference; and the same bits as without the split on small-integer data
    where every sum is exact."""
    token_tiles, k_warps, k_splits = splits
    m = 5 if token_tiles == 1 else 11
    w, scale, plain = _operands(200, 2880 + 64, fmt, layout)
    x = torch.randn(m, 2880 + 64).to(torch.bfloat16).cuda()
    gs = torch.tensor([0.37], device="cuda") if fmt == "nvfp4" else None
    bias = torch.randn(200).to(torch.bfloat16).cuda()
    y = _run(x, w.cuda(), scale.cuda(), fmt, layout, gs, bias, k_warps=k_warps, k_splits=k_splits)
    _check(y, x, w.cuda(), plain, fmt, gs, bias)
    w = _operands(200, 1024, fmt, layout)[0]  # every code, unit scales: every partial sum is a multiple of 0.5
    scale = _unit_scales(200, 1024, fmt, layout)
    xi = torch.randint(-2, 3, (m, 1024)).to(torch.bfloat16).cuda()
    one = _run(xi, w.cuda(), scale.cuda(), fmt, layout, k_warps=k_warps)
    split = _run(xi, w.cuda(), scale.cuda(), fmt, layout, k_warps=k_warps, k_splits=k_splits)
    assert torch.equal(one.view(torch.int16), split.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout", LAYOUTS)
@pytest.mark.parametrize("n,k", [(1200, 2944 + 64), (128, 8192)], ids=["plain-grid", "cluster"])
def test_9_to_16_tokens_over_two_ctas(fmt, layout, n, k):
    """The dispatched config at M = 9, 12 and 16 on small W (two 8-token CTAs along M; on the long-K shape also a
    cluster along N) against the reference; then M = 40 and 5 through the same bound launch, which keeps one plan
    a token class."""
    w, scale, plain = _operands(n, k, fmt, layout)
    w, scale = w.cuda(), scale.cuda()
    gs = torch.tensor([0.37], device="cuda") if fmt == "nvfp4" else None
    assert kernels.token_tiles_for(16, n, k) == 1
    assert (kernels.config_for(12, n, k, fmt, layout, "bf16", False, gs is not None).k_splits > 1) == (k == 8192)
    launch = kernels.bind(n, k, torch.device("cuda"), torch.bfloat16, scale.dtype, fmt, layout, gs is not None, False)
    for m in (9, 12, 16, 40, 5):
        x = torch.randn(m, k).to(torch.bfloat16).cuda()
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
        launch(y, x, w, scale, gs, None)
        _check(y, x, w, plain, fmt, gs)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("cfg", [{}, dict(k_warps=4, max_registers=48), dict(k_warps=4, k_splits=4), dict(k_parts=2),
                                 dict(k_parts=2, k_warps=2, k_splits=2), dict(block_columns=True),
                                 dict(block_columns=True, groups=2, k_warps=2, k_splits=2)],
                         ids=["dispatched", "capped", "cluster", "two parts", "two parts cluster", "block columns",
                              "block columns cluster"])
def test_one_hot_probes(fmt, dtype, cfg):
    """Row r holds one code at k = (7r + 3) % K and scale 2^(r % 5) on its block; token t is one-hot at row t's k:
    y[t, r] is code · scale when r == t and 0 otherwise, exactly. Every code, both nibbles, every block position."""
    n, k = 48, 256
    for code in range(16):
        w = torch.zeros(n, k // 2, dtype=torch.uint8)
        ks = [(7 * r + 3 + 16 * code) % k for r in range(n)]
        for r, kk in enumerate(ks):
            w[r, kk // 2] = code << (4 * (kk % 2))
        if fmt == "nvfp4":
            plain = torch.full((n, k // 16), 0x38, dtype=torch.uint8)  # 1.0
            for r, kk in enumerate(ks):
                plain[r, kk // 16] = 0x38 + 8 * (r % 5)  # 2^(r % 5)
            plain = plain.view(torch.float8_e4m3fn)
        else:
            plain = torch.full((n, k // 32), 127, dtype=torch.uint8)
            for r, kk in enumerate(ks):
                plain[r, kk // 32] = 127 + r % 5
        x = torch.zeros(n, k, dtype=dtype)
        for t, kk in enumerate(ks):
            x[t, kk] = 1
        y = _run(x.cuda(), w.cuda(), plain.cuda(), fmt, "plain", **cfg).float().cpu()
        want = torch.diag(torch.tensor([E2M1[code] * 2.0 ** (r % 5) for r in range(n)]))
        assert torch.equal(y, want), (code, (y - want).abs().max())


@pytest.mark.gpu
@pytest.mark.parametrize("n,k,m", [(4096, 7168, 16), (256, 7168, 16), (4096, 7168, 3), (256, 7168, 1)],
                         ids=["one CTA a row tile", "a cluster a row tile", "two K parts", "two K parts, a cluster"])
def test_bit_identical_over_100_runs(n, k, m):
    w, scale, plain = _operands(n, k, "nvfp4", "plain")
    x = torch.randn(m, k).to(torch.bfloat16).cuda()
    w, scale = w.cuda(), scale.cuda()
    first = _run(x, w, scale, "nvfp4", "plain")
    for _ in range(100):
        assert torch.equal(_run(x, w, scale, "nvfp4", "plain").view(torch.int16), first.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("k", [2880 + 64, 4096, 64])
def test_block_columns(fmt, layout, dtype, k):
    """block_columns (x prepared as f16 times a power of two a token, block scales after the MMA, two tokens a CTA)
    against the reference at M = 1-5 (several CTAs along M), with a partial last step, odd N, two groups, several
    k-warp counts, a cluster and a register cap; tokens of very different magnitudes (bf16: 2^-100 to 2^60, each
    token's own power of two); and the same bits as the default kernel on small-integer data with unit scales."""
    n = 203
    w, scale, plain, gs, bias = _cuda_operands(n, k, fmt, layout, dtype)
    for m, cfg in [(1, {}), (2, dict(k_warps=4)), (3, dict(k_warps=16, k_splits=2)), (4, dict(groups=2, k_warps=2)),
                   (5, dict(k_warps=8, max_registers=48)), (2, dict(row_warps=2, k_warps=4))]:
        x = torch.randn(m, k)
        b = bias if m % 2 == 0 else None  # odd M: no bias, each token at its own magnitude (bf16)
        if dtype == torch.bfloat16 and b is None:
            x = x * torch.tensor([2.0**-100, 2.0**60, 1.0, 2.0**-20, 2.0**30][:m]).view(m, 1)
        x = x.to(dtype).cuda()
        y = _run(x, w, scale, fmt, layout, gs, b, block_columns=True, **cfg)
        for t in range(m):
            _check(y[t : t + 1], x[t : t + 1], w, plain, fmt, gs, b)
    unit = _unit_scales(n, k, fmt, layout)
    xi = torch.randint(-2, 3, (3, k)).to(dtype).cuda()
    base = _run(xi, w, unit.cuda(), fmt, layout, k_parts=1, k_warps=4)
    cols = _run(xi, w, unit.cuda(), fmt, layout, block_columns=True, k_warps=4)
    assert torch.equal(base.view(torch.int16), cols.view(torch.int16))
    first = _run(x, w, scale, fmt, layout, gs, block_columns=True)
    for _ in range(20):
        assert torch.equal(_run(x, w, scale, fmt, layout, gs, block_columns=True).view(torch.int16),
                           first.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
def test_block_columns_dispatched_and_in_a_graph(dtype):
    """The dispatched path on MXFP4 at 1-2 tokens and 24 MB of codes, where the rule takes block columns with fp16 x
    (two kernels a call) and the scale fold with bf16 x, against the reference through fp4_linear, then the same
    calls captured in a CUDA graph and replayed with new x: the same bits as eager."""
    from nvfp4_gemv.linear import fp4_linear

    n, k = 8192, 6144
    w, scale, plain = _operands(n, k, "mxfp4", "plain")
    w, scale = w.cuda(), scale.cuda()
    for m in (1, 2):
        cfg = kernels.config_for(m, n, k, "mxfp4", "plain", "fp16" if dtype == torch.float16 else "bf16", False, False)
        assert cfg.block_columns if dtype == torch.float16 else (cfg.mx_fold and not cfg.block_columns)
        x = torch.randn(m, k).to(dtype).cuda()
        y = fp4_linear(x, w, scale, "mxfp4")
        _check(y, x, w, plain, "mxfp4")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            yg = fp4_linear(x, w, scale, "mxfp4")
        x.copy_(torch.randn(m, k).to(dtype))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(yg.view(torch.int16), fp4_linear(x, w, scale, "mxfp4").view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("k", [2880 + 64, 4096, 64, 192])
def test_x_fragments(fmt, layout, dtype, k):
    """x_fragments (x written once a call in the order of the loop's loads and B registers, then the default
    kernel's loop on it) against the reference and bit for bit against the same config without it, at 1-40 tokens
    (tokens past M in the last token group, token tiles, two K parts, a cluster, two groups and accumulator sets, a
    register cap, row-warps, token tiles first on the grid), with a partial last step and odd N; 20 repeats
    bit-identical."""
    n = 203
    w, scale, plain, gs, bias = _cuda_operands(n, k, fmt, layout, dtype)
    for m, cfg in [(1, {}), (2, dict(k_parts=2, k_warps=2)), (3, dict(k_parts=2, k_warps=4, k_splits=2)),
                   (5, dict(k_warps=16, k_splits=2)), (8, dict(groups=2, k_warps=2)), (9, dict(token_tiles=2)),
                   (13, dict(token_tiles=2, groups=2, k_warps=4, acc_sets=2)), (16, dict(k_warps=4, max_registers=48)),
                   (7, dict(row_warps=2, k_warps=4)), (40, dict(token_tiles=2, m_major=True, k_splits=1))]:
        x = torch.randn(m, k).to(dtype).cuda()
        b = bias if m % 2 == 0 else None
        y = _run(x, w, scale, fmt, layout, gs, b, x_fragments=True, **cfg)
        _check(y, x, w, plain, fmt, gs, b)
        base = _run(x, w, scale, fmt, layout, gs, b, x_fragments=False, **cfg)
        _check(base, x, w, plain, fmt, gs, b)
        if fmt == "mxfp4" and dtype == torch.float16:
            # The scale fold's general steps (scales out of its range) decode in f16 pair order with x in fragment
            # order and in bf16 pair order without: K meets the MMAs in another order, so the bits may differ.
            continue
        assert torch.equal(y.view(torch.int16), base.view(torch.int16)), (m, cfg)
    first = _run(x, w, scale, fmt, layout, gs, x_fragments=True)
    for _ in range(20):
        assert torch.equal(_run(x, w, scale, fmt, layout, gs, x_fragments=True).view(torch.int16),
                           first.view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_x_fragments_dispatched_and_in_a_graph(fmt):
    """The dispatched path where the rule takes x in fragment order (8 MB of codes, 5-40 tokens) against the
    reference through fp4_linear, then captured in a CUDA graph (two kernels a call) and replayed with new x: the
    same bits as eager."""
    from nvfp4_gemv.linear import fp4_linear

    n, k = 4096, 4096
    w, scale, plain = _operands(n, k, fmt, "plain")
    w, scale = w.cuda(), scale.cuda()
    for m in (5, 16, 40):
        assert kernels.config_for(m, n, k, fmt, "plain", "bf16", False, False).x_fragments
        x = torch.randn(m, k).to(torch.bfloat16).cuda()
        y = fp4_linear(x, w, scale, fmt)
        _check(y, x, w, plain, fmt)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            yg = fp4_linear(x, w, scale, fmt)
        x.copy_(torch.randn(m, k).to(torch.bfloat16))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(yg.view(torch.int16), fp4_linear(x, w, scale, fmt).view(torch.int16))


@pytest.mark.gpu
@pytest.mark.parametrize("prepared,tokens", [("block_columns", (1, 2, 1, 2)), ("x_fragments", (3, 12, 1, 16))])
def test_prepared_x_workspace_per_stream_and_thread(prepared, tokens):
    """The workspace of the two-kernel paths (x prepared by a first kernel) is reused call after call on one stream
    and thread (no allocation but y), and is never shared: calls queued on four streams at once, and from four
    threads on one stream, each with its own x, all get their own x's result (the reference, and the same bits as a
    call made alone)."""
    import threading

    from nvfp4_gemv.linear import fp4_linear

    n, k = 1024, 2048
    w, scale, plain = _operands(n, k, "mxfp4", "plain")
    w, scale = w.cuda(), scale.cuda()
    launch = kernels.bind(n, k, w.device, torch.bfloat16, scale.dtype, "mxfp4", "plain", False, False,
                          **{prepared: True})
    xs = [torch.randn(m, k).mul(4.0**i).to(torch.bfloat16).cuda() for i, m in enumerate(tokens)]
    alone = []
    for x in xs:
        y = torch.empty(x.shape[0], n, dtype=torch.bfloat16, device="cuda")
        launch(y, x, w, scale, None, None)
        _check(y, x, w, plain, "mxfp4")
        alone.append(y)
    ws = kernels.Workspace(k, w.device)
    kind = "columns" if prepared == "block_columns" else "fragments"
    assert ws(kind, 1)[0] is ws(kind, 1)[0] and ws(kind, 2)[0] is not ws(kind, 1)[0]
    streams = [torch.cuda.Stream() for _ in xs]
    outs = [torch.empty_like(y) for y in alone]
    torch.cuda.synchronize()
    for _ in range(5):  # the four calls queued at once, each on its own stream
        for x, y, st in zip(xs, outs, streams):
            with torch.cuda.stream(st):
                launch(y, x, w, scale, None, None)
    torch.cuda.synchronize()
    for y, ref in zip(outs, alone):
        assert torch.equal(y.view(torch.int16), ref.view(torch.int16))
    outs = [torch.empty_like(y) for y in alone]
    errors = []

    def worker(i):
        try:
            for _ in range(20):
                launch(outs[i], xs[i], w, scale, None, None)
        except Exception as e:  # noqa: BLE001 (re-raised below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not errors
    for y, ref in zip(outs, alone):
        assert torch.equal(y.view(torch.int16), ref.view(torch.int16))
    y = fp4_linear(xs[0], w, scale, "mxfp4")  # the default path for this small weight: a cross-check
    _check(y, xs[0], w, plain, "mxfp4")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16"])
@pytest.mark.parametrize("m,override", [(1, {}), (2, {}), (4, {}), (8, {}), (16, {}), (40, {}), (160, {}),
                                        (3, dict(x_fragments=True)), (2, dict(block_columns=True)),
                                        (1, dict(mx_fold=True)), (5, dict(mx_fold=True)), (1, dict(mx_fold=False)),
                                        (4, dict(k_parts=2, k_splits=2))], ids=str)
def test_nan_scales(fmt, layout, dtype, m, override):
    """Scale bytes that are NaN (e4m3 0x7F and 0xFF; e8m0 0xFF), a few blocks of a few rows, with a third of
    NVFP4's other scales negative, on every path the dispatch takes from 1 to 160 tokens and on the fold,
    block-column, fragment and cluster kernels: NaN in exactly the reference's outputs (every token of those rows,
    whatever the codes and x), and the other rows within the tolerance. A NaN scale must never come out as a finite
    number or an infinity."""
    if "mx_fold" in override and fmt != "mxfp4":
        pytest.skip("the scale fold is MXFP4's")
    n, k = 300, 2880
    w, scale, plain = _operands(n, k, fmt, layout, seed=3)
    nan_rows = [0, 17, 130, 299]
    if fmt == "nvfp4":  # and negative e4m3 scales (the sign bit set) on a third of the other blocks
        negative = torch.rand(plain.shape, generator=torch.Generator().manual_seed(3)) < 0.33
        plain.view(torch.uint8)[negative] |= 0x80
    for i, row in enumerate(nan_rows):
        plain[row].view(torch.uint8)[(7 * i + 3) % plain.shape[1]] = 0xFF if fmt == "mxfp4" or i % 2 else 0x7F
    if layout == "swizzled":
        from test_linear_reference import swizzle

        scale = swizzle(plain)
    else:
        scale = plain
    gs = torch.tensor([0.37], device="cuda") if fmt == "nvfp4" else None
    x = torch.randn(m, k).to(dtype).cuda()
    x[:, :64] = 0  # 0 · NaN is NaN too
    y = _run(x, w.cuda(), scale.cuda(), fmt, layout, gs, **override)
    wd = dequantize(w, plain, fmt, "plain", None if gs is None else gs.cpu()).cuda()
    ref = x.float() @ wd.T
    want_nan = torch.zeros(n, dtype=torch.bool)
    want_nan[nan_rows] = True
    assert torch.equal(ref.isnan().any(0).cpu(), want_nan) and ref[:, nan_rows].isnan().all()
    assert torch.equal(y.isnan(), ref.isnan())
    keep = ~want_nan.cuda()
    _check(y[:, keep], x, w.cuda()[keep.cpu()], plain[keep.cpu()], fmt, gs)


@pytest.mark.gpu
@pytest.mark.parametrize("m,override", [(1, {}), (4, {}), (16, {}), (1, dict(mx_fold=False)), (5, dict(mx_fold=True)),
                                        (2, dict(block_columns=True)), (3, dict(x_fragments=True))], ids=str)
def test_mxfp4_every_scale_byte(m, override):
    """Every e8m0 scale byte at which every code's value is a finite fp32: 0 (2^-127, subnormal in bf16) to 252
    (2^125; from 253 on, code 6 times the scale passes fp32's range and the reference has inf). Row r's blocks hold
    bytes of one narrow window that moves with r, so each row's sums sit at one scale level and are checked at that
    level's precision (elementwise: fp32 accumulation error plus one rounding to bf16, with a floor far below fp32's
    normal range, where products of the smallest scales are fp32 subnormals). x is small enough that the 2^125 rows'
    sums stay finite."""
    n, k = 300, 2880
    g = torch.Generator().manual_seed(21)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    base = (torch.arange(n) * 17) % 250
    sf = (base[:, None] + torch.randint(0, 4, (n, k // 32), generator=g)).to(torch.uint8)
    assert set(sf.unique().tolist()) == set(range(253))
    x = (torch.randn(m, k, generator=g) * 2.0**-12).to(torch.bfloat16)
    y = _run(x.cuda(), w.cuda(), sf.cuda(), "mxfp4", "plain", **override).cpu().double()
    wd = dequantize(w, sf, "mxfp4").double()
    ref = x.double() @ wd.T
    assert ref.isfinite().all()
    magnitude = x.double().abs() @ wd.abs().T
    assert ((y - ref).abs() <= 1e-5 * magnitude + 2.0**-7 * ref.abs() + 1e-35).all()
    assert (y != 0).float().mean() > 0.9  # the rows are not all lost to underflow
