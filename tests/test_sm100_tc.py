"""CPU tests of the sm_100a tensor-core GEMV: its PTX, its refusal of other targets, the scale views its TMA
reads, the fake-tensor signature against docs/contract.md, and the stream-K schedule's coverage and determinism."""

import itertools

import numpy as np
import pytest

import cutlass
import cutlass.cute as cute

from cute_kernels import gemv_tc_sm100 as tc
from cute_kernels import tile_scheduler as ts
from cute_kernels.compile import compile_kernel
from layouts import closed_form, sf_cute

TEST_SHAPES = [
    (128, 256, 1), (128, 1536, 1), (128, 3072, 1), (256, 7168, 1), (2432, 4608, 2),
    (384, 7168, 2), (512, 512, 2), (512, 4096, 2), (512, 1536, 2),
]
BENCH_SHAPES = [(7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4)]
ODD_SHAPES = [(1, 64, 1), (127, 192, 3), (129, 320, 2), (1000, 576, 8), (1, 4096, 8), (1000, 64, 1)]
ALL_SHAPES = TEST_SHAPES + BENCH_SHAPES + ODD_SHAPES
TILE_K = tc.GemvTcSm100Config().tile_k


# ---------------------------------------------------------------- compile (one compile for every shape)


# MMA N = 8, the smallest legal N, and N = 128, one CUTLASS validates (it reads b's 128 padded rows, no padding work).
TC_CONFIGS = {"n8": tc.GemvTcSm100Config(), "n128": tc.GemvTcSm100Config(mma_n=128, stages=6)}


@pytest.fixture(scope="module", params=list(TC_CONFIGS))
def tc_build(request, tmp_path_factory):
    cfg = TC_CONFIGS[request.param]
    dump = tmp_path_factory.mktemp(f"ptx-{request.param}")
    compiled = compile_kernel(tc.GemvTcSm100, cfg, "sm_100a", options=f"--keep-ptx --dump-dir={dump}")
    assert compiled.__ptx__, "compile produced no PTX"
    return cfg, compiled.__ptx__


@pytest.fixture(scope="module")
def ptx(tc_build):
    return tc_build[1]


@pytest.fixture(scope="module")
def cfg(tc_build):
    return tc_build[0]


def test_config_checks_its_resources():
    assert TC_CONFIGS["n8"].tmem_columns() == 64 and TC_CONFIGS["n8"].sf_tmem_col == 32
    assert TC_CONFIGS["n128"].tmem_columns() == 512 and TC_CONFIGS["n128"].sf_tmem_col == 256
    with pytest.raises(ValueError, match="shared-memory ring"):
        tc.GemvTcSm100Config(mma_n=128, stages=8)
    with pytest.raises(ValueError, match="TMEM columns"):
        tc.GemvTcSm100Config(mma_n=256, stages=4)
    with pytest.raises(ValueError, match="mma_n"):
        tc.GemvTcSm100Config(mma_n=12)


