"""Routed fp4 experts (nvfp4_gemv/linear/experts.py, cute_kernels/linear_w4a16_experts.py): the reference against
each slot's own fp4_linear, bad input named, the eager path with a stand-in launcher, the configs and their PTX on the
CPU; on a GPU the kernel against the reference on full-range data, ids out of range, the grouped path past 16
tokens, CUDA graphs, torch.compile and bit-identical repeats."""

import re

import pytest
import torch

from nvfp4_gemv.linear import FP4Experts, fp4_experts_linear
from nvfp4_gemv.linear.experts import EXPERTS_MAX_TOKENS, EagerExperts, experts_reference, validate_experts
from nvfp4_gemv.linear.reference import dequantize, linear_reference

FORMATS = ["nvfp4", "mxfp4"]


def operands(fmt="mxfp4", e=5, n=72, k=128, t=3, top_k=2, dtype=torch.bfloat16, ids_dtype=torch.int64,
             global_scale=True, bias=True, full=True, seed=0, device="cpu"):
    """Keyword arguments of fp4_experts_linear: every code, scales over a wide range (NVFP4: every finite e4m3,
    subnormals included; MXFP4: 2^-37..2^37), distinct experts a token, a per-expert global scale and bias."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, generator=g)
    if fmt == "nvfp4":
        lo, hi = (0, 0x7E) if full else (0x28, 0x40)
        sf = torch.randint(lo, hi + 1, (e, n, k // 16), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)
        gs = (torch.rand(e, generator=g) + 0.25) if global_scale else None
    else:
        lo, hi = (90, 165) if full else (118, 130)
        sf = torch.randint(lo, hi, (e, n, k // 32), dtype=torch.uint8, generator=g)
        gs = None
    ids = [torch.randperm(max(e, top_k), generator=g)[:top_k] % e for _ in range(t)]
    ids = torch.stack(ids or [torch.zeros(0, top_k)])
    ids = ids.reshape(t, top_k).to(ids_dtype)
    a = dict(x=torch.randn(t, k, generator=g).to(dtype), weight=w, weight_scale=sf, expert_ids=ids, fmt=fmt,
             global_scale=gs, bias=torch.randn(e, n, generator=g).to(dtype) if bias else None)
    return {key: v.to(device) if isinstance(v, torch.Tensor) else v for key, v in a.items()}


def per_slot(a):
    """y (T, top_k, N) from fp4_linear's reference, one (token, expert) slot at a time."""
    t, top_k = a["expert_ids"].shape
    rows = []
    for i in range(t):
        for j in range(top_k):
            e = int(a["expert_ids"][i, j])
            rows.append(linear_reference(a["x"][i:i + 1], a["weight"][e], a["weight_scale"][e], a["fmt"],
                                         None if a["global_scale"] is None else a["global_scale"][e:e + 1],
                                         None if a["bias"] is None else a["bias"][e]))
    return torch.cat(rows).view(t, top_k, -1)


