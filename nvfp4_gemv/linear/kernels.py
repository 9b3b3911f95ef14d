"""The CUDA side of the W4A16 linear: pick a `cute_kernels.linear_w4a16` config for (M, N, K, format, dtype) and the
device's SM count, compile it once (TVM-FFI, torch's current stream), and launch it.

The caller (`nvfp4_gemv.linear.op`) has validated the operands; this module trusts them. It imports the DSL, so the
op imports it on its first CUDA call only.
"""

from __future__ import annotations

import threading

import torch

from cute_kernels.compile import compile_kernel, raw_function
from cute_kernels.linear_w4a16 import MMA_COLUMNS, STEP_K, LinearW4A16, LinearW4A16Config
from cute_kernels.linear_w4a16_columns import LinearW4A16Columns, prepared_words
from cute_kernels.linear_w4a16_experts import LinearW4A16Experts
from cute_kernels.linear_w4a16_fragments import LinearW4A16Fragments, fragment_words
from cute_kernels.run_table import BUCKETS, RunTable, RunTableConfig, buckets_for
from cute_kernels.targets import target
from cute_kernels.tc_workspace import capability, sm_count
from nvfp4_gemv.dispatch import MAX_CTAS_PER_SM, REGISTER_FILE, ctas_per_sm, last_wave_fill
from nvfp4_gemv.linear import prefill

SCALE_LAYOUTS = {"plain": "plain", "swizzled": "permuted"}  # the linear's names -> the kernel's sf_kind
_X_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_SF_DTYPES = {torch.uint8: "u8", torch.float8_e4m3fn: "e4m3"}
_ID_DTYPES = {torch.int32: "i32", torch.int64: "i64"}
H200_SMS = 132

# (groups, k_warps) candidates: a warp owns `groups` 16-row MMA groups, and `k_warps` warps of a CTA split K.
# The kernel is bound by issue slots and warps in flight, so the best split on the H200 sweep is the one that fills
# one wave of resident warps with the most K steps each (BENCHMARKS.md, "The W4A16 linear"). Resident warps come
# from the registers a config takes (ptxas for sm_90a, allocated in steps of 8; tests/test_linear_kernel.py checks
# the table). A split may also run with its registers capped (CAPS), which lets more warps stay resident at the
# price of a spill or two: it is taken only where that is what fits the split in one wave. On ties: uncapped first,
# then balanced k-warps (choose_split), then more groups (x is reused across more rows).
SPLITS = ((2, 1), (1, 1), (1, 2), (2, 2), (2, 4), (1, 4), (2, 8), (1, 8), (1, 16))
K_WARPS_MAX = 16  # a CTA's warps (LinearW4A16Config: row_warps x k_warps <= 16)
WIDEN_K_WARPS = True  # choose_split's split widened to other k-warp counts (widen_k_warps); False: powers of two only
# ... only where its grid holds fewer warps than this an SM on the mean. Graph-timed on the H200, the widened split
# against the power-of-two one (nvfp4_gemv.linear.bench.k_warps_ab): without this bound, 0.86-0.99 of the time where
# the power-of-two grid held 8-17 warps an SM, and 0.98-1.10 where it held 19-22 (10240 x 8192 at 12-16 tokens, 4 ->
# 5 k-warps: 1.03-1.10; 11136 x 25408 at 8, two groups, 8 -> 9: 1.04), as the GEMV's sweep found more warps paying up
# to about 19 an SM and costing past it (docs/linear_h200_k_warps_fit_*.csv). With it, on 40 shapes drawn after
# (docs/linear_h200_k_warps_heldout.csv, 28 points at 1-16 tokens, both formats): 0.944 of the time on geomean,
# 0.87-1.02.
WIDEN_BELOW_WARPS = 18
# (groups, token_tiles) -> registers a thread. Four token tiles (32 tokens a CTA) are dispatched past 16 tokens
# (TOKEN_TILES_4_X_DTYPES).
REGISTERS = {(1, 1): 64, (2, 1): 72, (1, 2): 80, (2, 2): 128, (1, 4): 128, (2, 4): 168}
CAPS = {(1, 1): 48}  # (groups, token_tiles) -> a register cap ptxas meets with one spilled pair in the loop
# (groups, token_tiles, x dtype) -> registers a thread of LinearW4A16Fragments (x_fragments) where they are fewer
# than REGISTERS gives: one group of 16 tokens (no x pairing in the loop, the B registers as loaded). With fp16 x
# (NVFP4; sm_90a) ptxas gives 65-78 uncapped, 78 without a global scale, so those configs are capped at the entry
# (FRAGMENT_CAPS; no spill with 2 and 4 warps a CTA, and with 8 the cap allows 85, the same 3 CTAs an SM). The scale
# fold's fragments kernel (MXFP4 with fp16 x) spills 34 values at 72 and is counted at REGISTERS: its key is
# "<x dtype> fold" (fragments_key), which has no entry. Graph-timed on the H200 against the fp16 split without the
# entry (docs/linear_h200_fragments_fp16.csv, NVFP4 at 9-16 tokens, 24 points of the 12 bench shapes): 0.88-0.91 of
# the time where the split goes from two groups to one (28672 x 4096, 14336 x 4096), 0.95-1.01 where only the cap
# changes.
FRAGMENT_REGISTERS = {(1, 2, "bf16"): 72, (1, 2, "fp16"): 72}
FRAGMENT_CAPS = ((1, 2, "fp16"),)
# (format, groups) -> registers a thread of LinearW4A16Columns (block_columns) with fp16 x, the one x dtype that takes
# it (bf16 x, only by naming the config: the same but MXFP4's two-group CTAs, 96), as for REGISTERS; no caps
COLUMN_REGISTERS = {("mxfp4", 1): 64, ("mxfp4", 2): 80, ("nvfp4", 1): 72, ("nvfp4", 2): 80}


def fragments_key(x_dtype: str, fold: bool) -> str:
    """The key of x in fragment order in FRAGMENT_REGISTERS (model_registers' `fragments`): x's dtype, or for the
    scale fold "<x dtype> fold", which the table does not hold."""
    return f"{x_dtype} fold" if fold else x_dtype


def model_registers(groups: int, token_tiles: int, columns: str = "", fragments: str = "") -> int:
    """Registers a thread of this config, as the resident-warp model counts them: `columns` (a format): of the
    block-columns kernel (COLUMN_REGISTERS); `fragments` (fragments_key): with x in fragment order
    (FRAGMENT_REGISTERS where it counts fewer); else REGISTERS."""
    if columns:
        return COLUMN_REGISTERS[(columns, groups)]
    regs = REGISTERS[(groups, token_tiles)]
    if fragments:
        regs = FRAGMENT_REGISTERS.get((groups, token_tiles, fragments), regs)
    return regs


def resident_ctas(registers: int, warps: int) -> int:
    """CTAs of `warps` warps at `registers` a thread one SM holds, with the register file counted as ptxas counts it
    when a cap tells it the CTAs: each of the SM's four sub-partitions holds ceil(warps on the SM / 4) warps in its
    quarter of the file, rounded down to 8 registers a thread (BENCHMARKS.md, "Fewer registers at 16 tokens a CTA":
    every sm_90a compile of that survey fits it). The GEMV's model (`dispatch.ctas_per_sm`) divides the whole file
    and counts one CTA more at 80 registers with 1 or 5 warps a CTA, 96 with 1, 3 or 7, 48 with 2, 3, 6, 7 or 14.
    Graph-timed on the H200 against that model at every point of the bench shapes and 40 drawn ones (1-16 tokens,
    both formats, bf16 and fp16 x) where the two give different splits (docs/linear_h200_ab_register_partitions.csv;
    BENCHMARKS.md, "The A/B runs of 2026-12-05"): 6 points, 16-token CTAs of 5 k-warps at 80 registers becoming 4
    k-warps, 0.945-0.970 of the time."""
    ctas = ctas_per_sm(registers, warps)
    while ctas > 0 and REGISTER_FILE // 4 // (32 * -(-ctas * warps // 4)) // 8 * 8 < registers:
        ctas -= 1
    return ctas


def resident_warps(groups: int, k_warps: int, token_tiles: int, cap: int = 0, columns: str = "",
                   fragments: str = "") -> int:
    """Warps of this config one SM holds at once (registers, CTA and warp limits, the register file's sub-partitions
    counted: resident_ctas; one CTA being k_warps warps); `columns` (a format): of the block-columns kernel;
    `fragments` (x's dtype): with x in fragment order."""
    return resident_ctas(cap or model_registers(groups, token_tiles, columns, fragments), k_warps) * k_warps