@pytest.mark.slow
def test_ptx_has_block_scaled_tensor_core_path(ptx):
    mma = [ln for ln in ptx.splitlines() if "tcgen05.mma" in ln]
    # One MMA per 64-wide K block of a stage, all kind::mxf4nvf4 with 16-element (nvfp4) scale blocks.
    assert len(mma) == TILE_K // 64
    assert all("cta_group::1" in ln and "kind::mxf4nvf4" in ln and "block_scale.block16" in ln for ln in mma)
    cp = [ln for ln in ptx.splitlines() if "tcgen05.cp" in ln]
    assert len(cp) == 2 * (TILE_K // 64) and all("32x128b.warpx4" in ln for ln in cp)  # SFA and SFB, per K block
    assert "tcgen05.ld.sync.aligned.32x32b" in ptx
    tma = [ln for ln in ptx.splitlines() if "cp.async.bulk.tensor" in ln]
    assert len(tma) == 4 and all("mbarrier::complete_tx" in ln for ln in tma)  # A, b, SFA, SFB
    assert "tcgen05.alloc" in ptx and "tcgen05.dealloc" in ptx


@pytest.mark.slow
def test_ptx_combines_splits_without_float_atomics(ptx):
    atoms = [ln.split()[0] for ln in ptx.splitlines() if ln.strip().startswith(("atom.", "red."))]
    assert atoms == ["atom.global.acq_rel.add.u32"]  # the one integer arrival counter
    assert "fence.acq_rel.gpu" in ptx and "ld.relaxed.gpu.global" in ptx


@pytest.mark.slow
def test_compile_is_cached_per_config():
    cfg = tc.GemvTcSm100Config()
    assert compile_kernel(tc.GemvTcSm100, cfg, "sm_100a") is compile_kernel(tc.GemvTcSm100, cfg, "sm_100a")


def test_compile_for_sm90_is_refused():
    with pytest.raises(ValueError, match=r"sm_100a.*sm_90a"):
        compile_kernel(tc.GemvTcSm100, tc.GemvTcSm100Config(), "sm_90a")


def test_can_implement():
    assert all(tc.GemvTcSm100.can_implement(*s) for s in ALL_SHAPES)
    assert not tc.GemvTcSm100.can_implement(128, 96, 1)
    assert not tc.GemvTcSm100.can_implement(128, 0, 1)
    assert not tc.GemvTcSm100.can_implement(0, 256, 1)
    assert not tc.GemvTcSm100.can_implement(128, 256, 0)


# ---------------------------------------------------------------- the compile signature against docs/contract.md


@pytest.mark.parametrize("m,k,l", ALL_SHAPES)
def test_fake_arguments_match_contract(m, k, l):
    a, b, sfa, sfb, c, partial, arrival = tc.fake_arguments(m, k, l)
    rm, rk = closed_form.rest_mk(m, k)
    # fp4 tensors are counted in fp4 elements: twice the byte strides of the contract, K stride 1 nibble.
    assert (a.shape, a.stride) == ((m, k, l), (k, 1, m * k))
    assert (b.shape, b.stride) == ((128, k, l), (k, 1, 128 * k))
    assert (sfa.shape, sfa.stride) == ((32, 4, rm, 4, rk, l), (16, 4, 512 * rk, 1, 512, 512 * rm * rk))
    assert (sfb.shape, sfb.stride) == ((32, 4, 1, 4, rk, l), (16, 4, 512 * rk, 1, 512, 512 * rk))
    assert (c.shape, c.stride) == ((m, 1, l), (1, 1, m))
    assert partial.shape == (ts.workspace_elems(tc.SM100_NUM_SMS),)
    assert arrival.shape == (ts.num_m_tiles(m) * l,)


# ---------------------------------------------------------------- the scale tiles the TMA reads


def _flat(t):
    return [x for e in t for x in _flat(e)] if isinstance(t, tuple) else [t]


def _mode_offsets(shape, stride):
    """Offsets of a (possibly nested) layout mode for its 1-D index 0..size-1 (first sub-mode fastest)."""
    shapes, strides = _flat(shape), _flat(stride)
    x = np.arange(int(np.prod(shapes)), dtype=np.int64)
    out = np.zeros_like(x)
    div = 1
    for s, d in zip(shapes, strides):
        out += (x // div) % s * d
        div *= s
    return out


@cute.jit
def _sf_tiles(m: cutlass.Constexpr, k: cutlass.Constexpr, l: cutlass.Constexpr, tile_k: cutlass.Constexpr,
              out: cutlass.Constexpr):
    # The kernel's SFA view, cut into its TMA boxes: ((128 rows, tile_k), (M tiles, K tiles, L)).
    tiled = cute.zipped_divide(sf_cute.sf_layout_permuted_mkl(m, k, l), (128, tile_k))
    out.append((tiled.shape, tiled.stride))


def _sf_tiled(m, k, l, tile_k):
    out = []
    _sf_tiles(m, k, l, tile_k, out)
    return out[0]


@pytest.mark.parametrize("m,k,l", ALL_SHAPES + [(128, k, l) for (_, k, l) in BENCH_SHAPES])
def test_sfa_tma_boxes_match_contract_formula(m, k, l):
    tile_k = TILE_K if k % TILE_K == 0 else 64  # odd K: check at the 64-wide atom the TMA box is made of
    shape, stride = _sf_tiled(m, k, l, tile_k)
    (tile_shape, rest_shape), (tile_stride, rest_stride) = shape, stride
    # Inside one box: (row i, K element e) -> byte, against docs/contract.md's offset formula at tile (0, 0, 0).
    rows = _mode_offsets(tile_shape[0], tile_stride[0])
    cols = _mode_offsets(tile_shape[1], tile_stride[1])
    box = rows[:, None] + cols[None, :]
    i, e = np.meshgrid(np.arange(128), np.arange(tile_k), indexing="ij")
    np.testing.assert_array_equal(box, closed_form.permuted_mkl_offset(i, e, 0, m, k))
    # A box is one contiguous run of 128 * tile_k / 16 bytes: one bulk copy, no gaps, no overlap.
    assert sorted(set(box.ravel().tolist())) == list(range(128 * tile_k // 16))
    # Box origins for every (M tile, K tile, batch).
    rm, rk, rl = _flat(rest_shape)[0], _flat(rest_shape)[1], int(np.prod(_flat(rest_shape)[2:]))
    assert (rm, rk, rl) == (ts.num_m_tiles(m), k // tile_k, l)
    origin = _mode_offsets(rest_shape, rest_stride).reshape(rl, rk, rm)
    for mt, kt, b in itertools.product(range(rm), range(rk), range(l)):
        assert origin[b, kt, mt] == closed_form.permuted_mkl_offset(mt * 128, kt * tile_k, b, m, k)


# ---------------------------------------------------------------- the stream-K schedule


def _simulate(m, k, l, num_ctas):
    k_tiles = ts.num_k_tiles(k, TILE_K)
    tiles = ts.num_output_tiles(m, l)
    total = tiles * k_tiles
    consumed = np.zeros((tiles, k_tiles), dtype=np.int64)
    segments = {t: [] for t in range(tiles)}
    slots = set()
    per_cta = []
    for g in range(num_ctas):
        work = 0
        for tile, k0, k1, n, slot in ts.cta_segments(g, num_ctas, m, k, l, TILE_K):
            assert 0 <= k0 < k1 <= k_tiles
            consumed[tile, k0:k1] += 1
            segments[tile].append((g, k0, k1, n, slot))
            work += k1 - k0
            if n > 1:
                off = ts.partial_offset(g, slot, 0)
                assert off not in slots and 0 <= off and off + 127 < ts.workspace_elems(num_ctas)
                slots.add(off)
        per_cta.append(work)
    return k_tiles, tiles, total, consumed, segments, per_cta


@pytest.mark.parametrize("m,k,l", ALL_SHAPES)
@pytest.mark.parametrize("num_sms", [148, 132, 7, 1])
def test_schedule_covers_every_k_tile_once_and_writes_every_output_once(m, k, l, num_sms):
    num_ctas = ts.choose_num_ctas(m, k, l, num_sms, TILE_K)
    k_tiles, tiles, total, consumed, segments, per_cta = _simulate(m, k, l, num_ctas)
    assert num_ctas == max(1, min(num_sms, total // ts.MIN_K_TILES_PER_CTA))
    assert (consumed == 1).all()  # every K element of every tile consumed exactly once
    assert max(per_cta) - min(per_cta) <= 1 and min(per_cta) >= 1  # balanced to one K tile
    written = np.zeros((m, l), dtype=np.int64)
    for t in range(tiles):
        segs = segments[t]
        first = ts.tile_first_cta(t, k_tiles, num_ctas, total)
        last = ts.tile_last_cta(t, k_tiles, num_ctas, total)
        # The contributors are exactly first..last, one segment each, in K order, and all know the count.
        assert [g for g, *_ in segs] == list(range(first, last + 1))
        assert [k0 for _, k0, *_ in segs] == [0] + [k1 for _, _, k1, *_ in segs[:-1]] and segs[-1][2] == k_tiles
        assert all(n == last - first + 1 for *_, n, _ in segs)
        # The slot the finishing CTA reads for contributor g is the slot g wrote.
        assert all(s == ts.partial_slot(g, t, k_tiles, num_ctas, total) for g, *_, s in segs)
        # Exactly one writer per tile: the lone contributor, or whichever CTA takes the counter to n - 1.
        mt, b = ts.output_tile_coord(t, ts.num_m_tiles(m))
        written[mt * 128 : min(m, (mt + 1) * 128), b] += 1
    assert (written == 1).all()


@pytest.mark.parametrize("shape,k_tiles_per_cta", [((7168, 16384, 1), 3584), ((4096, 7168, 8), 7168), ((7168, 2048, 4), 1792)])
def test_benchmark_shapes_fill_148_sms(shape, k_tiles_per_cta):
    m, k, l = shape
    num_ctas = ts.choose_num_ctas(m, k, l, 148, TILE_K)
    assert num_ctas == 148
    total = ts.num_output_tiles(m, l) * ts.num_k_tiles(k, TILE_K)
    assert total == k_tiles_per_cta
    work = [ts.cta_work_begin(g + 1, 148, total) - ts.cta_work_begin(g, 148, total) for g in range(148)]
    assert set(work) == {total // 148, total // 148 + 1}


def test_cta_of_work_inverts_cta_work_begin():
    for num_ctas, total in [(148, 3584), (148, 7168), (148, 1792), (7, 5), (148, 148), (3, 1000)]:
        for w in range(total):
            g = ts.cta_of_work(w, num_ctas, total)
            assert ts.cta_work_begin(g, num_ctas, total) <= w < ts.cta_work_begin(g + 1, num_ctas, total)


def test_next_segment_with_a_custom_minimum():
    # The kernel passes cutlass.min; any min-like callable gives the same segments.
    assert ts.next_segment(5, 30, 8, minimum=lambda a, b: a if a < b else b) == (0, 5, 8, 8)
    assert ts.next_segment(9, 12, 8) == (1, 1, 4, 12)


# ---------------------------------------------------------------- hardening: defects fixed, each with its test


@cute.jit
def _sfb_view(rows: cutlass.Constexpr, k: cutlass.Constexpr, l: cutlass.Constexpr, out: cutlass.Constexpr):
    layout = tc.GemvTcSm100.sfb_layout((rows, k, l))
    out.append((layout.shape, layout.stride))


@pytest.mark.parametrize("rows_b", [1, 8, 128, 256, 384])
def test_b_scale_view_is_the_128_row_buffer_whatever_bs_rows(rows_b):
    """b may carry any number of rows, but sfb_permuted always holds 128 (docs/contract.md). A view built from b's
    row count (the old code) strides batches by the wrong block count once rows_b > 128 and L > 1."""
    k, l = 512, 3  # noqa: E741
    out = []
    _sfb_view(rows_b, k, l, out)
    shape, stride = out[0]
    rows = _mode_offsets(shape[0], stride[0])
    kcol = _mode_offsets(shape[1], stride[1])
    batch = _mode_offsets(shape[2], stride[2])
    assert len(rows) == 128 and len(batch) == l
    i, e, b = np.meshgrid(np.arange(128), np.arange(k), np.arange(l), indexing="ij")
    got = rows[i] + kcol[e] + batch[b]
    np.testing.assert_array_equal(got, closed_form.permuted_mkl_offset(i, e, b, 128, k))


def _contributors(tile, k_tiles, num_ctas, total):
    """CTAs the kernel counts for `tile` (first..last under the effective CTA count)."""
    g = ts.effective_ctas(num_ctas, total)
    return range(ts.tile_first_cta(tile, k_tiles, g, total), ts.tile_last_cta(tile, k_tiles, g, total) + 1)


@pytest.mark.parametrize("m,k,l,num_ctas", [(128, 512, 1, 4), (128, 256, 1, 2), (1, 64, 1, 148), (300, 2048, 3, 97)])
def test_more_ctas_than_work_leaves_no_counted_cta_without_work(m, k, l, num_ctas):
    """num_ctas above the work count (the compiled entry takes any value): every CTA counted as a contributor of a
    tile has a segment of it, so the finisher's arrival count is reached and the counter returns to zero. With 1
    tile, 2 K tiles and 4 CTAs the old schedule counted CTAs 1..3, of which CTA 2 had no work."""
    k_tiles = ts.num_k_tiles(k, TILE_K)
    total = ts.num_output_tiles(m, l) * k_tiles
    for tile in range(ts.num_output_tiles(m, l)):
        for g in _contributors(tile, k_tiles, num_ctas, total):
            assert any(t == tile for t, *_ in ts.cta_segments(g, num_ctas, m, k, l, TILE_K)), (tile, g)
    covered = [seg for g in range(num_ctas) for seg in ts.cta_segments(g, num_ctas, m, k, l, TILE_K)]
    assert sum(k1 - k0 for _, k0, k1, _, _ in covered) == total


def test_split_is_bounded_so_the_fan_in_is():
    """At least MIN_K_TILES_PER_CTA K tiles a CTA: a tile's finisher sums at most (k_tiles - 1) // 4 + 2 partials (the old
    choice gave one K tile a CTA on every test shape, a 64-way serial sum on the first benchmark shape)."""
    for m, k, l in ALL_SHAPES:  # noqa: E741
        num_ctas = ts.choose_num_ctas(m, k, l, 148, TILE_K)
        k_tiles = ts.num_k_tiles(k, TILE_K)
        total = ts.num_output_tiles(m, l) * k_tiles
        assert num_ctas == max(1, min(148, total // ts.MIN_K_TILES_PER_CTA))
        for tile in range(ts.num_output_tiles(m, l)):
            fan_in = len(_contributors(tile, k_tiles, num_ctas, total))
            assert fan_in <= (k_tiles - 1) // ts.MIN_K_TILES_PER_CTA + 2, (m, k, l, tile, fan_in)


def _simulate_split_protocol(m, k, l, num_ctas, rng):
    """The epilogue's protocol on the host, CTAs' segments interleaved at random: write the partial to its slot,
    bump the tile's counter; the CTA that sees the count reach contributors - 1 sums every contributor's slot in CTA
    order, writes the tile, and zeroes the counter. Returns (tile -> values written, counters, expected sums)."""
    k_tiles = ts.num_k_tiles(k, TILE_K)
    total = ts.num_output_tiles(m, l) * k_tiles
    g_eff = ts.effective_ctas(num_ctas, total)
    value = {(t, kt): float(rng.standard_normal()) for t in range(ts.num_output_tiles(m, l)) for kt in range(k_tiles)}
    queues = {g: list(ts.cta_segments(g, num_ctas, m, k, l, TILE_K)) for g in range(num_ctas)}
    slots, counters, written, expected = {}, {}, {}, {}
    for t in range(ts.num_output_tiles(m, l)):
        parts = []
        for g in _contributors(t, k_tiles, num_ctas, total):
            seg = [s for s in queues[g] if s[0] == t]
            parts.append(sum(value[(t, kt)] for kt in range(seg[0][1], seg[0][2])) if seg else None)
        acc = 0.0
        for p in parts:
            acc = acc + p
        expected[t] = acc
    while any(queues.values()):
        g = rng.choice([c for c, q in queues.items() if q])
        t, k0, k1, n, slot = queues[g].pop(0)
        part = 0.0
        for kt in range(k0, k1):
            part = part + value[(t, kt)]
        first = ts.tile_first_cta(t, k_tiles, g_eff, total)
        last = ts.tile_last_cta(t, k_tiles, g_eff, total)
        assert n == last - first + 1
        if first == last:
            written.setdefault(t, []).append(part)
            continue
        slots[ts.partial_offset(g, slot, 0)] = (g, t, part)
        arrived = counters.get(t, 0)
        counters[t] = arrived + 1
        if arrived == last - first:
            acc = 0.0
            for c in range(first, last + 1):
                owner, tile, p = slots[ts.partial_offset(c, ts.partial_slot(c, t, k_tiles, g_eff, total), 0)]
                assert (owner, tile) == (c, t), "a slot was overwritten before the finisher read it"
                acc = acc + p
            written.setdefault(t, []).append(acc)
            counters[t] = 0
    return written, counters, expected


@pytest.mark.parametrize("seed", range(12))
def test_split_protocol_under_random_interleavings_and_cta_counts(seed):
    rng = np.random.default_rng(seed)
    m = int(rng.choice([1, 127, 128, 300, 1000, 7168]))
    k = int(rng.choice([64, 256, 768, 2048, 16384]))
    l = int(rng.integers(1, 5))  # noqa: E741
    num_ctas = int(rng.integers(1, 400))  # above the work count too
    written, counters, expected = _simulate_split_protocol(m, k, l, num_ctas, rng)
    assert sorted(written) == list(range(ts.num_output_tiles(m, l)))
    assert all(len(v) == 1 for v in written.values()), "a tile was written more than once"
    assert all(written[t][0] == expected[t] for t in written), "not the CTA-ordered sum"  # bit for bit
    assert all(c == 0 for c in counters.values())


@pytest.mark.slow
def test_ptx_orders_tmem_handoffs_with_tcgen05_fences(ptx):
    """tcgen05.fence::before/after_thread_sync around the TMEM allocation handoff, the epilogue's release of an
    accumulator buffer, and the final barrier before dealloc (the DSL's documentation of tcgen05 ordering)."""
    lines = [ln.strip() for ln in ptx.splitlines()]

    def at(pattern, start=0):
        return next(i for i in range(start, len(lines)) if pattern in lines[i])

    alloc = at("tcgen05.alloc")
    before = at("tcgen05.fence::before_thread_sync", alloc)
    assert before < at("bar.sync", alloc) < at("tcgen05.fence::after_thread_sync", alloc)
    wait_ld = at("tcgen05.wait::ld")
    assert at("tcgen05.fence::before_thread_sync", wait_ld) < at("mbarrier.arrive", wait_ld)
    dealloc = at("tcgen05.dealloc")
    tail = [" ".join(x.split()) for x in lines[at("tcgen05.relinquish_alloc_permit"):dealloc]]
    assert [x for x in tail if x.startswith(("tcgen05.fence", "bar.sync"))] == [
        "tcgen05.fence::before_thread_sync;", "bar.sync 2, 128;", "tcgen05.fence::after_thread_sync;"
    ]
    # The MMA warp fences after each wait on an empty accumulator, before its first MMA.
    assert sum("tcgen05.fence::after_thread_sync" in x for x in lines) >= 3


def test_workspace_is_kept_per_device_and_stream(monkeypatch):
    """Two calls on two streams must not share partials and counters: the launcher keys its workspace by (device,
    workspace_key()), which the library binds to torch's current stream. A stub stands in for the compiled kernel."""
    import torch

    from cute_kernels import tc_workspace
    from cute_kernels.tc_workspace import TcLauncher
    from submission.reference import generate_input

    calls = []
    stream = ["s1"]
    launcher = TcLauncher(lambda *args: calls.append(args), tc.GemvTcSm100Config(), workspace_key=lambda: stream[0])
    monkeypatch.setitem(tc_workspace._SM_COUNTS, 0, 148)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    a, b, _, _, sfa_p, sfb_p, c = generate_input(256, 4096, 2, seed=0)
    launcher(a, b, sfa_p, sfb_p, c)
    launcher(a, b, sfa_p, sfb_p, c)
    stream[0] = "s2"
    launcher(a, b, sfa_p, sfb_p, c)
    assert sorted(launcher.workspaces) == [(0, "s1"), (0, "s2")]
    (p1, r1), (p2, r2) = [(x[5], x[6]) for x in (calls[0], calls[2])]
    assert calls[0][5] is calls[1][5] and p1.data_ptr() != p2.data_ptr() and r1.data_ptr() != r2.data_ptr()
    num_ctas = ts.choose_num_ctas(256, 4096, 2, 148, TILE_K)
    assert calls[0][7] == num_ctas and p1.numel() >= ts.workspace_elems(num_ctas)
    assert r1.numel() >= ts.num_output_tiles(256, 2) and not r1.any()  # counters start at zero


# ---------------------------------------------------------------- PTX facts the data path depends on

import re  # noqa: E402


def _defs(ptx, reg):
    """Lines of `ptx` that write register `reg` (its first operand)."""
    return [" ".join(ln.split()) for ln in ptx.splitlines() if re.match(rf"^\s*[a-z][\w.:]*\s+{re.escape(reg)}[,;]", ln)]


def _mma_lines(ptx):
    return [ln.strip() for ln in ptx.splitlines() if "tcgen05.mma" in ln]


def _mma_operands(line):
    # tcgen05.mma... [d_tmem], a_desc, b_desc, idesc, [sfa_tmem], [sfb_tmem], enable_input_d;
    return [x.strip(" [];") for x in line.split(None, 1)[1].split(",")]


def expected_idesc(m=128, n=8):
    """tcgen05 block-scaled instruction descriptor (CUTLASS's UMMA::InstrDescriptorBlockScaled) with the scale-id
    and negate bits clear: A and B e2m1 (format 1) at bits 7-9 and 10-12, N >> 3 at bits 17-22, ue4m3 scales (0)
    at bit 23, M >> 4 at bits 24-28."""
    return (1 << 7) | (1 << 10) | ((n >> 3) << 17) | ((m >> 4) << 24)


@pytest.mark.slow
def test_ptx_instruction_descriptor_is_m128_n_e2m1_ue4m3(ptx, cfg):
    constants = set()
    for line in _mma_lines(ptx):
        idesc = _mma_operands(line)[3]
        frontier, seen = [idesc], set()
        while frontier:  # every constant the descriptor operand is built from
            reg = frontier.pop()
            if reg in seen:
                continue
            seen.add(reg)
            for d in _defs(ptx, reg):
                for tok in re.findall(r"%r\d+|\b\d+\b", d.split(None, 2)[2]):
                    (frontier.append(tok) if tok.startswith("%") else constants.add(int(tok)))
    assert expected_idesc(128, cfg.mma_n) in constants
    assert all(expected_idesc(128, n) not in constants for n in (8, 16, 64, 128, 256) if n != cfg.mma_n)
    assert 0x60000000 in constants and 48 in constants  # the A and B scale-id fields, taken from the TMEM addresses


@pytest.mark.slow
def test_ptx_expect_tx_is_the_sum_of_the_tma_boxes(ptx, cfg):
    boxes = 128 * cfg.tile_k // 2 + cfg.mma_n * cfg.tile_k // 2 + 2 * 128 * (cfg.tile_k // 16)  # A, b, SFA, SFB
    lines = [ln.strip() for ln in ptx.splitlines()]
    expect = [ln for ln in lines if "mbarrier.arrive.expect_tx" in ln]
    assert len(expect) == 1
    reg = expect[0].rstrip(";").split(",")[-1].strip()
    assert _defs(ptx, reg) == [f"mov.b32 {reg}, {boxes};"]
    assert boxes == {8: 21504, 128: 36864}[cfg.mma_n]


@pytest.mark.slow
def test_ptx_first_mma_of_each_segment_resets_the_accumulate_flag(ptx):
    mmas = _mma_lines(ptx)
    assert len(mmas) == TILE_K // 64
    first_pred = _mma_operands(mmas[0])[-1]
    defs = _defs(ptx, first_pred)
    assert f"mov.pred {first_pred}, 0;" in defs and f"mov.pred {first_pred}, -1;" in defs  # reset, then carried
    lines = [" ".join(ln.split()) for ln in ptx.splitlines()]
    reset = lines.index(f"mov.pred {first_pred}, 0;")
    assert reset < lines.index(" ".join(mmas[0].split())) and lines[reset + 1].startswith("$L__")  # before the loop
    for line in mmas[1:]:  # the later K blocks of a stage always accumulate
        assert _defs(ptx, _mma_operands(line)[-1]) == [f"mov.pred {_mma_operands(line)[-1]}, -1;"]


@pytest.mark.slow
def test_ptx_tmem_columns_lie_in_the_allocation_and_match_the_scale_copies(ptx, cfg):
    lines = [ln.strip() for ln in ptx.splitlines()]
    alloc = next(ln for ln in lines if ln.startswith("tcgen05.alloc"))
    cols_reg = alloc.rstrip(";").split(",")[-1].strip()
    cols = int(_defs(ptx, cols_reg)[0].rstrip(";").split(",")[-1])
    assert cols == cfg.tmem_columns()
    assert cfg.mma_n * cfg.acc_stages <= cfg.sf_tmem_col  # accumulators below the scales
    cp_dst = [ln.split("[", 1)[1].split("]", 1)[0] for ln in lines if ln.startswith("tcgen05.cp")]
    mma_sf = [reg for ln in _mma_lines(ptx) for reg in _mma_operands(ln)[4:6]]
    assert sorted(cp_dst) == sorted(mma_sf) and len(set(cp_dst)) == 2 * TILE_K // 64  # what is copied is multiplied
    offsets = []
    for reg in cp_dst:
        (d,) = _defs(ptx, reg)
        base, off = re.match(r"add\.s32\s+%r\d+, (%r\d+), (\d+);", d).groups()
        offsets.append(int(off))
    assert len(set(offsets)) == len(offsets) and all(cfg.sf_tmem_col <= o < cols for o in offsets)