# ---------------------------------------------------------------- the reference and the CPU op


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("t,top_k", [(1, 1), (3, 2), (17, 4)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_reference_is_each_slots_linear(fmt, t, top_k, dtype, ids_dtype):
    a = operands(fmt, t=t, top_k=top_k, dtype=dtype, ids_dtype=ids_dtype, full=False)
    got = experts_reference(**a)
    assert_same_sums(got, per_slot(a))  # fp32 sums of one row or of an expert's rows: the order may differ
    assert torch.equal(fp4_experts_linear(**a), got)
    assert torch.equal(torch.ops.nvfp4_gemv.fp4_experts_linear(*op_args(a)), got)


def assert_same_sums(a, b):
    """Equal but for the fp32 sum's order: within one rounding to the output dtype (and a little for the sums)."""
    ulp = 2.0 ** -(7 if a.dtype == torch.bfloat16 else 10)
    assert a.shape == b.shape and ((a.double() - b.double()).abs() <= ulp * b.double().abs() + 1e-3).all()


def test_reference_repeated_and_unused_experts():
    """Every token on the same expert, several tokens on one expert, experts no slot names: each slot is its own."""
    a = operands("nvfp4", t=6, top_k=3)
    a["expert_ids"] = torch.tensor([[0, 0, 0], [4, 4, 4], [1, 4, 0], [0, 1, 4], [4, 0, 1], [1, 1, 1]])
    assert_same_sums(experts_reference(**a), per_slot(a))


def test_zero_tokens():
    a = operands(t=0)
    assert experts_reference(**a).shape == (0, 2, 72)
    assert fp4_experts_linear(**a).shape == (0, 2, 72)


@pytest.mark.parametrize("fmt,n,k", [("mxfp4", 3, 384), ("nvfp4", 3, 64), ("nvfp4", 256, 512)])
def test_host_grouping_passes_aligned_scales(monkeypatch, fmt, n, k):
    """Past EXPERTS_MAX_TOKENS each named expert goes through fp4_linear, which takes 16-byte aligned weights and
    scales. An expert's codes always start aligned; its scales (N·K/16 or N·K/32 bytes an expert) do only for some
    N, and are copied where not (the codes never are). The result is the reference's."""
    from nvfp4_gemv.linear import op
    from nvfp4_gemv.linear.validate import PTR_ALIGN

    a = operands(fmt, e=6, n=n, k=k, t=9, top_k=3, bias=True, global_scale=fmt == "nvfp4")
    seen = []

    def linear(x, weight, weight_scale, fmt_, global_scale=None, bias=None):
        assert weight.data_ptr() % PTR_ALIGN == 0 and weight_scale.data_ptr() % PTR_ALIGN == 0
        assert weight.untyped_storage().data_ptr() == a["weight"].untyped_storage().data_ptr()  # the codes in place
        seen.append(weight_scale.untyped_storage().data_ptr() == a["weight_scale"].untyped_storage().data_ptr())
        return linear_reference(x, weight, weight_scale, fmt_, global_scale, bias)

    monkeypatch.setattr(op, "fp4_linear", linear)
    y = EagerExperts.grouped(*op_args(a))
    assert_same_sums(y, experts_reference(**a))
    per_expert = n * k // (16 if fmt == "nvfp4" else 32)
    named = a["expert_ids"].unique().tolist()
    assert seen == [(ex * per_expert) % PTR_ALIGN == 0 for ex in sorted(named)]


def op_args(a):
    return (a["x"], a["weight"], a["weight_scale"], a["expert_ids"], a["fmt"], a["global_scale"], a["bias"])


@pytest.mark.parametrize("fmt", FORMATS)
def test_opcheck(fmt):
    # as fp4_linear's: opcheck's test_schema compares inputs with torch.allclose, which has no CPU kernel for e4m3
    kw = {} if fmt == "mxfp4" else {"test_utils": ("test_faketensor", "test_aot_dispatch_dynamic")}
    for t in (3, 0):
        torch.library.opcheck(torch.ops.nvfp4_gemv.fp4_experts_linear.default, op_args(operands(fmt, t=t)), **kw)


def test_compile_fullgraph_matches_eager():
    a = operands("nvfp4")
    torch._dynamo.reset()
    f = torch.compile(lambda x, ids: fp4_experts_linear(x, a["weight"], a["weight_scale"], ids, "nvfp4",
                                                             a["global_scale"], a["bias"]),
                      fullgraph=True, backend="aot_eager")
    assert torch.equal(f(a["x"], a["expert_ids"]), experts_reference(**a))


def test_no_gradients():
    a = operands()
    a["x"] = a["x"].requires_grad_()
    with pytest.raises(ValueError, match="^fp4_experts_linear: no gradients"):
        fp4_experts_linear(**a)
    with torch.no_grad():
        assert torch.equal(fp4_experts_linear(**a), experts_reference(**{**a, "x": a["x"].detach()}))


def test_module():
    a = operands("nvfp4", t=4, top_k=3)
    mod = FP4Experts(a["weight"], a["weight_scale"], "nvfp4", a["global_scale"], a["bias"])
    assert mod.weight is a["weight"] and (mod.experts, mod.in_features, mod.out_features) == (5, 128, 72)
    assert "experts=5, in_features=128, out_features=72, fmt=nvfp4, bias=True" in repr(mod)
    assert torch.equal(mod(a["x"], a["expert_ids"]), experts_reference(**a))
    assert mod.path(4, 3) == "reference (cpu)"
    gs = a["global_scale"].clone()
    gs[3] = float("inf")
    with pytest.raises(ValueError, match=r"^global_scale: expected finite values, got inf for expert 3"):
        FP4Experts(a["weight"], a["weight_scale"], "nvfp4", gs)
    with pytest.raises(ValueError, match=r"^bias: expected dtype torch\.float16"):
        FP4Experts(a["weight"], a["weight_scale"], "nvfp4", bias=a["bias"], dtype=torch.float16)
    with pytest.raises(ValueError, match=r"^dtype: expected one of"):
        FP4Experts(a["weight"], a["weight_scale"], "nvfp4", dtype=torch.float32)


# ---------------------------------------------------------------- bad input: ValueError naming the tensor


def _bad_cases():
    a = operands("nvfp4")
    e, n, k = 5, 72, 128
    meta = torch.device("meta")
    return [
        ("fmt", dict(fmt="nvfp8"), "fmt"),
        ("x-dtype", dict(x=a["x"].float()), "x"),
        ("x-k", dict(x=a["x"][:, :64]), "x"),
        ("x-3d", dict(x=a["x"].view(1, 3, k)), "x"),
        ("x-device", dict(x=a["x"].to(meta)), "x"),
        ("w-2d", dict(weight=a["weight"][0]), "weight"),
        ("w-dtype", dict(weight=a["weight"].view(torch.int8)), "weight"),
        ("w-k", dict(weight=a["weight"][:, :, :20]), "weight"),
        ("w-empty", dict(weight=a["weight"][:0]), "weight"),
        ("w-strides", dict(weight=a["weight"].transpose(0, 1)), "weight"),
        ("w-type", dict(weight=None), "weight"),
        ("s-dtype", dict(weight_scale=a["weight_scale"].view(torch.uint8)), "weight_scale"),
        ("s-shape", dict(weight_scale=a["weight_scale"][:4]), "weight_scale"),
        ("s-strides", dict(weight_scale=a["weight_scale"].transpose(0, 1)), "weight_scale"),
        ("s-device", dict(weight_scale=a["weight_scale"].to(meta)), "weight_scale"),
        ("ids-dtype", dict(expert_ids=a["expert_ids"].to(torch.int16)), "expert_ids"),
        ("ids-1d", dict(expert_ids=a["expert_ids"][:, 0]), "expert_ids"),
        ("ids-tokens", dict(expert_ids=a["expert_ids"][:2]), "expert_ids"),
        ("ids-top-k-0", dict(expert_ids=a["expert_ids"][:, :0]), "expert_ids"),
        ("ids-device", dict(expert_ids=a["expert_ids"].to(meta)), "expert_ids"),
        ("ids-value", dict(expert_ids=a["expert_ids"] + e), "expert_ids"),
        ("ids-negative", dict(expert_ids=a["expert_ids"] - e), "expert_ids"),
        ("g-shape", dict(global_scale=torch.ones(1)), "global_scale"),
        ("g-dtype", dict(global_scale=torch.ones(e, dtype=torch.float16)), "global_scale"),
        ("g-float", dict(global_scale=1.0), "global_scale"),
        ("g-strides", dict(global_scale=torch.ones(2 * e)[::2]), "global_scale"),
        ("mx-g", {**operands("mxfp4"), "global_scale": torch.ones(e)}, "global_scale"),
        ("b-shape", dict(bias=torch.zeros(n, dtype=torch.bfloat16)), "bias"),
        ("b-dtype", dict(bias=torch.zeros(e, n, dtype=torch.float16)), "bias"),
        ("b-device", dict(bias=torch.zeros(e, n, dtype=torch.bfloat16, device=meta)), "bias"),
    ]


BAD = _bad_cases()


@pytest.mark.parametrize("case,changes,name", BAD, ids=[c[0] for c in BAD])
def test_bad_input_names_the_tensor(case, changes, name):
    a = {**operands("nvfp4"), **changes}
    pattern = rf"^{name}: "
    with pytest.raises(ValueError, match=pattern):
        fp4_experts_linear(**a)
    if not case.startswith("ids-") or case in ("ids-dtype", "ids-1d", "ids-tokens", "ids-top-k-0", "ids-device"):
        with pytest.raises(ValueError, match=pattern):  # ids' values are not metadata: the reference reads them
            validate_experts(*op_args(a)[:5], a["global_scale"], a["bias"])
        with pytest.raises(ValueError, match=pattern):  # the eager CUDA path, on CPU tensors with a stand-in
            EagerExperts(bind=_fail)(*op_args(a))


def _fail(*args):
    raise AssertionError("bound on bad input")


# ---------------------------------------------------------------- the eager CUDA path with a stand-in launcher


def _stand_in(e, n, k, device, x_dtype, sf_dtype, ids_dtype, fmt, has_gs, has_bias):
    """bind_experts' signature; its launch computes each slot with the reference from the tensors as the kernel
    takes them (y (T, top_k, N), W and scales (E, N, ...) as bytes or e4m3, ids (T, top_k))."""

    def launch(out, x2d, w, sf, gs, bias, ids):
        assert w.dtype == torch.uint8 and w.shape == (e, n, k // 2) and out.shape[2] == n and ids.is_contiguous()
        for i, row in enumerate(ids.tolist()):
            for j, ex in enumerate(row):
                out[i, j] = linear_reference(x2d[i:i + 1], w[ex], sf[ex].view(
                    torch.float8_e4m3fn if fmt == "nvfp4" else torch.uint8), fmt,
                    None if gs is None else gs[ex:ex + 1], None if bias is None else bias[ex])[0]

    calls.append((e, n, k, x_dtype, sf_dtype, ids_dtype, fmt, has_gs, has_bias))
    return launch


calls = []


@pytest.mark.parametrize("fmt", FORMATS)
def test_eager_path_views_and_caches(fmt):
    """The launch sees the tensors as the kernel takes them and is bound once per signature, not per T;
    past EXPERTS_MAX_TOKENS tokens the slots go through each expert's fp4_linear (here the CPU reference)."""
    calls.clear()
    eager = EagerExperts(bind=_stand_in)
    for t in (1, 3, 16):
        a = operands(fmt, t=t, top_k=2)
        assert_same_sums(eager(*op_args(a)), per_slot(a))
    assert len(calls) == 1 and calls[0][:3] == (5, 72, 128)
    a = operands(fmt, t=EXPERTS_MAX_TOKENS + 1, top_k=3)
    assert_same_sums(eager(*op_args(a)), per_slot(a))
    assert len(calls) == 1
    a["expert_ids"][5, 1] = 99
    with pytest.raises(ValueError, match=r"^expert_ids: expected values in \[0, 5\)"):
        eager(*op_args(a))


# ---------------------------------------------------------------- configs and PTX (CPU)


def test_experts_config():
    """One expert's one-token split (config_for of (1, N, K)) with one K part and at most EXPERTS_K_WARPS k-warps:
    the routed grid has slots times that call's CTAs."""
    from nvfp4_gemv.linear import kernels

    for n, k, fmt, xd in [(5760, 2880, "mxfp4", "bf16"), (2880, 2880, "mxfp4", "fp16"), (2880, 2880, "mxfp4", "bf16"),
                          (768, 2048, "nvfp4", "bf16"), (28672, 4096, "mxfp4", "fp16"), (2048, 768, "nvfp4", "fp16")]:
        c = kernels.experts_config(n, k, fmt, xd, "i64", False, fmt == "nvfp4")
        one = kernels.config_for(1, n, k, fmt, "plain", xd, False, fmt == "nvfp4", block_columns=False,
                                 x_fragments=False)
        assert c.experts == "i64" and c.groups == one.groups and c.k_warps == min(one.k_warps, kernels.EXPERTS_K_WARPS)
        assert (c.k_parts, c.token_tiles, c.block_columns, c.x_fragments, c.m_major) == (1, 1, False, False, False)
        assert c.mx_fold == one.mx_fold and c.fmt == fmt and c.x_dtype == xd
        assert c.expert_group == (n * k // 2 >= kernels.GROUP_MIN_CODES)  # 2 tokens, 1 slot each, of 1 expert
    said = kernels.describe_experts(7, 4, 16, 5760, 2880, "mxfp4", torch.bfloat16)
    c = kernels.experts_config(5760, 2880, "mxfp4", "bf16", "i64", False, False)
    assert said.startswith("linear_w4a16_experts: one launch of 28 (token, expert) slots x ")
    assert ", the slots that share it in runs of up to 8 (one CTA row a run)" in said
    assert "share" not in kernels.describe_experts(1, 4, 4, 5760, 2880, "mxfp4", torch.bfloat16)
    assert "share" not in kernels.describe_experts(4, 4, 32, 5760, 2880, "mxfp4", torch.bfloat16)
    assert not kernels.experts_config(5760, 2880, "mxfp4", "bf16", "i64", False, False, tokens=1).expert_group
    assert f"groups={c.groups} row_warps=1 k_warps={c.k_warps} token_tiles=1" in said and "k_parts" not in said
    assert not kernels.experts_config(5760, 2880, "mxfp4", "bf16", "i64", False, False, expert_group=False).expert_group
    with pytest.raises(ValueError, match="experts must be"):
        kernels.LinearW4A16Config(experts="i64", token_tiles=2)
    with pytest.raises(ValueError, match="expert_group is a way of routing experts"):
        kernels.LinearW4A16Config(expert_group=True)
    can = kernels.LinearW4A16Experts.can_implement
    assert can(16, 128, 5760, 2880, 128)  # gpt-oss-120b's gate_up, 16 tokens of 8 experts
    assert not can(1, 4, 2**20, 2**10, 2**4)  # W's words past int32: E·N·K = 2^34
    assert not can(1, 2**16, 2**15, 64, 1)  # y's elements past int32: slots·N = 2^31
    assert not can(1, 1, 8, 96, 1)  # K not a multiple of 64


def test_expert_group_for_follows_the_measured_rule():
    """Groups from two tokens, on experts of GROUP_MIN_CODES and more, from one slot an expert on average (two on
    experts under GROUP_ONE_SLOT_CODES); at the edges of each bound, on the bench's MoE shapes."""
    from nvfp4_gemv.linear import kernels

    rule = kernels.expert_group_for
    assert kernels.GROUP_MIN_CODES < kernels.GROUP_ONE_SLOT_CODES
    assert not rule(1, 32, 4, 5760, 2880)  # one token's experts are distinct
    assert rule(2, 32, 32, 5760, 2880) and not rule(2, 31, 32, 5760, 2880)  # 8.3 MB: one slot an expert
    assert rule(8, 32, 32, 2880, 2880) and not rule(7, 28, 32, 2880, 2880)  # 4.1 MB
    assert rule(32, 256, 128, 1536, 2048) and not rule(31, 248, 128, 1536, 2048)  # 1.6 MB: two slots an expert
    assert not rule(128, 1024, 128, 2048, 768)  # 0.8 MB: never
    assert rule(64, 512, 2, 2048, 1024) and not rule(64, 512, 2, 2048, 1023 // 64 * 64)  # 1 MiB of codes, the least
    assert rule(8, 32, 32, 2048, 2048) and not rule(8, 31, 32, 2048, 2048)  # 2 MiB: one slot an expert
    assert not rule(16, 126, 64, 2048, 2040) and rule(16, 128, 64, 2048, 2040)  # just under 2 MiB: two


def test_experts_route(monkeypatch):
    """From RUNS_MIN_TOKENS tokens the runs from a table where the slots an expert reach RUNS_MIN_SHARE (never while
    it is None), unless the table's rows would pass the grid's y; below it grouped or not by expert_group_for."""
    from nvfp4_gemv.linear import kernels

    route = kernels.experts_route
    assert kernels.RUNS_MIN_TOKENS == 8  # the measured cut (BENCHMARKS.md, "The run table's kernel and runs of 16")
    # the measured shares (BENCHMARKS.md, "Routed experts: when the runs pay, by slots an expert")
    assert kernels.RUNS_MIN_SHARE == (0.25, 0.5)
    assert route(8, 10, 512, 1024, 2048) == (False, False) and route(16, 10, 512, 1024, 2048) == (False, True)  # 1 MiB
    assert route(16, 10, 512, 2048, 512) == (False, False) and route(26, 10, 512, 2048, 512) == (False, True)  # 0.5 MB
    assert route(8, 8, 256, 4096, 7168) == (False, True) and route(7, 8, 256, 4096, 7168) == (False, False)
    # from RUNS_ANY_SHARE_CODES (4 MiB) at any share: 384 experts of 14 MiB, 64 slots (a sixth of a slot an expert)
    assert kernels.RUNS_ANY_SHARE_CODES == 4 << 20
    assert route(8, 8, 384, 4096, 7168) == (False, True) and route(8, 8, 1024, 4096, 2048) == (False, True)
    assert route(8, 8, 1024, 4096, 2040) == (False, False)  # just under 4 MiB: a quarter of a slot an expert
    assert route(7, 8, 4, 5760, 2880) == (True, False) and route(8, 4, 32, 5760, 2880) == (False, True)
    assert route(7, 8, 128, 2048, 768) == (False, False) and route(8, 8, 128, 2048, 768) == (False, True)
    monkeypatch.setattr(kernels, "RUNS_MIN_TOKENS", 64)
    assert route(63, 4, 32, 5760, 2880) == (True, False) and route(64, 4, 32, 5760, 2880) == (False, True)
    monkeypatch.setattr(kernels, "RUNS_MIN_TOKENS", 32)
    assert route(16, 4, 32, 5760, 2880) == (True, False) and route(32, 4, 32, 5760, 2880) == (False, True)
    assert route(31, 8, 128, 2048, 768) == (False, False)  # 0.8 MB experts: never scanned
    assert route(1, 4, 4, 5760, 2880) == (False, False)
    assert kernels.run_table_rows(8192, 60000) == 1024 + 8192 <= kernels.SLOTS_CHUNK
    assert route(9000, 7, 60000, 5760, 2880) == (True, False)  # 63000 slots: 7875 + 60001 table rows, too many
    c = kernels.experts_config(5760, 2880, "mxfp4", "bf16", "i32", False, False, tokens=32, top_k=4, experts=32)
    assert c.expert_runs and not c.expert_group
    assert "from a run table made on the device" in kernels.describe_experts(32, 4, 32, 5760, 2880, "mxfp4",
                                                                              torch.bfloat16)
    monkeypatch.setattr(kernels, "RUNS_MIN_TOKENS", None)
    assert route(256, 4, 32, 5760, 2880) == (True, False) and route(256, 8, 128, 2048, 768) == (False, False)


def test_run_tiles_for(monkeypatch):
    """A tabled run is two token tiles (16 slots) from RUN_TILES_MIN_SLOTS slots an expert on average, on the
    one-token split (the same groups and k-warps, so a slot's sums do not depend on its run); never while the bound
    is None; scanned groups and single slots stay one tile."""
    from nvfp4_gemv.linear import kernels

    lo = kernels.RUN_TILES_MIN_SLOTS
    assert lo == 8  # the measured cut (BENCHMARKS.md, "The run table placed side by side, and runs of 16 from 8 slots")
    assert kernels.run_tiles_for(lo * 32, 32) == 2 and kernels.run_tiles_for(lo * 32 - 1, 32) == 1
    args = (5760, 2880, "mxfp4", "bf16", "i32", False, False)
    two = kernels.experts_config(*args, tokens=lo * 8, top_k=4, experts=32)
    one = kernels.experts_config(*args, tokens=lo * 8 - 1, top_k=4, experts=32)
    assert two.expert_runs and two.token_tiles == 2 and two.tokens_per_cta == 16
    assert one.expert_runs and one.token_tiles == 1
    assert (two.groups, two.k_warps, two.k_parts) == (one.groups, one.k_warps, one.k_parts)
    assert "runs of up to 16 from a run table" in kernels.describe_experts(lo * 8, 4, 32, 5760, 2880, "mxfp4",
                                                                           torch.bfloat16)
    grouped = kernels.experts_config(*args, tokens=lo * 8, top_k=4, experts=32, expert_group=True)
    assert grouped.token_tiles == 1 and not grouped.expert_runs
    kernels.LinearW4A16Config(experts="i32", expert_runs=True, token_tiles=2)
    with pytest.raises(ValueError, match="more only with expert_runs"):
        kernels.LinearW4A16Config(experts="i32", expert_group=True, token_tiles=2)
    monkeypatch.setattr(kernels, "RUN_TILES_MIN_SLOTS", None)
    assert kernels.run_tiles_for(10**6, 1) == 1


def test_run_table_against_a_model():
    """kernels.run_table on random ids (in and out of range, both id dtypes): for each expert in order, then the bad
    ids' bucket, its slots in slot order cut into runs of 8, a row each; every other row unused; as many rows as runs
    can be."""
    from cute_kernels.linear_w4a16_experts import RUN_UNUSED
    from nvfp4_gemv.linear import kernels

    g = torch.Generator().manual_seed(0)
    for trial in range(300):
        e, t, top_k = (int(v) for v in torch.randint(1, 21, (3,), generator=g))
        top_k = 1 + top_k % 6
        cap = 16 if trial % 3 == 0 else 8  # one token tile a run, or two
        ids = torch.randint(-2, e + 2, (t, top_k), generator=g).to(torch.int32 if trial % 2 else torch.int64)
        table = kernels.run_table(ids, e) if cap == 8 else kernels.run_table(ids, e, cap)
        flat = ids.flatten().tolist()
        expect = []
        for ex in [*range(e), None]:
            members = [s for s, v in enumerate(flat) if (v == ex if ex is not None else not 0 <= v < e)]
            for j in range(0, len(members), cap):
                run = members[j:j + cap]
                expect.append([-1 if ex is None else ex, *run, *[-1] * (cap - len(run))])
        rows = table.tolist()
        assert table.dtype == torch.int32 and table.shape == (len(flat) // cap + min(len(flat), e + 1), 1 + cap)
        assert rows[:len(expect)] == expect
        assert all(r == [RUN_UNUSED] + [-1] * cap for r in rows[len(expect):])


def test_routed_configs_fit_the_resident_warp_model(tmp_path):
    """The routed kernel's configs over the bench's MoE shapes (both formats, both x dtypes; one config a shape) meet
    the same register and spill bounds as the dispatched linear's: the route adds a few registers, no CTAs."""
    from nvfp4_gemv.linear import kernels
    from nvfp4_gemv.linear.bench import EXPERT_SHAPES
    from test_linear_kernel import assert_configs_fit, config_key

    configs = {}
    for e, n, k, top_k, _ in EXPERT_SHAPES:
        for fmt in FORMATS:
            for xd in ("bf16", "fp16"):
                for ids, group, runs, tiles in (("i64", False, False, 1), ("i64", True, False, 1),
                                                ("i32", False, True, 1), ("i32", False, True, 2)):
                    c = kernels.experts_config(n, k, fmt, xd, ids, False, fmt == "nvfp4", expert_group=group,
                                               expert_runs=runs, token_tiles=tiles)
                    assert c.token_tiles == tiles
                    configs.setdefault(config_key(c), c)
    assert_configs_fit(configs.values(), tmp_path)


def test_base_kernel_unchanged_by_routes(tmp_path):
    """The route is a compile-time None in LinearW4A16's own kernel: with and without an expert id dtype in the
    config, the kernels share their K loop (the same SASS loop, registers within the routed kernel's few more)."""
    from registers import compiled_registers_all

    args = "fmt='mxfp4', mx_fold=True, mx_fold_redo=True, max_registers=48, w_l2_prefetch=128, k_warps=8"
    base = compiled_registers_all("linear_w4a16", "LinearW4A16", args, tmp_path / "a")
    routed = compiled_registers_all("linear_w4a16_experts", "LinearW4A16Experts", args + ", experts='i64'",
                                    tmp_path / "b", "linear_w4a16", "LinearW4A16Config")
    assert base == routed == [48]


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("kw", [dict(fmt="mxfp4", mx_fold=True, mx_fold_redo=True, bias=True),
                                dict(fmt="nvfp4", global_scale=True, k_parts=2, x_dtype="fp16")], ids=["mx", "nv"])
@pytest.mark.parametrize("ids, route", [("i32", "slot"), ("i64", "slot"), ("i32", "group"), ("i64", "group"),
                                        ("i32", "runs"), ("i32", "runs16")])
def test_ptx_facts(tmp_path, arch, kw, ids, route):
    """The routed kernel reads the ids (4- or 8-byte loads), multiplies by tensor cores, stores y, and has no float
    atomics; NaN (selected as the output's, fp32's or bf16's/fp16's) is its answer for an id out of range. With
    groups, the ids are scanned with ballots; without, or from a run table (runs of one token tile or two), none is
    taken."""
    from registers import compiled_ptx

    tmp_path.mkdir(exist_ok=True)
    cfg = {**kw, "experts": ids, "expert_group": route == "group", "expert_runs": route.startswith("runs")}
    if route == "runs16":
        cfg["token_tiles"] = 2
    ptx = compiled_ptx("linear_w4a16_experts", "LinearW4A16Experts", cfg, arch, tmp_path, "linear_w4a16",
                       "LinearW4A16Config")
    assert "mma.sync.aligned.m16n8k16" in ptx
    assert ("vote.sync.ballot.b32" in ptx) == (route == "group")
    # the runs wait for the run table's grid (launched before them, programmatically dependent), and nothing else does
    assert ("griddepcontrol.wait" in ptx) == route.startswith("runs")
    assert ("ld.global.b64" in ptx or "ld.global.u64" in ptx or "ld.global.s64" in ptx) == (ids == "i64")
    assert "atom.global.add.f32" not in ptx and "red.global.add.f32" not in ptx
    assert re.search(r"selp\.(b16|b32|f32)\s+%\w+, %\w+, (0x7FC0|0x7E00|0f7FC00000|0f7FFFFFFF), %p", ptx)


def test_run_table_buckets_for():
    """16 warps place side by side up to 512 buckets (E + 1, the bad ids' among them), 8 up to 1,024 (their counts
    the same 32 KiB), warp 0 alone past that; any other bucket count is refused."""
    from cute_kernels.run_table import BUCKETS, COUNT_WORDS, SEGMENT, RunTableConfig, buckets_for, placers

    assert [buckets_for(e) for e in (1, 511, 512, 1023, 1024, BUCKETS - 1)] == [512, 512, 1024, 1024, BUCKETS, BUCKETS]
    assert [placers(b) for b in (512, 1024, BUCKETS)] == [16, 8, 1]
    assert all(placers(b) * b == COUNT_WORDS for b in (512, 1024))
    # the kernel's shared memory stays within the 48 KiB a CTA has without an opt-in: counts, first rows, a chunk's
    # keys, the warps' counts (int32 each)
    assert max(4 * (2 * b + placers(b) * SEGMENT + COUNT_WORDS) for b in (512, 1024)) <= 48 * 1024
    with pytest.raises(ValueError, match=r"buckets must be one of \(512, 1024, 4096\), got 1000"):
        RunTableConfig(buckets=1000)


def test_run_table_buckets_dispatched(monkeypatch):
    """Dispatch places side by side from RUN_TABLE_SIDE_BY_SIDE_MIN_SLOTS slots where the counts fit (the measured
    cut), warp 0 alone below it, past 1,023 experts, or with the cut None."""
    from cute_kernels.run_table import BUCKETS
    from nvfp4_gemv.linear import kernels

    lo = kernels.RUN_TABLE_SIDE_BY_SIDE_MIN_SLOTS
    assert lo == 192  # BENCHMARKS.md, "The run table placed side by side, and runs of 16 from 8 slots"
    assert kernels.run_table_buckets(lo, 128) == 512
    assert kernels.run_table_buckets(lo - 1, 128) == BUCKETS
    assert kernels.run_table_buckets(10**5, 511) == 512
    assert kernels.run_table_buckets(10**5, 512) == 1024
    assert kernels.run_table_buckets(10**5, 1024) == BUCKETS
    monkeypatch.setattr(kernels, "RUN_TABLE_SIDE_BY_SIDE_MIN_SLOTS", None)
    assert kernels.run_table_buckets(10**5, 8) == BUCKETS


@pytest.mark.parametrize("arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("ids", ["i32", "i64"])
@pytest.mark.parametrize("buckets", [512, 1024, 4096])
def test_run_table_kernel_ptx(tmp_path, arch, ids, buckets):
    """The run table's maker counts with integer shared-memory atomics (no global or float atomics), ranks a round
    of 32 slots with match.any and popc, scans the buckets with shuffles, and reads the ids in their own width; the
    warps placing side by side take two barriers a chunk more (their ranks, then their counts summed)."""
    from registers import compiled_ptx

    tmp_path.mkdir(exist_ok=True)
    ptx = compiled_ptx("run_table", "RunTable", {"ids": ids, "buckets": buckets}, arch, tmp_path)
    assert "atom.shared.add.u32" in ptx and "atom.global" not in ptx and "red.global" not in ptx
    assert "match.any.sync.b32" in ptx and "popc.b32" in ptx and "shfl.sync.up.b32" in ptx
    assert len(re.findall(r"\bbar\.sync\b|\bbarrier\.sync\b", ptx)) == (5 if buckets == 4096 else 7)
    assert "griddepcontrol.launch_dependents" in ptx  # the routed kernel after it may start at once
    assert ("ld.global.b64" in ptx or "ld.global.u64" in ptx or "ld.global.s64" in ptx) == (ids == "i64")


# ---------------------------------------------------------------- on the GPU


def _assert_close(y, a):
    """Within fp32 accumulation error plus one rounding to x's dtype of the reference, elementwise."""
    ref = experts_reference(**{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in a.items()}).double()
    w = torch.stack([dequantize(a["weight"][e].cpu(), a["weight_scale"][e].cpu(), a["fmt"], "plain",
                                None if a["global_scale"] is None else a["global_scale"][e].cpu())
                     for e in range(a["weight"].shape[0])]).double()
    ids = a["expert_ids"].cpu().long()
    magnitude = torch.einsum("tk,tjnk->tjn", a["x"].cpu().double().abs(), w[ids].abs())
    ulp = 2.0 ** -(7 if a["x"].dtype == torch.bfloat16 else 10)
    y = y.cpu().double()
    finite = ref.isfinite()  # past the output dtype's range (fp16 at MXFP4's wide scales): the same infinity
    assert torch.equal(y[~finite], ref[~finite])
    err = (y - ref).abs()[finite]
    assert (err <= (1e-5 * magnitude + ulp * ref.abs())[finite] + 1e-30).all(), err.max()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("e,n,k,t,top_k", [(5, 72, 128, 1, 1), (4, 200, 2880, 3, 2), (8, 130, 4096, 16, 4),
                                           (32, 2880, 2880, 1, 4), (3, 1, 64, 5, 3), (6, 520, 7168, 2, 6)])
def test_gpu_matches_reference(fmt, dtype, e, n, k, t, top_k):
    for ids_dtype, gs, bias in ((torch.int64, True, True), (torch.int32, False, False)):
        a = operands(fmt, e, n, k, t, top_k, dtype, ids_dtype, gs, bias, device="cuda")
        y = fp4_experts_linear(**a)
        assert y.shape == (t, top_k, n) and y.dtype == dtype
        _assert_close(y, a)
        assert torch.equal(torch.ops.nvfp4_gemv.fp4_experts_linear(*op_args(a)), y)


def shared_ids(t, top_k, e, seed=0, device="cuda"):
    """Router-like ids that share experts: each token's top_k drawn from few experts (some named by 9+ slots, so
    their runs are cut), one token naming one expert twice."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, e, (t, top_k), generator=g)
    ids[0, :] = 0
    if top_k > 1:
        ids[-1, 0] = ids[-1, 1]
    return ids.to(device)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("e,n,k,t,top_k", [(3, 200, 2880, 16, 4), (2, 72, 128, 16, 8), (32, 520, 1024, 16, 4),
                                           (1, 130, 4096, 9, 1), (4, 1, 64, 7, 3), (6, 256, 512, 64, 4),
                                           (128, 96, 2880, 64, 8), (5, 64, 256, 200, 6)])
def test_gpu_shared_experts_grouped_match_reference_and_slots(fmt, dtype, e, n, k, t, top_k):
    """Slots that share an expert, computed in runs of 8 (expert_group, forced: these experts are small enough that
    dispatch may not group them): within the tolerance of the reference, and bit-identical to the same kernel one
    slot a CTA; ids out of range form a NaN run of their own."""
    import functools

    from nvfp4_gemv.linear import kernels

    a = operands(fmt, e, n, k, t, top_k, dtype, torch.int32, fmt == "nvfp4", True, device="cuda")
    a["expert_ids"] = shared_ids(t, top_k, e)
    grouped = EagerExperts(bind=functools.partial(kernels.bind_experts, expert_group=True), max_tokens=1 << 30)
    y = grouped(*op_args(a))
    _assert_close(y, a)
    slots = EagerExperts(bind=functools.partial(kernels.bind_experts, expert_group=False), max_tokens=1 << 30)
    assert torch.equal(slots(*op_args(a)), y)
    if t <= EXPERTS_MAX_TOKENS:
        assert torch.equal(fp4_experts_linear(**a), y)  # dispatched, whichever kernel it takes
    bad = a["expert_ids"].clone()
    bad[1::3, 0] = e + 1  # a run of ids out of range amid good ones
    yb = grouped(*op_args({**a, "expert_ids": bad}))
    nan = torch.zeros_like(bad, dtype=torch.bool)
    nan[1::3, 0] = True
    assert yb[nan].isnan().all() and torch.equal(yb[~nan], y[~nan])
    # The same runs from the table made on the device (expert_runs, int32 ids as the table holds them), in runs of
    # one token tile and of two (16 slots a CTA row; a run of 8 or fewer slots there takes the one-tile body): the
    # same bits
    for tiles in (1, 2):
        runs = EagerExperts(bind=functools.partial(kernels.bind_experts, expert_runs=True, token_tiles=tiles),
                            max_tokens=1 << 30)
        assert torch.equal(runs(*op_args(a)), y), tiles
        assert torch.equal(runs(*op_args({**a, "expert_ids": bad})).nan_to_num(7.0), yb.nan_to_num(7.0)), tiles


@pytest.mark.gpu
def test_gpu_bad_ids_give_nan_rows_only():
    a = operands("nvfp4", t=4, top_k=3, device="cuda")
    good = fp4_experts_linear(**a)
    ids = a["expert_ids"].clone()
    ids[1, 2], ids[3, 0] = 5, -1
    y = fp4_experts_linear(**{**a, "expert_ids": ids})
    bad = torch.zeros(4, 3, dtype=torch.bool)
    bad[1, 2] = bad[3, 0] = True
    assert y[bad.cuda()].isnan().all()
    assert torch.equal(y[~bad.cuda()], good[~bad.cuda()])
    huge = a["expert_ids"].clone()
    huge[0, 0] = 2**32  # an int64 id is compared whole, not truncated to 0
    assert fp4_experts_linear(**{**a, "expert_ids": huge})[0, 0].isnan().all()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_past_max_tokens_groups_by_expert_on_the_host(fmt):
    t = EXPERTS_MAX_TOKENS + 1
    # experts whose scales start 16-byte aligned, and experts whose scales do not (N·K/16 or N·K/32 bytes each)
    _assert_close(fp4_experts_linear(**operands(fmt, e=6, n=3, k=384, t=t, top_k=4, device="cuda")),
                  operands(fmt, e=6, n=3, k=384, t=t, top_k=4, device="cuda"))
    a = operands(fmt, e=6, n=256, k=512, t=t, top_k=4, device="cuda")
    _assert_close(fp4_experts_linear(**a), a)
    a["expert_ids"][3, 1] = 6
    with pytest.raises(ValueError, match=r"^expert_ids: expected values in \[0, 6\)"):
        fp4_experts_linear(**a)
    a["expert_ids"][3, 1] = 0
    with pytest.raises(ValueError, match=rf"^expert_ids: {t} tokens are grouped by expert on the host"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            fp4_experts_linear(**a)


@pytest.mark.gpu
def test_gpu_cuda_graph_compile_and_repeats():
    """Captured once, replayed with other ids and x in the same buffers; torch.compile(fullgraph); 100 calls
    bit-identical."""
    a = operands("mxfp4", e=8, n=384, k=2880, t=4, top_k=4, device="cuda")
    x, ids = a["x"].clone(), a["expert_ids"].clone()
    call = lambda: fp4_experts_linear(x, a["weight"], a["weight_scale"], ids, "mxfp4", None, a["bias"])  # noqa
    first = call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    b = operands("mxfp4", e=8, n=384, k=2880, t=4, top_k=4, seed=1, device="cuda")
    x.copy_(b["x"]), ids.copy_(b["expert_ids"])
    graph.replay()
    torch.cuda.synchronize()
    _assert_close(out, {**a, "x": b["x"], "expert_ids": b["expert_ids"]})
    torch._dynamo.reset()
    f = torch.compile(lambda xx, ii: fp4_experts_linear(xx, a["weight"], a["weight_scale"], ii, "mxfp4", None,
                                                             a["bias"]), fullgraph=True)
    assert torch.equal(f(a["x"], a["expert_ids"]), first)
    for _ in range(100):
        assert torch.equal(fp4_experts_linear(**a), first)


@pytest.mark.gpu
def test_gpu_run_table_captured_in_a_graph():
    """The run table (made on the device, no sync) and the runs kernel captured in a CUDA graph, replayed with other
    ids: the grouped kernel's answer for those ids."""
    import functools

    from nvfp4_gemv.linear import kernels

    a = operands("nvfp4", e=6, n=256, k=512, t=40, top_k=4, device="cuda")
    a["expert_ids"] = shared_ids(40, 4, 6)
    runs = EagerExperts(bind=functools.partial(kernels.bind_experts, expert_runs=True), max_tokens=1 << 30)
    grouped = EagerExperts(bind=functools.partial(kernels.bind_experts, expert_group=True), max_tokens=1 << 30)
    x, ids = a["x"].clone(), a["expert_ids"].clone()
    runs(x, a["weight"], a["weight_scale"], ids, "nvfp4", a["global_scale"], a["bias"])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = runs(x, a["weight"], a["weight_scale"], ids, "nvfp4", a["global_scale"], a["bias"])
    other = shared_ids(40, 4, 6, seed=3)
    ids.copy_(other)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, grouped(*op_args({**a, "expert_ids": other})))


@pytest.mark.gpu
def test_gpu_run_table_kernel_matches_the_torch_table():
    """The table made by cute_kernels.run_table equals run_table_torch's, element for element: random ids in and
    out of range (an int64 id past 2^32 among them), both id dtypes, slot counts about a round of 32 and a staged
    chunk, few and many experts up to the kernel's last, on both sides of the warps placing side by side (runs that
    cross the warps' segments and the chunks among them), each placement where it applies; run_table, the kernel or
    not, the torch table."""
    from cute_kernels.run_table import BUCKETS, CHUNK, RunTable, buckets_for
    from nvfp4_gemv.linear import kernels

    g = torch.Generator().manual_seed(1)
    cases = [(1, 1), (31, 3), (32, 5), (33, 1), (CHUNK - 1, 7), (CHUNK, 64), (CHUNK + 1, 200), (3 * CHUNK + 17, 128),
             (600, BUCKETS - 1), (600, BUCKETS), (2 * CHUNK + 5, 511), (CHUNK + 40, 512), (CHUNK // 2 + 3, 512),
             (3 * CHUNK + 9, 1023), (700, 1024), (5000, 2)]
    for i, (slots, e) in enumerate(cases):
        ids = torch.randint(-3, e + 3, (slots,), generator=g)
        if i % 3 == 0:  # router-like: few experts named, long runs
            ids = torch.randint(0, min(e, 4), (slots,), generator=g)
        if slots > 2:
            ids[2] = 2**32 + 1
        for dtype in (torch.int64, torch.int32):
            flat = ids if dtype == torch.int64 else ids.clamp(-2**31, 2**31 - 1).to(torch.int32)
            for shape in ((slots, 1), (1, slots)):
                dev = flat.view(shape).cuda()
                for cap in (8, 16):  # one token tile a run, or two
                    if RunTable.can_implement(slots, e):
                        want = kernels.run_table_torch(flat.view(shape), e, cap)
                        for buckets in {buckets_for(e), BUCKETS}:
                            got = kernels.run_table_kernel(dev.reshape(-1), e, cap, buckets)
                            assert torch.equal(got.cpu(), want), (slots, e, dtype, cap, buckets)
                        got = kernels.run_table_kernel(dev.reshape(-1), e, cap)  # as dispatched
                        assert torch.equal(got, kernels.run_table_torch(dev, e, cap))
                    assert torch.equal(kernels.run_table(dev, e, cap), kernels.run_table_torch(dev, e, cap))