def k_steps(k: int) -> int:
    """128-K steps of a row, a partial last one counted (it costs a warp a load round trip like a whole one)."""
    return -(-k // STEP_K)


def grid_warps(n: int, groups: int, k_warps: int) -> int:
    """Warps of the grid for N rows: a CTA of k_warps warps per row tile of 16 x groups rows."""
    return -(-n // (16 * groups)) * k_warps


# x in fragment order on MXFP4's scale fold with fp16 x ("fp16 fold", fragments_key) takes no cap from CAPS: the fold
# spills under it, and the split the rules give without it (two groups at 72 registers on every point measured) took
# 0.918 of the capped split's time on geomean over the 22 points of the bench shapes and 40 drawn ones at 3-8 tokens
# where they differ (0.81-1.06; 16 faster by over 3 %, 3 slower: 8944 x 4736 at 6-8 tokens, 18800 x 3328 at 6),
# H100, `nvfp4-gemv ab mx_fold_uncapped`, docs/linear_h100_ab_mx_fold_uncapped.csv. With x loaded as it is (1-4
# tokens) the two were even (1.00 over 16 points, 0.94-1.07), and the cap stays.
UNCAPPED_FRAGMENTS = ("fp16 fold",)


def candidates(token_tiles: int, columns: str = "", groups_only: int = 0, fragments: str = ""):
    """(groups, k_warps, register cap or 0) the launcher may choose from (`groups_only`: of that many groups only;
    `fragments`: the key of x in fragment order, fragments_key, as choose_split takes it)."""
    for groups, k_warps in SPLITS:
        if groups_only and groups != groups_only:
            continue
        yield groups, k_warps, 0
        cap = None if columns or fragments in UNCAPPED_FRAGMENTS else CAPS.get((groups, token_tiles))
        if cap and 2 <= REGISTER_FILE // (cap * 32 * k_warps) <= MAX_CTAS_PER_SM:
            yield groups, k_warps, cap


# Which splits are candidates (choose_split). k-warps are worth adding while they shorten the chain of load round
# trips each warp waits out in turn (its K steps, a partial last one counted): k_warps is a candidate only where half
# as many would take more steps a warp. With more than 4 tokens a CTA, whose partial sums the k-warps add through
# shared memory, they must also be 3/4 busy (K's steps over k_warps x the steps of the busiest). A register cap (CAPS)
# is a candidate only where each k-warp has CAP_MIN_STEPS steps: it buys resident warps to hide a long chain, and with
# one or two steps a warp there is none. On a tie in warps, a split whose k-warps are BALANCED (K's steps at least
# that fraction of k_warps x the busiest's) goes first. The rule this replaced (k-warps 3/4 busy at every M, a
# partial last step not counted, a cap wherever it fitted a wave, ties to more groups, a cluster wherever it shortened
# the chain) was graph-timed against this one on the H200 at every (shape, M, format) where the two differ
# (docs/linear_h200_split_rule_check.csv; BENCHMARKS.md, "The linear's split on shapes no file named"): on 20 random
# shapes drawn after the rules were fixed, 46 of 240 points differ, 0.88 of the old time on geomean (33 faster by over
# 3 %, 6 slower, worst 1.20 x: 9910 x 896 MXFP4 at M = 8); 889 x 3008 at M = 1 went from 2.04 x the read to 1.56 and
# 856 x 1472 from 1.94 to 1.40 (16 k-warps, or two K parts of 8, instead of 4 k-warps in a cluster).
CAP_MIN_STEPS = 4
BALANCED = 0.8
# At 16 tokens a CTA (two token tiles) x is 32 registers and every warp loads all of it for its rows each step, so
# two row groups a warp (x shared by 32 rows) beat one group where the chain is long, even with half the warps: the
# two-group split (the same rule among two-group splits) replaces a one-group one where it takes no more steps a
# k-warp, at least TWO_GROUPS_MIN_CHAIN of them, and its grid fills at least TWO_GROUPS_MIN_FILL of a resident wave.
# Graph-timed on the H200 at M = 16, NVFP4, every candidate split of 52 random shapes
# (docs/linear_sweep_h200_t2_groups.csv, docs/linear_sweep_h200_random_splits.csv): with the same chain, two groups
# won 2-24 % from 16 steps a k-warp and half a wave up (24323 x 13952: 2.76 -> 2.10 x the read; 11538 x 7936: 2.68
# -> 2.21) and lost 1-10 % under half a wave (4042 x 14720: 2.32 -> 2.56) or at 8 steps or fewer (5989 x 7680: 2.34
# -> 2.52). Then against the rule without it on 24 shapes drawn after, at M = 12 and 16, both formats
# (docs/linear_h200_t2_groups_check.csv): with a cut at half a wave, 0.87-0.98 of the time on geomean per (M,
# format), but 3-12 % slower at M = 12 where two groups filled 0.52-0.59 of a wave; the cut is 0.6. A second check
# (20 more shapes, M = 10, 14, 16; docs/linear_h200_t2_groups_check.csv) put CTAs of 8 k-warps two groups each 10-18 %
# slower at 10 tokens and up to 9 % with fp16 x on MXFP4 at 16 (5779 x 15872, 6082 x 11840), so the rule takes
# CTAs of at most TWO_GROUPS_MAX_K_WARPS. This rule, on 20 more shapes drawn after it was fixed and 10240 x 8192 (M =
# 9, 11, 13, 16 with bf16 x, 12 with fp16; same file, seed 7777): 0.918 of the time without it over 210 points, 148
# faster by over 3 %, 11 slower by over 3 % (worst 1.14: 10343 x 8960 MXFP4 at 9 tokens, where it gains least).
# With x in fragment order (x_fragments_for) a warp's x load is 4 L1 wavefronts instead of 16 and needs no PRMT, so
# sharing x over two groups saves little, and one group of 16 tokens takes 72 registers with bf16 x
# (FRAGMENT_REGISTERS): there the split is the most warps of one wave, without the two-group test. Graph-timed on the
# H200 at M = 12 and 16, NVFP4, bf16 x, every candidate split with and without x in fragment order
# (docs/linear_sweep_h200_m16_x_fragments.csv): one group was the fastest split with fragments on all 8 (shape, M)
# points of 28672 x 4096, 14336 x 4096, 10240 x 8192 and 6144 x 4096 (28672 x 4096 at 16 tokens: 1.87 -> 1.57 x the
# read; 10240 x 8192: 2.19 -> 1.74), where the two-group test had taken two; 8192 x 28672 kept two groups (a tie in
# warps, which goes to more groups). On 40 shapes drawn after (docs/linear_h200_m16_x_fragments_split_heldout.csv,
# random seeded 9090, codes of 6-400 MB, every third with fp16 x; the 13 whose split this changes, M = 9, 12, 16 and 32,
# both formats, 104 points): 0.885 of the old split's time over the 72 points at 9-16 tokens with bf16 x or NVFP4
# (0.79-0.97), and at 32 tokens 0.86-1.08; MXFP4 with fp16 x (x split into a bf16 hi + lo pair, 80 registers a
# thread at one group) was 1.27-1.29 x slower and kept the two-group test; with the scale fold (mx_fold_for) the
# rule's one-group split took 0.82-0.89 of the two-group split's time at 10-16 tokens on the 3 shapes of the suite and
# drawn for that run where the two differ (docs/linear_h200_mx_fold_rules.csv), so it takes the rule too.
TWO_GROUPS_MIN_CHAIN = 12
TWO_GROUPS_MIN_FILL = 0.6
TWO_GROUPS_MAX_K_WARPS = 4
# Where the split is still two groups at 16 tokens a CTA with x in fragment order (a tie in warps, which goes to more
# groups) and its grid holds fewer than WIDEN_BELOW_WARPS warps an SM, the one-group split (the same rules among
# one-group splits, widened) takes its place if its grid holds more warps: more warps a row for the same x loads a
# row, where the two-group grid leaves warps free (at a tie, as with k-warps in powers of two only, two groups stay:
# 8192 x 28672 at 16 tokens, one group of 4 k-warps 1.98 x the read against 1.78). Graph-timed on the H200 against the
# two-group split at 12 and 16 tokens, both formats, bf16 x, on the bench shapes and 40 drawn ones
# (bench.one_group_ab; docs/linear_h200_ab_one_group.csv; BENCHMARKS.md, "The A/B runs of 2026-12-05"): 20 points
# differ, 0.908 of the time on geomean, 0.83-1.00 (8192 x 28672 at 16 tokens: two groups of 8 k-warps, 15.5 warps an
# SM, against one group of 7 capped at 72 registers, 27: 0.95). Only x dtypes measured (fp16 x, whose fragments take a
# register cap, keeps two groups). MXFP4's scale fold ("<x dtype> fold", fragments_key; one group of 16 tokens capped
# at 80 registers by mx_fold_cap, no spill in the fold's loop, sm_90a) against its two-group split at 9, 12 and 16
# tokens, fp16 x, on the same shapes (`nvfp4-gemv ab one_group_fold`, docs/linear_h100_ab_one_group_fold.csv; an
# H100, as the rule's bf16 held-out run was, at 0.86-0.97 like the H200's): all 18 points that differ faster,
# 0.860-0.989 (14336 x 4096 at 16 tokens: 1.57 -> 1.39 x the read). bf16 x on the fold never has two groups there
# (the fold takes only the general path's split), so its key is in for the same reason.
ONE_GROUP_FRAGMENTS = ("bf16", "fp16 fold", "bf16 fold")


def chain(steps: int, k_warps: int) -> int:
    """K steps the busiest of k_warps warps takes, one after another."""
    return -(-steps // k_warps)


def choose_split(n: int, k: int, sms: int, token_tiles: int = 1, columns: str = "",
                 few_tokens: bool | None = None, fragments: str = "", groups_only: int = 0) -> tuple[int, int, int]:
    """(groups, k_warps, register cap) for N rows of K: the most warps that fit one resident wave among the candidates
    above (`few_tokens`: at most 4 tokens a CTA; by default, one token tile); on ties uncapped, then balanced, then
    more groups; where none fits (very large N), the fewest waves. With two token tiles, two groups where the
    TWO_GROUPS_* test above takes them over one, unless x is in fragment order (`fragments`: x's dtype), and one
    group where the ONE_GROUP_FRAGMENTS rule takes it over two. `groups_only`: among splits of that many groups."""
    if few_tokens is None:
        few_tokens = token_tiles == 1
    steps = k_steps(k)
    fits = []  # (key, split, fill of one wave) of the candidates whose grid fits one resident wave
    fewest, fewest_waves = None, None
    for groups, k_warps, cap in candidates(token_tiles, columns, groups_only, fragments):
        wave = resident_warps(groups, k_warps, token_tiles, cap, columns, fragments) * sms
        if wave == 0:
            continue
        warps = grid_warps(n, groups, k_warps)
        if cap == 0 and (fewest_waves is None or warps / wave < fewest_waves):
            fewest, fewest_waves = (groups, k_warps, cap), warps / wave
        if k_warps > 1 and chain(steps, k_warps) >= chain(steps, k_warps // 2):
            continue
        if not few_tokens and 4 * steps < 3 * k_warps * chain(steps, k_warps):
            continue
        if cap and steps < CAP_MIN_STEPS * k_warps:
            continue
        if warps <= wave:
            key = (warps, cap == 0, steps >= BALANCED * k_warps * chain(steps, k_warps), groups)
            fits.append((key, (groups, k_warps, cap), warps / wave))
    if not fits:
        return fewest
    _, best, _ = max(fits, key=lambda f: f[0])  # the first of the best keys, in candidates' order
    two = [f for f in fits if f[1][0] == 2 and f[1][1] <= TWO_GROUPS_MAX_K_WARPS]
    if token_tiles == 2 and best[0] == 1 and two and not fragments:
        _, split, fill = max(two, key=lambda f: f[0])
        if TWO_GROUPS_MIN_CHAIN <= chain(steps, split[1]) <= chain(steps, best[1]) and fill >= TWO_GROUPS_MIN_FILL:
            best = split
    best = widen_k_warps(n, k, sms, token_tiles, columns, few_tokens, fragments, best)
    if (token_tiles == 2 and best[0] == 2 and fragments in ONE_GROUP_FRAGMENTS
            and grid_warps(n, 2, best[1]) < WIDEN_BELOW_WARPS * sms):
        one = choose_split(n, k, sms, token_tiles, columns, few_tokens, fragments, groups_only=1)
        if grid_warps(n, 1, one[1]) > grid_warps(n, 2, best[1]):
            return one
    return best


def widen_k_warps(n: int, k: int, sms: int, token_tiles: int, columns: str, few_tokens: bool, fragments: str,
                  split: tuple[int, int, int]) -> tuple[int, int, int]:
    """`split` with more k-warps, any number up to K_WARPS_MAX, where that shortens the chain and the grid still fits
    one resident wave (the shortest chain; on a tie the fewest k-warps), with more than 4 tokens a CTA the k-warps
    3/4 busy. The candidates are powers of two, whose CTAs pack an SM's warps best where a thread takes 64 registers;
    where it takes 72 or 80 (16 tokens a CTA) CTAs of 8 k-warps leave a quarter of a wave empty, and 11-14 k-warps
    fill it with a shorter chain (4096 x 14336 at 16 tokens: 8 k-warps of 14 steps each, 65 % of a wave, against 14
    of 8 steps, 97 %). A widened split is capped at the registers the resident-warp model counts (ptxas is told the
    CTAs an SM must hold): uncapped, ptxas gives more with more warps a CTA (x in fragment order at 16 tokens, sm_90a:
    76 registers with 8 k-warps, 82 with 14, one CTA an SM instead of two). Not the block-columns kernel."""
    groups, k_warps, cap = split
    if not WIDEN_K_WARPS or columns or grid_warps(n, groups, k_warps) >= WIDEN_BELOW_WARPS * sms:
        return split
    steps = k_steps(k)
    best = (chain(steps, k_warps), k_warps, cap)
    for kw in range(k_warps + 1, K_WARPS_MAX + 1):
        c = chain(steps, kw)
        if c >= best[0] or (not few_tokens and 4 * steps < 3 * kw * c):
            continue
        if cap and (steps < CAP_MIN_STEPS * kw or not _cap_at(cap, kw)):
            continue
        if grid_warps(n, groups, kw) <= resident_warps(groups, kw, token_tiles, cap, columns, fragments) * sms:
            best = (c, kw, cap or _cap_at(model_registers(groups, token_tiles, columns, fragments), kw))
    return groups, best[1], best[2]


# A cluster only where choose_split's k-warps have at least this many K steps each on the mean: where one k-warp in
# many has a second step, halving the chain did not pay for the cluster's barrier and sum (170 x 4160 at M = 1-12,
# 17 steps on 16 k-warps: 10-20 % slower in clusters of 2), and where most have two it did (256 x 7168, 28 steps:
# 5 % faster; docs/linear_h200_split_rule_check.csv).
K_SPLIT_MIN_STEPS = 1.5


def k_splits_for(n: int, k: int, sms: int, token_tiles: int, groups: int, k_warps: int, cap: int,
                 columns: str = "", min_chain: float = K_SPLIT_MIN_STEPS) -> int:
    """CTAs of a cluster that share K for one row tile, on top of choose_split's split: the cluster size (2, 4 or 8)
    that gives each warp the fewest K steps while the grid still fills at most half a resident wave (so only where
    choose_split's grid fills a quarter of one or less: few rows, N up to about a thousand); the smaller size on
    ties. Each warp then waits out fewer load round trips one after another, at the price of a cluster barrier and a
    sum through distributed shared memory. Graph-timed on the H200 (docs/linear_sweep_h200_k_splits.csv;
    BENCHMARKS.md, "Few rows: K split over a cluster"): 128 x 16384 at M = 1 2.15 x the read with 8 CTAs a cluster,
    against 4.84 unsplit; 512 x 14336 2.28 with 4, against 3.32 unsplit and 3.05 with 8 (a whole wave); clusters that
    filled more than half a wave lost on 2880 x 2880 (1.87 against 1.73). Only where K's steps are at least
    `min_chain` a k-warp on the mean (K_SPLIT_MIN_STEPS)."""
    steps = k_steps(k)
    if cap or steps < min_chain * k_warps:
        return 1
    wave = resident_warps(groups, k_warps, token_tiles, 0, columns) * sms
    warps = grid_warps(n, groups, k_warps)
    best, best_steps = 1, chain(steps, k_warps)
    for s in (2, 4, 8):
        per_warp = chain(steps, k_warps * s)
        if 2 * warps * s <= wave and per_warp < best_steps:
            best, best_steps = s, per_warp
    return best


# At 9-16 tokens, W of at most this many elements (4 MB of codes) is read by two CTAs of 8 tokens each rather than one
# CTA of 16: twice the warps for the grid, each CTA decoding W for its own tokens, the second read mostly from L2.
# Graph-timed on the H200 (docs/linear_sweep_h200_m16_t1b.csv, M = 12 and 16): 7-22 % faster on the eleven shapes
# up to 2048 x 7168 (14.7 M elements; 512 x 2048 2.52 -> 2.02 x the read, 1024 x 4096 2.84 -> 2.25, 2880 x 2880
# 2.32 -> 2.15), 11-15 % slower on 4096 x 4096 and 5760 x 2880 (16.6-16.8 M), where the doubled decode costs more
# than the warps gain. The cut sits at half the smallest loss, below the largest win measured.
SPLIT_TOKENS_MAX_WEIGHT = 1 << 23


# Past 16 tokens, CTAs of 32 tokens (four tiles: W decoded once per 32 tokens, at 128 registers a thread) where they
# take no more token tiles than CTAs of 16 do, i.e. where ceil(M / 16) is even, with x in fragment order (the weights
# x_fragments_for takes past 16 tokens) and bf16 x. Graph-timed on the H200 against 16-token CTAs (bench.token_tiles_ab;
# docs/linear_h200_ab_token_tiles.csv; BENCHMARKS.md, "The A/B runs of 2026-12-05"; 7 shapes, M = 17-127, both
# formats, bf16 x): on the five weights with x in fragment order 0.71-0.99 of the time where ceil(M / 16) is even (M
# = 17, 24, 32, 64, 96, 127; 8192 x 28672 at 17 tokens: 0.73), 0.97-1.05 at 48 (three 16-token tiles against two of
# 32, 64 token slots for 48 tokens); on 2880 x 2880 and 2048 x 768 (x as it is) 0.94-1.30. So a 32-token CTA costs
# about 1.5-1.75 of a 16-token one, and pays only where it pads no more tokens. fp16 x is not measured and keeps 16.
TOKEN_TILES_4_X_DTYPES = ("bf16",)


def pads_no_more_as_32(m: int) -> bool:
    """Whether CTAs of 32 tokens take no more token slots than CTAs of 16 for M tokens: ceil(M / 16) even."""
    return -(-m // 16) % 2 == 0


def token_tiles_for(m: int, n: int, k: int, x_dtype: str = "", fragments: bool = False) -> int:
    """8-token MMA tiles a CTA takes: one up to M = 8; one (two CTAs along M) up to M = 16 where W is small; else
    two (16 tokens a CTA), or past 16 tokens four (32), by the rule above (x_dtype, and x in fragment order)."""
    if m <= 8 or (m <= 16 and n * k <= SPLIT_TOKENS_MAX_WEIGHT):
        return 1
    if m > 16 and fragments and x_dtype in TOKEN_TILES_4_X_DTYPES and pads_no_more_as_32(m):
        return 4
    return 2


# W's loads ask the L2 for the whole 128-byte line on a miss (`.L2::128B`): with one K part a warp's load instruction
# takes 64 bytes of each of 8 rows, half a line, and the other half is the next k-warp's; fetched together they
# come in one DRAM access. `nvfp4-gemv ab w_l2_prefetch` (BENCHMARKS.md, "W's loads with an L2 fetch size"): on the
# H200 0.978 of the time on geomean over 72 points at 1, 8 and 16 tokens (none slower by more than 1 %); on an H100
# 0.982 over 96, the same as without at 4 tokens (two K parts read whole lines already); 256 B no better.
W_L2_PREFETCH = 128

# The default kernel (one launch a call: no block columns, no x in fragment order, no experts) is launched
# programmatically dependent on the stream's previous grid (LinearW4A16Config.pdl; x in fragment order below): its CTAs
# start while that grid drains and wait before their first global load or store, and each lets the next such grid start
# once past its K loop. `nvfp4-gemv ab pdl` on an H100 80GB HBM3 (docs/linear_h100_ab_pdl.csv; BENCHMARKS.md, "The
# linear launched programmatically dependent"), the 12 bench shapes at 1-16 tokens, graph-timed with calls back to back:
# 0.935 of the time on geomean over 76 points, faster at 69 (0.80-1.00), at most 6 % slower at the other 7 (2880 x 2880
# and 5760 x 2880); the gain, about 0.4 us a call, is the next call's start overlapping this one's end, not a faster
# read. Up to PDL_MAX_TOKENS, what was timed and run in the GPU tests of that field
# (test_pdl_waits_for_the_grid_before); past it the calls are the 32-token CTAs and the grid's other order, neither
# timed nor tested with the field. x in fragment order takes it too, its x pass launched so and waiting before its load:
# `nvfp4-gemv ab pdl_fragments` on an H100 (docs/linear_h100_ab_pdl_fragments.csv), 0.963 of the time on geomean over 44
# points at 4-16 tokens, faster at 42; 10240 x 8192 NVFP4 at 16 tokens 1.09-1.11 in three runs, cause not found
# (BENCHMARKS.md, "x in fragment order launched programmatically dependent"). Block columns (two grids, the second a
# reduction over the first's partial sums) are not launched so. A read launched the same way gains as much (0.915 of the
# plain read's time on the same H100): the gain is the launch's, not the kernel's.
PDL = True
PDL_MAX_TOKENS = 16


# From 33 tokens (three 16-token tiles) on a W larger than this, the grid runs token tiles fastest (m_major), so the
# CTAs that read the same rows of W run together and share them through the L2, where row tiles first would stream
# W from DRAM once per token tile. Graph-timed on the H200 (docs/linear_h200_many_tokens.csv, M = 33-127): 6-17 %
# faster on 8192 x 28672 and 28672 x 4096 (117 and 59 MB), equal or up to 8 % slower on W of 29 MB and less, which
# the 50 MB L2 holds either way.
M_MAJOR_MIN_WEIGHT_BYTES = 48 << 20


def m_major_for(m: int, n: int, k: int, rows_per_cta: int) -> bool:
    """Whether the grid runs token tiles fastest (the row tiles then go on the grid's y, at most 65535)."""
    return m > 32 and n * k // 2 > M_MAJOR_MIN_WEIGHT_BYTES and -(-n // rows_per_cta) <= 65535


# Two K parts a row (LinearW4A16Config.k_parts = 2): each weight row on two MMA rows, the MMA's 8 columns 4 tokens
# x 2 parts, 8 lanes reading each row's whole 128-byte line. Graph-timed on the H200 against one part, each with the
# launcher's split for it (docs/linear_h200_k_parts.csv: 18 shapes, NVFP4 and MXFP4, M = 1, 2, 4):
# - at 3-4 tokens two parts are faster or equal (within 1 %) on all but one shape (6144 x 4096 MXFP4, 4 % slower),
#   5-21 % faster on most;
# - at 1-2 tokens they are 2-19 % faster where the one-part grid is thin (under half a resident wave: few rows) or
#   uneven (its CTAs fill the SMs' last round under 90 %: 3072 x 8192 holds 192 CTAs on 132 SMs, 1.65 -> 1.49 x the
#   read), and 4-12 % slower on the full, even grids of large shapes (8192 x 28672 at M = 1: 1.32 against 1.45).
# A check on 12 more shapes (docs/linear_h200_k_parts_check.csv, M = 1-4) found one more rule: where the two-part
# split is CTAs of one 8-row group and fewer than 4 warps (18944 x 3584: 2 warps), every CTA reads all of x for 8
# rows, and two parts were 9-22 % slower; those keep one part.
#
# Past 4 tokens (docs/linear_h200_k_parts_tokens.csv: the 30 shapes of both checks, M = 6, 8, 12, 16, against two
# parts with one 4-token tile, CTAs along M, and with two tiles of 4): two parts were 18-24 % faster on the rows
# so few that one part takes a cluster (256 x 4096, 512 x 7168 at 6-8 tokens), 3-10 % on 896 x 4864 and 1024 x 4096
# at 6-8 tokens, and 5-67 % slower elsewhere (each CTA along M decodes W again). So from 5 to 16 tokens, two parts
# and 4-token CTAs along M only where one part would need a cluster.
K_PARTS_MAX_TOKENS = 4
K_PARTS_ALWAYS_TOKENS = 3
K_PARTS_MIN_BALANCE = 0.9


def _split(m: int, n: int, k: int, sms: int, parts: int, token_tiles: int, columns: str = "", fragments: str = ""):
    """(rows, K a row, groups, k_warps, register cap, k_splits) the launcher chooses for M tokens with `parts` K parts
    a row and `token_tiles` tiles a CTA (`columns`, a format: the block-columns kernel, 2 tokens a CTA): the split
    sees the CTAs along M (up to 16 tokens; 9-16 tokens in 8-token CTAs: two) as more rows, and two K parts a row as
    twice the rows of half the steps."""
    rows = n * -(-min(m, 16) // ((2 if columns else 8 // parts) * token_tiles)) * parts
    k_row = k // parts
    few_tokens = bool(columns) or parts >= 2 or m <= K_PARTS_MAX_TOKENS  # at most 4 tokens a CTA
    groups, k_warps, cap = choose_split(rows, k_row, sms, token_tiles, columns, few_tokens, fragments)
    return rows, k_row, groups, k_warps, cap, k_splits_for(rows, k_row, sms, token_tiles, groups, k_warps, cap,
                                                           columns)


def k_parts_for(m: int, n: int, k: int, sms: int, fragments: str = "") -> int:
    """1 or 2 K parts a row for M tokens (see K_PARTS_MAX_TOKENS): two at 3-4 tokens; at 1-2 where one part's
    grid (choose_split's split, k_splits_for's cluster) fills under half a resident wave or leaves the SMs' last
    round of CTAs under K_PARTS_MIN_BALANCE full; at 5-16 where a cluster would shorten one part's chain at all
    (k_splits_for with min_chain 1: the test the measurement below was made with); never past 16 tokens,
    nor where the two-part split is CTAs of one group and fewer than 4 warps. `fragments`: the key of x in fragment
    order (fragments_key), which the two-part split is chosen with (UNCAPPED_FRAGMENTS)."""
    if m > 16:
        return 1
    _, _, groups2, k_warps2, _, _ = _split(m, n, k, sms, 2, 1, "", fragments)
    if groups2 == 1 and k_warps2 < 4:
        return 1
    if K_PARTS_ALWAYS_TOKENS <= m <= K_PARTS_MAX_TOKENS:
        return 2
    tiles = token_tiles_for(m, n, k)
    rows, k_row, groups, k_warps, cap, splits = _split(m, n, k, sms, 1, tiles)
    ctas = -(-rows // (16 * groups)) * splits
    if m > K_PARTS_MAX_TOKENS:  # rows so few that a cluster would shorten the chain at all (min_chain 1, as measured)
        return 2 if k_splits_for(rows, k_row, sms, tiles, groups, k_warps, cap, min_chain=1) > 1 else 1
    thin = 2 * ctas * k_warps < resident_warps(groups, k_warps, 1, cap) * sms
    return 2 if thin or last_wave_fill(ctas / sms) < K_PARTS_MIN_BALANCE else 1  # CTAs per SM, as rounds


# Two accumulator sets (LinearW4A16Config.acc_sets = 2: a step's MMAs alternate between them, two chains of 4
# instead of one of 8 per (group, tile)). Graph-timed on the H200 against one set (docs/linear_h200_acc_sets.csv,
# the 12-shape suite at M = 1, 4, 16, both formats): slower wherever the added registers cost resident warps (up to
# 43 % on 28672 x 4096 at M = 1, where 2-group CTAs at 72 registers go to 80), and 4-10 % faster on the 16-token
# CTAs of two groups, whose registers the resident-warp model already counts at 128 (28672 x 4096 and 14336 x 4096
# at M = 16). MXFP4 with fp16 x keeps one: on the general path (x as bf16 hi + lo, twice the MMAs) two sets take 143
# registers, and with the scale fold (registers capped at 128) two sets were 0.99-1.06 x one set's time at 10-16
# tokens, 1.03 on geomean over 15 points (docs/linear_h200_mx_fold_rules.csv).
# Checked on 10 shapes at M = 12-64, 8 of them new (docs/linear_h200_acc_sets_check.csv): 0.931 of one set's time
# over the 90 points that take two sets (0.937 on the new shapes), worst 1.031 (8-k-warp CTAs, NVFP4).
def acc_sets_for(groups: int, token_tiles: int, fmt: str, x_dtype: str) -> int:
    """Accumulator sets a config takes: two for two groups of two token tiles (not MXFP4 with fp16 x), else one."""
    return 2 if (groups, token_tiles) == (2, 2) and not (fmt == "mxfp4" and x_dtype == "fp16") else 1


# Block columns (LinearW4A16Columns: x prepared once a call as f16, W decoded to f16, the block scales applied after
# the MMA; 145-152 loop instructions a 128-K step on sm_90a, against 198 for the default kernel with NVFP4 and 233 with
# MXFP4, whose scales cost two HMUL2 a pair there). Graph-timed on the H200 against the dispatched kernel at 1-2 tokens
# (docs/linear_h200_block_columns.csv: 20 shapes, both formats, bf16 x): MXFP4 on weights of 29 MB and more, with the
# split's one-group CTAs, 2-14 % faster on all 18 such points (16384 x 16384: 1.59 -> 1.36 x the read, 8192 x 28672
# 1.59 -> 1.38, 14336 x 4096 1.54 -> 1.49); two-group splits (80 registers) 6-9 % slower; smaller weights slower (the
# x pass, a second kernel, costs ~1-2 us a call: 6144 x 4096 4 % slower, 2048 x 768 37 %); NVFP4 slower everywhere
# (5-63 %), 3-4 tokens (two CTAs along M, each decoding W) 38-260 % slower.
# With fp16 x the default kernel runs MXFP4 as bf16 hi + lo, twice the MMAs (2.1-2.6 x the read at 1-2 tokens), and
# block columns take fp16 x as it is: 1.33-1.62 x on the 7 shapes of 12.6 MB and more (6144 x 4096 2.09 -> 1.53;
# docs/linear_h200_block_columns_fp16.csv), slower only on 2048 x 768 (0.8 MB: 1.40 -> 1.95, where the default
# kernel takes two K parts). With the scale fold (mx_fold_for), which takes fp16 x as it is on steps whose scales fit,
# the default kernel at 1-2 tokens was 0.94-0.98 of block columns' time on 12-16 MB of codes (6144 x 4096: 7.50
# against 8.00 us; 4096 x 7168, 4096 x 8192) and 0.99-1.26 x it from 20 MB (5120 x 8192 1.14, 8192 x 8192
# 1.07-1.09, 28672 x 4096 1.26; docs/linear_h200_mx_fold_first.csv, docs/linear_h200_mx_fold_columns.csv): the cut is
# the smallest loss.
# With bf16 x, block columns were taken from 24 MB of codes until bf16's whole-K scale fold (mx_fold_redo_for) came;
# against that fold they lost on both GPUs (`ab columns_or_fold`, 1-2 tokens, the bench shapes and 24 drawn ones, the
# fold's time / block columns': on the H200 geomean 0.953 over 24 points, 0.876-1.061, the fold faster at 19;
# docs/linear_h200_ab_columns_or_fold.csv; on an H100 0.926, faster at 22, docs/linear_h100_ab_columns_or_fold.csv).
# So bf16 x takes no block columns; fp16 x (the same runs: 1.086 on the H200, 1.036 on the H100) keeps its cut.
COLUMNS_MIN_WEIGHT_BYTES = {"fp16": 20 << 20}  # x dtype -> the least codes (N·K/2 bytes) of a block-columns call


def block_columns_for(m: int, n: int, k: int, fmt: str, sms: int, x_dtype: str = "bf16") -> bool:
    """Whether M tokens of N x K take the block-columns kernel: MXFP4 with an x dtype COLUMNS_MIN_WEIGHT_BYTES
    names (fp16), 1-2 tokens, at least that many bytes of codes, and a split of one-group CTAs."""
    least = COLUMNS_MIN_WEIGHT_BYTES.get(x_dtype)
    if fmt != "mxfp4" or m > 2 or least is None or n * k // 2 < least:
        return False
    return _split(m, n, k, sms, 1, 1, fmt)[2] == 1


# x in fragment order (LinearW4A16Fragments: a first kernel writes x once a call in the order of the main loop's
# loads and B registers; the loop then has no PRMT and a warp's x load is 512 contiguous bytes, 4 L1 wavefronts
# instead of 16). The loop is 6-11 % shorter and, from 3 tokens, relieves the L1's data pipe, but the first kernel
# costs about 1 us a call. Graph-timed on the H200 against the default kernel, the same split
# (docs/linear_h200_x_fragments_op.csv: 12 shapes, M = 1-4, 8, 12, 16, both formats; BENCHMARKS.md, "x in fragment
# order"): the cut on the weight's codes (N·K/2 bytes) lies between the largest loss and the smallest win of each
# token class: 3-4 tokens from 28 MB (14 MB lost 1-4 %; 28-112 MB 0.87-1.02), 5-8 from 8 MB (7.9 MB lost 1-5 %,
# 8-112 MB 0.79-1.00), 9-16 from 6 MB (4 MB lost 1-9 %, 7.9-112 MB 0.78-1.01); at 1-2 tokens never (0.96-1.38).
# MXFP4 with fp16 x, when every step took x as a bf16 hi + lo pair (twice the MMAs), lost 6-14 % at 3 and 6 tokens
# on 12 shapes drawn after the cuts were set (docs/linear_h200_x_fragments_heldout.csv) and kept the default kernel
# up to 8 tokens; with the scale fold (mx_fold_for), the same cuts took 0.92 of the default kernel's time on geomean
# at 3-8 tokens over 46 points of the 12 suite shapes and 8 drawn for the run (docs/linear_h200_mx_fold_rules.csv;
# worst 1.16, 8192 x 28672 at 6 tokens), so it takes them too.
X_FRAGMENTS_MIN_CODE_BYTES = ((2, None), (4, 28 << 20), (8, 8 << 20), (16, 6 << 20))  # (up to M, bytes or None)


def x_fragments_for(m: int, n: int, k: int, fmt: str, x_dtype: str = "bf16") -> bool:
    """Whether M tokens of N x K take x in fragment order: from X_FRAGMENTS_MIN_CODE_BYTES of M's token class (past
    16 tokens, as at 16: every CTA is a 16-token one)."""
    least = next((b for top, b in X_FRAGMENTS_MIN_CODE_BYTES if m <= top), X_FRAGMENTS_MIN_CODE_BYTES[-1][1])
    return least is not None and n * k // 2 >= least


# MXFP4's scale fold (LinearW4A16Config.mx_fold; cute_kernels/linear_w4a16.py, MX_FOLD): a warp's step whose
# scales all fit (bf16: at most 2^1; f16: 2^-20 to 2^9) multiplies each placed pair by one multiplier, and with fp16 x
# runs f16 MMAs on x as it is instead of bf16 ones on x as a hi + lo pair (half the MMAs); the first step with a scale
# outside sends the warp to the general path for the rest of its K. On sm_90a the fold's loop is 192 instructions a
# step with fp16 x against 402 (bf16 x: 207 against 233), and the kernel holds both loops, so more registers where a
# thread has more than one group or token tile (fp16 x: 120 at two groups, 95 at two token tiles, 162-168 at both):
# mx_fold_cap caps them at the resident-warp model's. Graph-timed on the H200, the dispatched config against the same
# split on the general path (bench.mx_fold_ab; docs/linear_h200_mx_fold.csv, BENCHMARKS.md "MXFP4's scale fold"),
# fp16 x, M = 1-16: with scales of 2^-15..2^1 (what checkpoints hold) 0.48-0.96 of the time over 59 points, 0.72
# geomean on 8 random shapes drawn for the run (4992 x 7040 at 16 tokens: 24.4 -> 12.9 us); with scales over the
# whole e8m0 range (every warp leaves the fold at its first step) 1.01-1.25 x, 1.16 geomean over 22 points. With bf16
# x (docs/linear_h200_mx_fold_bf16.csv, 3 shapes, M = 1, 4, 16) that fold, capped, was 0.90-1.07 with checkpoint
# scales and 1.02-1.10 over the whole range.
#
# With bf16 x the fold goes the other way (LinearW4A16Config.mx_fold_redo): every step on the fold, one compare a
# scale, and the warp's K again on the general path where a vote after the loop finds a scale outside 2^-63..2^17 (the
# fold's products carry 2^-16 there, put back on the warp's sums after the loop: MX_FOLD_SHIFT; unshifted, its range
# ended at 2^1, and the bench's own scales, 2^-9..2^3, sent every warp to the redo). Its loop is 187 instructions a
# step against the general 233 (NVFP4's: 198) at 62 registers, NVFP4's count. Measured on an H100 (no H200 was lent
# that day; `nvfp4-gemv ab mx_fold_bf16`, docs/linear_h100_ab_mx_fold_bf16.csv, the 12 bench shapes at 1-16 tokens,
# block-columns points left out, two alternating rounds): with checkpoint scales (2^-15..2^1) 0.886-0.992 of the
# general path's time at 32 of the 33 points of the eight weights of 8 MB of codes or more where the split takes no
# cap below 56 registers (4096 x 4096 at 16 tokens: 1.025); 0.98-1.07 on the three weights of 4 MB or less (a short
# kernel, where the vote and the second loop's code cost more than the loop saves); 1.02-1.05 where the split caps the
# registers at 48 (10240 x 8192 at 1, 2 and 8 tokens: the fold's loop spills there). Over the whole e8m0 range every
# warp redoes its K: 1.47-1.60 x. The A/B timed both at the fold's split; where x in fragment order counts fewer
# registers without the fold (FRAGMENT_REGISTERS: one group of 16 tokens), that split is not the general path's. So
# bf16 x takes the fold from MX_FOLD_MIN_CODE_BYTES of codes, at 1-16 tokens, where its split is the general path's
# own and the split's cap, if any, is at least MX_FOLD_MIN_CAP: 27 of the A/B's points, 0.886-0.992 (0.958 on
# geomean).
#
# That A/B drew its scales from 2^-15..2^1. At the bench's own (MXFP4_SCALES, 2^-9..2^3) every warp met a scale past
# 2^1 and redid its K: on an H100 1.20-1.80 x the vote a step's time, 1.59 x the general path's on geomean over 15
# dispatched points (docs/linear_h100_ab_mx_fold_designs.csv). The fold's range with bf16 x now reaches 2^17
# (MX_FOLD_SHIFT), and at those scales the same 15 points take 0.915-0.988 of the general path's time, 0.962 on
# geomean (H100, `nvfp4-gemv ab mx_fold_designs`, docs/linear_h100_ab_mx_fold_designs_2.csv; bench.mx_fold_ab,
# docs/linear_h100_ab_mx_fold_bf16_2.csv, every point at 1, 4 and 16 tokens: 0.82-1.06 at the bench's scales, the
# points over 1.0 all ones the rule leaves out but 4096 x 4096 at 4 tokens, 1.004; 1.23-1.89 where the scales span the
# whole e8m0 range and every warp redoes its K). The H200 A/B is still to be run.
#
# Under the 48-register cap (CAPS) the fold against the general path, every point of the bench shapes and 40 drawn
# ones at 1-8 tokens where the rule left the cap out (H100, docs/linear_h100_ab_mx_fold_min_cap.csv, 40 points): with x
# in fragment order 0.93-1.01 (0.975 on geomean over 22 points; none over 1.008), without it 1.03-1.12 over all 18. So
# the cap leaves the fold out only where x is loaded plain (MX_FOLD_MIN_CAP; MX_FOLD_MIN_CAP_FRAGMENTS with x in
# fragment order).
MX_FOLD_X_DTYPES = ("fp16", "bf16")
MX_FOLD_MIN_CODE_BYTES = {"fp16": 0, "bf16": 6 << 20}
MX_FOLD_MIN_CAP = 56
MX_FOLD_MIN_CAP_FRAGMENTS = 0


def mx_fold_for(fmt: str, x_dtype: str, n: int = 0, k: int = 0) -> bool:
    """Whether MXFP4 with x_dtype on an N x K weight takes the scale fold (MX_FOLD_X_DTYPES, from
    MX_FOLD_MIN_CODE_BYTES of codes)."""
    return fmt == "mxfp4" and x_dtype in MX_FOLD_X_DTYPES and n * k // 2 >= MX_FOLD_MIN_CODE_BYTES[x_dtype]


def mx_fold_redo_for(x_dtype: str) -> bool:
    """Whether the scale fold takes the warp's whole K and redoes it where a scale left the range (bf16 x), or votes
    each step and leaves the fold at the first that does not fit (fp16 x, whose range starts at 2^-20)."""
    return x_dtype == "bf16"


def mx_fold_cap(groups: int, k_warps: int, token_tiles: int) -> int:
    """The register cap that keeps a split with the scale fold at the registers the resident-warp model counts for
    it (REGISTERS, with x in fragment order too: fragments_key), or 0 where a cap would leave fewer than 2 CTAs an
    SM. One group of one token tile needs it too: with two K parts or x in fragment order the fold takes 72-80
    registers uncapped (sm_90a), one CTA an SM fewer than the model counts, which turned one-wave grids into two
    (8192 x 28672 at 4 tokens, fp16 x: 2.11 x the read); capped at 64, ptxas spills nothing."""
    regs = REGISTERS.get((groups, token_tiles))  # none for a split the launcher never chooses (4 groups): uncapped
    return _cap_at(regs, k_warps) if regs else 0


def fragments_cap(groups: int, k_warps: int, token_tiles: int, x_dtype: str) -> int:
    """The register cap of a split with x in fragment order (not the fold) where its FRAGMENT_REGISTERS entry is met
    only when ptxas is told (FRAGMENT_CAPS), else 0; 0 too where the cap would leave fewer than 2 CTAs an SM."""
    key = (groups, token_tiles, x_dtype)
    return _cap_at(FRAGMENT_REGISTERS[key], k_warps) if key in FRAGMENT_CAPS else 0


def _cap_at(regs: int, k_warps: int) -> int:
    """`regs` as a register cap for CTAs of k_warps warps, or 0 where it would leave fewer than 2 of them an SM
    (LinearW4A16Config's bound on a cap)."""
    return regs if REGISTER_FILE // (regs * 32 * k_warps) >= 2 else 0


def config_for(m: int, n: int, k: int, fmt: str, scale_layout: str, x_dtype: str, bias: bool, global_scale: bool,
               sms: int = H200_SMS, **override):
    """The kernel config for one call shape: the token tiles from token_tiles_for, the split from choose_split, and
    K split over a cluster from k_splits_for; both see the CTAs along M as more rows. Past 32 tokens, the grid's
    order from m_major_for."""
    # The rules hold unless a sweep or test names other config fields; naming the scale fold (on or off) or the
    # scale dtype leaves the split's rules in force, so the fold can be compared at the split it would run on.
    named = set(override) - {"sf_dtype", "mx_fold", "mx_fold_redo"}
    columns = override.get("block_columns")
    if columns is None:
        columns = not named and not override.get("mx_fold") and block_columns_for(m, n, k, fmt, sms, x_dtype)
    fragments = override.get("x_fragments")
    if fragments is None:
        fragments = named <= {"block_columns"} and not columns and x_fragments_for(m, n, k, fmt, x_dtype)
    fold = override.get("mx_fold")
    fold_rule = fold is None
    if fold_rule:
        fold = not columns and mx_fold_for(fmt, x_dtype, n, k)

    def key(fold):  # x in fragment order's key for the split rules, with or without the fold
        return fragments_key(x_dtype, fold) if fragments else ""

    parts = 1 if columns else override.get("k_parts") or k_parts_for(m, n, k, sms, key(fold))
    token_tiles = 1 if columns else override.get("token_tiles") or (
        1 if parts >= 2 else token_tiles_for(m, n, k, x_dtype, fragments))

    def split(fold):
        return _split(m, n, k, sms, parts, token_tiles, fmt if columns else "", key(fold))

    chosen = split(fold)
    if fold_rule and fold and mx_fold_redo_for(x_dtype):
        # bf16 x takes the fold where it replaces the general path at the general path's own split, up to 16 tokens
        # (as measured), and not under a cap its loop spills at unless x is in fragment order
        general = split(False)
        least = MX_FOLD_MIN_CAP_FRAGMENTS if fragments else MX_FOLD_MIN_CAP
        if chosen != general or 0 < chosen[4] < least or m > 16:
            fold, chosen = False, general
    _, _, groups, k_warps, cap, splits = chosen
    redo = override.get("mx_fold_redo", fold and mx_fold_redo_for(x_dtype))
    override = {**override, "block_columns": columns, "x_fragments": fragments, "mx_fold": fold,
                "mx_fold_redo": redo}
    # An override of the split (sweeps, tests) means that split on its own, uncapped and unclustered unless it names
    # max_registers and k_splits too.
    if any(f in override for f in ("groups", "k_warps", "max_registers")):
        splits = 1
    if any(f in override for f in ("groups", "k_warps", "k_splits")):
        cap = 0
    m_major = not columns and splits == 1 and m_major_for(m, n, k, 16 // parts * override.get("groups", groups))
    cfg = dict(fmt=fmt, sf_kind=SCALE_LAYOUTS[scale_layout], x_dtype=x_dtype, token_tiles=token_tiles,
               groups=groups, row_warps=1, k_warps=k_warps, bias=bias, global_scale=global_scale, max_registers=cap,
               k_splits=splits, m_major=m_major, k_parts=parts, w_l2_prefetch=W_L2_PREFETCH,
               pdl=PDL and m <= PDL_MAX_TOKENS and not columns,
               acc_sets=1 if columns else acc_sets_for(override.get("groups", groups), token_tiles, fmt, x_dtype))
    cfg.update(override)
    if fold and not cfg["max_registers"] and cfg["k_splits"] == 1:
        cfg["max_registers"] = mx_fold_cap(cfg["groups"], cfg["k_warps"], cfg["token_tiles"])
    elif fragments and not cfg["max_registers"] and cfg["k_splits"] == 1:
        cfg["max_registers"] = fragments_cap(cfg["groups"], cfg["k_warps"], cfg["token_tiles"], x_dtype)
    return LinearW4A16Config(**cfg)


_DUMMIES: dict = {}


def _dummy(device, dtype):
    key = (device, dtype)
    t = _DUMMIES.get(key)
    if t is None:
        t = _DUMMIES[key] = torch.zeros(1, dtype=dtype, device=device)
    return t


def kernel_class(cfg) -> tuple:
    """(the kernel class that runs `cfg`, the kind of the x pass its call launches first: "columns", "fragments" or
    None). A routed config (`experts`) runs LinearW4A16Experts; its run table, when it has one, is a separate launch."""
    if cfg.experts:
        return LinearW4A16Experts, None
    if cfg.block_columns:
        return LinearW4A16Columns, "columns"
    if cfg.x_fragments:
        return LinearW4A16Fragments, "fragments"
    return LinearW4A16, None


def plan_for(m, n, k, device, x_dtype, scale_dtype, fmt, scale_layout, has_global_scale, has_bias, **override):
    """(compiled function, global-scale stand-in, bias stand-in) for a call shape: the config chosen (with
    `override`'s fields, for sweeps) and compiled (compile_kernel keeps each compiled config). `bind` keeps the plan
    of each signature, so a launch does not come back here."""
    fields = {"sf_dtype": _SF_DTYPES[scale_dtype], **override}
    cfg = config_for(m, n, k, fmt, scale_layout, _X_DTYPES[x_dtype], has_bias, has_global_scale,
                     sm_count(device.index), **fields)
    cls, kind = kernel_class(cfg)
    fn = raw_function(compile_kernel(cls, cfg, target(capability(device)), stream="torch"))
    return fn, _dummy(device, torch.float32), _dummy(device, x_dtype), kind


class Workspace:
    """The x a call's first kernel prepares and its second reads: for block columns (LinearW4A16Columns) x as
    (M, prepared_words(K)) uint32 and a factor a token, (M,) fp32; for x in fragment order (LinearW4A16Fragments)
    fragment_words(M, K) uint32.

    Eager calls reuse one set per (kind, M, stream, thread), so a call allocates nothing but y (allocations a call
    were most of the block-columns path's host time; BENCHMARKS.md, "Block scales after the MMA"). That is safe
    because work on one stream runs in order and the first kernel is launched without programmatic dependence, so
    it starts only once the previous call's second kernel has finished; calls from another stream or thread get
    their own set, so no call overwrites x that another has yet to read. Under CUDA-graph capture every call
    allocates its own set from the graph's pool: a replay must not share a workspace with eager calls or with
    other graphs."""

    MAX_ENTRIES = 64  # (kind, M, device, stream, thread) sets kept; past that the cache starts again (a few KB each)

    def __init__(self, k: int, device):
        self.k = k
        self.index = torch.device(device).index  # None: the current device at each call, as torch.empty takes it
        self.sets: dict = {}

    def fresh(self, kind: str, m: int, index: int):
        if kind == "columns":
            return (torch.empty(m, prepared_words(self.k), dtype=torch.uint32, device=index),
                    torch.empty(m, dtype=torch.float32, device=index))
        return (torch.empty(fragment_words(m, self.k), dtype=torch.uint32, device=index),)

    def __call__(self, kind: str, m: int):
        index = torch.cuda.current_device() if self.index is None else self.index
        if torch.cuda.is_current_stream_capturing():
            return self.fresh(kind, m, index)
        key = (kind, m, index, torch._C._cuda_getCurrentRawStream(index), threading.get_ident())
        got = self.sets.get(key)
        if got is None:
            if len(self.sets) >= self.MAX_ENTRIES:
                self.sets.clear()
            got = self.sets[key] = self.fresh(kind, m, index)
        return got


# Rows of x a launch of the fp4 kernels takes at most: the token tiles go on a grid dimension of at most 65535 CTAs
# (the main kernel's y unless token tiles run fastest; the x-fragment pass's y, 8 tokens a CTA), so a call past
# this (MXFP4 with fp16 x stays on these kernels at every M) is launched in chunks of rows, each a multiple of 16
# and 16-byte aligned in x and y.
M_CHUNK = 65528 * 8
# Calls of up to this many rows keep their plan by M in the bound launch, so that a decode step's call skips the
# prefill test, the size check and the token class (about 0.7 of the launch's 1.1 µs of Python, CPU machine).
DECODE_ROWS = 64


def bind(n, k, device, x_dtype, scale_dtype, fmt, scale_layout, has_global_scale, has_bias, **override):
    """The launch of one call signature (everything but M and the data): `launch(out2d, x2d, weight_u8, scale,
    global_scale, bias)`. A call of up to DECODE_ROWS rows costs a dict lookup by M and the TVM-FFI launch, once its M
    has been seen; any other, the size check (M enters it), one dict lookup and the launch; the config is chosen and
    compiled on the first call of each token class (M <= 2, 3-4, 5-8, 9-12, 13-16, 17-32, more with ceil(M / 16)
    even, more with it odd: within each, k_parts_for, token_tiles_for and m_major_for give one answer; past M_CHUNK
    rows, one launch a chunk of them). From prefill.PREFILL_MIN_TOKENS tokens (not with
    `override`, which names a config of the fp4 kernel) the call goes to the dequantize-and-GEMM path instead
    (nvfp4_gemv/linear/prefill.py)."""
    plans = {}
    by_rows = {}  # M -> its plan, for M <= DECODE_ROWS on the fp4 kernels (the size check passed): one lookup a call
    workspace = Workspace(k, device)

    def launch(out2d, x2d, weight_u8, scale, global_scale, bias):
        m = x2d.shape[0]
        plan = by_rows.get(m)
        if plan is None:
            many = not override and prefill.takes(m, fmt, x_dtype)
            if m > M_CHUNK and not many:  # each chunk's offsets count from its own rows: the size check is a chunk's
                for m0 in range(0, m, M_CHUNK):
                    launch(out2d[m0:m0 + M_CHUNK], x2d[m0:m0 + M_CHUNK], weight_u8, scale, global_scale, bias)
                return
            if not LinearW4A16.can_implement(m, n, k):
                raise ValueError(f"fp4_linear: (M, N, K) = ({m}, {n}, {k}) is too large or malformed for the kernel: "
                                 f"{LinearW4A16.can_implement.__doc__} Split the call along M or N.")
            if many:
                run_many = plans.get("prefill")
                if run_many is None:
                    run_many = plans["prefill"] = prefill.bind(n, k, device, x_dtype, scale_dtype, fmt, scale_layout)
                run_many(out2d, x2d, weight_u8, scale, global_scale, bias)
                return
            tokens = (m < K_PARTS_ALWAYS_TOKENS, m <= K_PARTS_MAX_TOKENS, m <= 8, m <= 12, m <= 16, m <= 32,
                      pads_no_more_as_32(m))
            plan = plans.get(tokens)
            if plan is None:
                plan = plans[tokens] = plan_for(m, n, k, device, x_dtype, scale_dtype, fmt, scale_layout,
                                                has_global_scale, has_bias, **override)
            if m <= DECODE_ROWS:
                by_rows[m] = plan
        fn, gs_dummy, bias_dummy, prepared = plan
        if global_scale is None:
            global_scale = gs_dummy
        elif global_scale.dim() != 1 or global_scale.stride(0) != 1:  # the kernels take a 1-D tensor of stride 1:
            global_scale = global_scale.as_strided((1,), (1,))  # a checkpoint's 0-dim scale, (1, 1), an expand
        operands = (x2d, weight_u8, scale, out2d, global_scale, bias_dummy if bias is None else bias)
        if prepared:
            fn(*operands, *workspace(prepared, m))
        else:
            fn(*operands)

    return launch


def run(out2d, x2d, weight_u8, scale, fmt, scale_layout, global_scale, bias, **override) -> None:
    """out2d[M, N] = x2d · dequant(W)ᵀ (+ bias), on torch's current stream. Operands already validated; the scales
    may be uint8 or (NVFP4) float8_e4m3fn, read as bytes either way. `bind`, for one call."""
    bind(weight_u8.shape[0], x2d.shape[1], x2d.device, x2d.dtype, scale.dtype, fmt, scale_layout,
         global_scale is not None, bias is not None, **override)(out2d, x2d, weight_u8, scale, global_scale, bias)


# Slots that share an expert grouped on the device (expert_group) against one slot a CTA row, graph-timed on the H200
# (docs/experts_h200_groups.csv; BENCHMARKS.md, "Shared experts on the H200"): where nothing is shared the groups'
# scan and 8-token tiles cost 10-15 % (20-38 % on 0.8 MB experts); from a slot an expert on average, router-like
# routing made the groups 1.27-1.31 x faster on experts of 4 MB of codes and more, and up to 2.4-3.2 x at 4-8 slots an
# expert; 1.5 MB experts lost at one slot an expert (0.77-0.98) and gained from two (1.06-1.27); 0.8 MB experts lost
# at every count up to 16 an expert (0.48-0.81: the one-slot kernel's repeated reads of so small an expert come from
# L2, and each CTA's scan of the ids is the same length whatever the expert's size).
GROUP_MIN_CODES = 1 << 20  # N·K/2 bytes of an expert, least, for groups
GROUP_ONE_SLOT_CODES = 2 << 20  # from here, groups from one slot an expert on average; below it, from two


def expert_group_for(tokens: int, slots: int, experts: int, n: int, k: int) -> bool:
    """Whether a routed call of `tokens` tokens (`slots` (token, expert) pairs over `experts` experts of N x K) groups
    the slots that share an expert: more than one token (one token's experts are distinct), experts of at least
    GROUP_MIN_CODES, and at least one slot an expert on average (two below GROUP_ONE_SLOT_CODES)."""
    codes = n * k // 2
    if tokens < 2 or codes < GROUP_MIN_CODES:
        return False
    return slots >= experts * (1 if codes >= GROUP_ONE_SLOT_CODES else 2)


def experts_config(n: int, k: int, fmt: str, x_dtype: str, ids_dtype: str, bias: bool, global_scale: bool,
                   sms: int = H200_SMS, tokens: int = 2, top_k: int = 1, experts: int = 1,
                   **override) -> LinearW4A16Config:
    """The config of a routed launch (LinearW4A16Experts) of `tokens` tokens routed to `top_k` of `experts`: each slot's
    CTAs split one expert's N rows as a one-token call of that expert would (config_for of (1, N, K)), but with one K
    part and at most EXPERTS_K_WARPS k-warps, since slots times that call's CTAs fill the GPU where one call's may not;
    without the kernels that prepare x first. Measured on an H100 (BENCHMARKS.md, "Routed experts"): within 7 % of the
    best of five splits at 17 of 18 points of the bench's MoE shapes at 1, 4 and 16 tokens, where splitting N·slots rows
    as one weight took up to 2.0 x the time (two groups, one k-warp) and the one-token call's own split up to 1.6 x (two
    K parts). Where experts_route says, the slots that share an expert are grouped on the device: runs of up to 8 of
    them (the MMA's columns), so one read of the expert serves a run, either found by a scan of the ids by the CTA row
    of a run's first slot (expert_group) or read from a table made before the launch (expert_runs, a CTA row a run;
    runs of two token tiles, 16 slots, where run_tiles_for says, on the same split, so that a slot's sums are the same
    bits whatever run it is in); otherwise each slot is computed alone, without the scan."""
    one = config_for(1, n, k, fmt, "plain", x_dtype, bias, global_scale, sms, block_columns=False, x_fragments=False)
    group, runs = override.pop("expert_group", None), override.pop("expert_runs", None)
    if group is None and runs is None:
        group, runs = experts_route(tokens, top_k, experts, n, k)
    tiles = override.get("token_tiles") or (run_tiles_for(tokens * top_k, experts) if runs else 1)
    fields = {"groups": one.groups, "k_warps": min(one.k_warps, EXPERTS_K_WARPS), "k_parts": 1,
              "block_columns": False, "x_fragments": False, "pdl": False, "token_tiles": tiles, **override}
    cfg = config_for(1, n, k, fmt, "plain", x_dtype, bias, global_scale, sms, **fields)
    return LinearW4A16Config(**{**cfg.__dict__, "experts": "i32" if runs else ids_dtype,  # runs: the table's int32
                                "expert_group": bool(group), "expert_runs": bool(runs)})


EXPERTS_K_WARPS = 4


def describe_experts(tokens: int, top_k: int, experts: int, n: int, k: int, fmt: str, x_dtype, bias: bool = False,
                     global_scale: bool = False, sms: int = H200_SMS) -> str:
    """Which kernel and config serve a routed call of `tokens` tokens routed to `top_k` of `experts` experts each
    (FP4Experts.path), in words."""
    cfg = experts_config(n, k, fmt, _X_DTYPES.get(x_dtype, x_dtype), "i64", bias, global_scale, sms, tokens, top_k,
                         experts)
    one = describe(1, n, k, fmt, x_dtype, groups=cfg.groups, k_warps=cfg.k_warps, k_parts=1, block_columns=False,
                   x_fragments=False)
    return (f"linear_w4a16_experts: one launch of {tokens * top_k} (token, expert) slots x "
            f"{-(-n // cfg.rows_per_cta)} row tiles, each CTA on the expert its id names"
            + (f", the slots that share it in runs of up to {cfg.tile_tokens} (one CTA row a run)" if cfg.expert_group
               else "")
            + (f", the slots that share it in runs of up to {cfg.tokens_per_cta} from a run table made on the device "
               f"(a CTA row a run)" if cfg.expert_runs else "")
            + f", split as one expert's one-token call with one K part and at most {EXPERTS_K_WARPS} k-warps: " + one)


# Slots of one routed launch at most: one CTA row a slot on the grid's y (at most 65535), so a call with more
# (token, expert) slots is launched in chunks of whole tokens.
SLOTS_CHUNK = 65535
# Tokens from which a routed call takes its runs from a table made on the device (expert_runs), where the slots an
# expert reach RUNS_MIN_SHARE, instead of the scan or one slot a CTA row. With the table from the torch ops the cut was
# 64 (H200, docs/experts_h200_runs.csv; BENCHMARKS.md, "The run table on the H200": the ops cost 45-52 µs a call). With
# the table from one kernel (RUN_TABLE_KERNEL; 2.6-3.2 µs a call up to 64 slots), graph-timed on an H100 over the
# bench's six MoE shapes with a router's random ids (docs/run_table_ab_h100.csv, docs/run_table_ab_small_h100.csv;
# BENCHMARKS.md, "The run table's kernel and runs of 16"), the tabled runs took, of the time of the kernel dispatched
# below the cut: 1.31 at 1 token, 1.20 at 2, 1.06 at 4, 0.95 at 8 (0.91-1.03), 0.85 at 16 (0.78-0.90), 0.72 at 32; with
# ids that name distinct experts round the E (no sharing), 1.03 at 8 (0.94-1.15).
RUNS_MIN_TOKENS = 8
# Slots an expert on average (slots / E) from which the tabled runs are taken, for experts of GROUP_MIN_CODES up to
# RUNS_ANY_SHARE_CODES and for smaller ones; fewer, and the call takes expert_group_for's route (one slot a CTA row
# for these). Where few slots share an expert the runs save little and pay the run table's kernel (2-4 µs a call: the
# MMA is 8 columns wide on either path), and a small expert's repeated reads by the one-slot kernel come from L2.
# Graph-timed on an H100 over eleven MoE shapes of 0.5-14 MiB experts at 8-32 tokens with a router's random ids
# (docs/experts_h100_share.csv, docs/experts_h100_b7c68fc.csv; BENCHMARKS.md, "Routed experts: when the runs pay, by
# slots an expert"), one slot a CTA row over the runs: on experts of 1 MiB and more 0.95-0.96 below a quarter of a slot
# an expert (1 MiB experts), 1.01-2.07 from it; on 0.5-0.75 MiB experts 0.85-0.94 below half a slot an expert,
# 0.98-1.74 from it. From RUNS_ANY_SHARE_CODES the runs are taken at any share, as before the rule: a random router's
# repeated experts are then several MiB each, read again from DRAM by the one-slot kernel (a 384-expert top-8 call of
# 8 tokens repeats about 5 of its 64 slots), against the table's few µs. No point below a quarter of a slot an expert
# was measured there with a random router; with ids that share nothing the runs cost 1.03 (RUNS_MIN_TOKENS's note).
RUNS_MIN_SHARE = (0.25, 0.5)
RUNS_ANY_SHARE_CODES = 4 << 20
RUN_SLOTS = MMA_COLUMNS  # slots of one token tile of a run, the MMA's columns (a run is one tile or two: run_tiles_for)
# Slots an expert on average (slots / E) from which a tabled run is two token tiles (16 slots, a CTA row), so an
# expert with more than 8 slots is read once a 16 of them; None: never. A run of two tiles whose second holds no slot
# takes the one-tile body (cute_kernels.linear_w4a16_experts). Graph-timed on an H100 over the bench's six MoE shapes
# with a router's random ids (docs/run_table_ab_h100_skip.csv, two rounds; BENCHMARKS.md, "The run table placed side
# by side, and runs of 16 from 8 slots"), runs of 16 over runs of 8: 0.88-0.98 at 16 or more slots an expert, 0.90-1.02
# at 8 (geomean 0.96), 1.04-1.17 at 2-4 and 1.04-1.21 below 2. (Before the empty tile was skipped: 1.03-1.35 at 2-8.)
RUN_TILES_MIN_SLOTS = 8


def run_tiles_for(slots: int, experts: int) -> int:
    """Token tiles of a tabled run (a run is up to 8 · tiles slots): 2 from RUN_TILES_MIN_SLOTS slots an expert."""
    return 2 if RUN_TILES_MIN_SLOTS is not None and slots >= RUN_TILES_MIN_SLOTS * experts else 1


def experts_route(tokens: int, top_k: int, experts: int, n: int, k: int) -> tuple[bool, bool]:
    """(expert_group, expert_runs) of a routed call: from RUNS_MIN_TOKENS tokens the runs from a table where the
    slots an expert reach RUNS_MIN_SHARE (by the experts' size; any share from RUNS_ANY_SHARE_CODES) and the table's
    rows fit the grid; else the slots that share an expert grouped by a scan where expert_group_for says, or one
    slot a CTA row."""
    slots = tokens * top_k
    codes = n * k // 2
    share = 0 if codes >= RUNS_ANY_SHARE_CODES else RUNS_MIN_SHARE[0 if codes >= GROUP_MIN_CODES else 1]
    if (RUNS_MIN_TOKENS is not None and tokens >= RUNS_MIN_TOKENS and slots >= share * experts
            and run_table_rows(slots, experts) <= SLOTS_CHUNK):
        return False, True
    return expert_group_for(tokens, slots, experts, n, k), False


def run_table_rows(slots: int, experts: int, cap: int = RUN_SLOTS) -> int:
    """The run table's rows: the most runs `slots` slots over `experts` experts (and a bucket of bad ids) can make,
    Σ ⌈count / cap⌉ <= slots // cap + the buckets named."""
    return slots // cap + min(slots, experts + 1)


def run_table(ids: torch.Tensor, experts: int, cap: int = RUN_SLOTS) -> torch.Tensor:
    """The runs of a routed call as LinearW4A16Experts with expert_runs reads them, made on ids' device with no sync
    (so it takes CUDA-graph capture): int32 (rows, 1 + cap), row r = (expert, slot 0, ..., slot cap-1) of run r.
    The slots that name expert e, in slot order, are cut into runs of `cap` (the last shorter; -1 past its end);
    the runs come in expert order. Ids outside [0, E) form runs of their own with expert -1 (NaN stored). Rows past
    the last run hold expert RUN_UNUSED (run_table_rows rows, the most runs there can be). Deterministic.

    On CUDA, where RUN_TABLE_KERNEL is on, one launch of `cute_kernels.run_table` (`run_table_kernel`; one CTA, up
    to its BUCKETS - 1 experts); elsewhere and past that, `run_table_torch`, the same table from torch ops."""
    flat = ids.reshape(-1)
    if RUN_TABLE_KERNEL and flat.is_cuda and flat.is_contiguous() and RunTable.can_implement(flat.numel(), experts):
        return run_table_kernel(flat, experts, cap)
    return run_table_torch(ids, experts, cap)


# The run table from one CuTe kernel rather than a dozen torch kernels: equal to run_table_torch's element for element
# on an H100 (test_gpu_run_table_kernel_matches_the_torch_table), 2.6-3.2 µs a call in a graph up to 64 slots and
# 21.5 at 2048, against 52-87 µs for the torch ops.
RUN_TABLE_KERNEL = True


# The run table's slots placed by the CTA's warps side by side where their counts fit (16 warps to 511 experts, 8 to
# 1,023; run_table.buckets_for) from RUN_TABLE_SIDE_BY_SIDE_MIN_SLOTS slots (None: never), rather than by warp 0
# alone (about 10 ns a slot past 64 slots). With 16 warps on an H100, graph-timed (docs/run_table_placement_h100.csv;
# BENCHMARKS.md, "The run table placed side by side, and runs of 16 from 8 slots"), side by side over warp 0 alone:
# 1.02-1.19 at 32-128 slots (the 16 warps' counts zeroed and summed a chunk: 0.1-0.7 µs more), 0.91-1.03 at 192,
# 0.86-0.92 at 256 and 0.27-0.55 from 1,024 (2,048 slots: 4.8-9.7 µs against 13.1-22.7); with 8 warps at 512 and
# 1,023 experts 1.09-1.15 at 32 slots, 0.92-0.98 at 256 and 0.38-0.66 from 1,024 (docs/run_table_placement_8_warps_
# h100.csv); the tables equal everywhere.
RUN_TABLE_SIDE_BY_SIDE_MIN_SLOTS = 192


def run_table_buckets(slots: int, experts: int) -> int:
    """The run table kernel's bucket count for a call: run_table.buckets_for(E) (the most warps side by side whose
    counts fit E + 1 buckets) from RUN_TABLE_SIDE_BY_SIDE_MIN_SLOTS slots, else BUCKETS (warp 0 alone)."""
    side = RUN_TABLE_SIDE_BY_SIDE_MIN_SLOTS is not None and slots >= RUN_TABLE_SIDE_BY_SIDE_MIN_SLOTS
    return buckets_for(experts) if side else BUCKETS


def run_table_kernel(flat: torch.Tensor, experts: int, cap: int = RUN_SLOTS,
                     buckets: int | None = None) -> torch.Tensor:
    """run_table's table from one launch of `cute_kernels.run_table` on flat's CUDA device: flat the (slots,)
    contiguous ids, RunTable.can_implement(slots, experts). `buckets` forces the kernel's bucket count (None:
    run_table_buckets)."""
    if buckets is None:
        buckets = run_table_buckets(flat.numel(), experts)
    cfg = RunTableConfig("i32" if flat.dtype == torch.int32 else "i64", cap, buckets)
    table = torch.empty(run_table_rows(flat.numel(), experts, cap), 1 + cap, dtype=torch.int32, device=flat.device)
    key = (cfg, flat.device)
    fn = _RUN_TABLES.get(key)
    if fn is None:
        fn = _RUN_TABLES[key] = raw_function(compile_kernel(RunTable, cfg, target(capability(flat.device)),
                                                            stream="torch"))
    fn(flat, table, experts)
    return table


_RUN_TABLES: dict = {}  # (RunTableConfig, device) -> the compiled table maker's function


def run_table_torch(ids: torch.Tensor, experts: int, cap: int = RUN_SLOTS) -> torch.Tensor:
    """run_table's table from torch ops on any device (a stable sort, a binary search, no atomics): the model the
    CUDA kernel is tested against, and its stand-in on other devices and past its experts."""
    from cute_kernels.linear_w4a16_experts import RUN_UNUSED

    flat = ids.reshape(-1)
    slots = flat.numel()
    key = torch.where((flat >= 0) & (flat < experts), flat, experts).long()  # experts: the bucket of bad ids
    sorted_key, order = torch.sort(key, stable=True)  # slots by expert, in slot order within one
    first = torch.searchsorted(sorted_key, torch.arange(experts + 2, device=ids.device))  # each bucket's first slot
    runs = (first[1:] - first[:-1] + cap - 1) // cap
    first_run = torch.cumsum(runs, 0) - runs
    rank = torch.arange(slots, device=ids.device) - first[sorted_key]
    row = first_run[sorted_key] + rank // cap
    table = torch.full((run_table_rows(slots, experts, cap), 1 + cap), -1, dtype=torch.int32, device=ids.device)
    table[:, 0] = RUN_UNUSED
    table[row, 1 + rank % cap] = order.int()
    table[row, 0] = torch.where(sorted_key == experts, -1, sorted_key).int()  # one value a row, however often written
    return table


def bind_experts(experts, n, k, device, x_dtype, scale_dtype, ids_dtype, fmt, has_global_scale, has_bias, **override):
    """The routed launch of one call signature: `launch(out, x2d, weight_u8, scale, global_scale, bias, ids)` with
    out (T, top_k, N), x2d (T, K), the stacked weight (E, N, K/2) as bytes and its scales (E, N, K/block) (NVFP4's
    may be e4m3), global_scale (E,) fp32 or None, bias (E, N) or None, ids (T, top_k); weight, scales, out and ids
    contiguous (the kernel views them by row and slot). Up to three configs (experts_config, by experts_route): one
    slot a CTA row, the runs scanned, and the runs from a table; each compiled on its first call."""
    plans = {}
    fields = {"sf_dtype": _SF_DTYPES[scale_dtype], **override}
    no_bias = _dummy(device, x_dtype).view(1, 1)

    def launch(out, x2d, weight_u8, scale, global_scale, bias, ids):
        t, top_k = ids.shape
        if t * top_k > SLOTS_CHUNK:
            step = SLOTS_CHUNK // top_k
            for t0 in range(0, t, step):
                t1 = min(t, t0 + step)
                launch(out[t0:t1], x2d[t0:t1], weight_u8, scale, global_scale, bias, ids[t0:t1])
            return
        if not LinearW4A16Experts.can_implement(t, t * top_k, n, k, experts):
            raise ValueError(f"fp4_experts_linear: (T, slots, E, N, K) = ({t}, {t * top_k}, {experts}, {n}, {k}) is "
                             f"too large for the kernel: {LinearW4A16Experts.can_implement.__doc__} Split the experts "
                             f"or the call.")
        group, runs = fields.get("expert_group"), fields.get("expert_runs")
        if group is None and runs is None:
            group, runs = experts_route(t, top_k, experts, n, k)
        elif runs and run_table_rows(t * top_k, experts) > SLOTS_CHUNK:  # the table's rows past the grid's y
            group, runs = True, False
        tiles = (fields.get("token_tiles") or run_tiles_for(t * top_k, experts)) if runs else 1
        mode = (bool(group), bool(runs), tiles)
        fn = plans.get(mode)
        if fn is None:
            cfg = experts_config(n, k, fmt, _X_DTYPES[x_dtype], _ID_DTYPES[ids_dtype], has_bias, has_global_scale,
                                 sm_count(device.index), **{**fields, "expert_group": group, "expert_runs": runs,
                                                            "token_tiles": tiles})
            fn = plans[mode] = raw_function(compile_kernel(kernel_class(cfg)[0], cfg, target(capability(device)),
                                                           stream="torch"))
        gs = _dummy(device, torch.float32) if global_scale is None else global_scale
        fn(x2d, weight_u8, scale, out, gs, no_bias if bias is None else bias,
           run_table(ids, experts, RUN_SLOTS * tiles) if runs else ids)

    return launch


def describe(m: int, n: int, k: int, fmt: str, x_dtype, device=None, scale_layout: str = "plain", **override) -> str:
    """Which kernel and config serve this call (for users and logs)."""
    xd = _X_DTYPES.get(x_dtype, x_dtype)
    sms = H200_SMS
    if device is not None and torch.device(device).type == "cuda":
        dev = torch.device(device)
        sms = sm_count(dev.index if dev.index is not None else torch.cuda.current_device())
    if prefill.takes(m, fmt, xd):
        return (f"dequantize_fp4 {fmt} -> {xd} in chunks of at most {prefill.chunk_rows(n, k)} rows, then cuBLAS "
                f"(torch.mm, fp32 sums): M >= {prefill.PREFILL_MIN_TOKENS}")
    cfg = config_for(m, n, k, fmt, scale_layout, xd, False, False, sms, **override)
    path = "tensor cores (mma.sync m16n8k16)"
    if cfg.mx_fold_redo:
        path += ", the scale folded into one multiply (the warp's K again in bf16 where a scale does not fit)"
    elif cfg.mx_fold:
        path += ", the scale folded into one multiply where a step's scales fit, else bf16"
    if cfg.split_x:
        path += (" with" if cfg.mx_fold else ",") + " x as bf16 hi+lo"
    if cfg.block_columns:
        path += ", block columns (x prepared as f16 by a first kernel, block scales after the MMA)"
    if cfg.x_fragments:
        path += ", x in fragment order (prepared by a first kernel)"
    tiles = -(-m // cfg.tokens_per_cta)
    note = "" if m <= 16 else (f"; M > 16: {tiles} token tiles of {cfg.tokens_per_cta}, W decoded once per tile"
                               + (", token tiles fastest (m_major)" if cfg.m_major else "")
                               + (f", {-(-m // M_CHUNK)} launches of at most {M_CHUNK} rows" if m > M_CHUNK else ""))
    return (f"linear_w4a16 {fmt} {xd}: {path}, {cfg.mma_dtype} MMA, groups={cfg.groups} row_warps={cfg.row_warps} "
            f"k_warps={cfg.k_warps} token_tiles={cfg.token_tiles}"
            + (f" k_parts={cfg.k_parts}" if cfg.k_parts > 1 else "")
            + (f" acc_sets={cfg.acc_sets}" if cfg.acc_sets > 1 else "")
            + (f" k_splits={cfg.k_splits} (a cluster)" if cfg.k_splits > 1 else "")
            + (f" max_registers={cfg.max_registers}" if cfg.max_registers else "")
            + (", launched programmatically dependent (pdl)" if cfg.pdl else "") + note)
