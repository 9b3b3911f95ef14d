"""The K-balanced schedule of the CUDA-core GEMV (cute_kernels.gemv_simt.GemvSimtBalanced), on the host: the
properties its fence-free finish of shared tiles relies on, over many shapes and grids, and its launcher's
workspace. Plain integer arithmetic (cute_kernels.tile_scheduler), so no GPU and no compile."""

import pytest
import torch

from cute_kernels import tile_scheduler as ts
from cute_kernels.gemv_simt import PARTIAL_EMPTY, GemvSimtConfig, GemvSimtBalanced
from cute_kernels.tc_workspace import SplitLauncher
from nvfp4_gemv.dispatch import BALANCED_CONFIGS, balanced_config, balanced_num_ctas

SHAPES = [(128, 256, 1), (129, 320, 2), (576, 7168, 1), (5760, 2880, 1), (7168, 16384, 1), (4096, 7168, 8),
          (1, 64, 1), (1000, 1024, 3), (384, 7168, 2)]


def _segments(cfg, m, k, l, num_ctas):  # noqa: E741
    """Every CTA's segments as the kernel walks them: [(tile, k_begin, k_end, first, last)] per CTA."""
    tiles, k_tiles = GemvSimtBalanced.tiles(cfg, m, k, l)
    total = tiles * k_tiles
    g_count = ts.effective_ctas(num_ctas, total)
    out = []
    for g in range(num_ctas):
        w, w_end = ts.cta_run(g, num_ctas, total)
        segs = []
        while w < w_end:
            tile, k0, k1, w = ts.next_segment(w, w_end, k_tiles)
            segs.append((tile, k0, k1, ts.tile_first_cta(tile, k_tiles, g_count, total),
                         ts.tile_last_cta(tile, k_tiles, g_count, total)))
        out.append(segs)
    return out, tiles, k_tiles


@pytest.mark.parametrize("m,k,l", SHAPES)
@pytest.mark.parametrize("warps", [1, 2, 4, 8])
@pytest.mark.parametrize("num_ctas", [1, 5, 37, 1056, 3696])
def test_every_k_step_once_and_shared_tiles_finished_last_by_their_first_cta(m, k, l, warps, num_ctas):
    cfg = GemvSimtConfig(warps=warps, r_lanes=2)
    runs, tiles, k_tiles = _segments(cfg, m, k, l, num_ctas)
    covered = {}
    for g, segs in enumerate(runs):
        for i, (tile, k0, k1, first, last) in enumerate(segs):
            for s in range(k0, k1):
                assert (tile, s) not in covered
                covered[(tile, s)] = g
            if first != last:
                # The finisher meets the tile at the end of its run; every other CTA of the tile at the start of
                # its run, and only one tile's partial (slot 0) is ever left by a CTA.
                if g == first:
                    assert i == len(segs) - 1 and k0 == 0
                else:
                    assert i == 0 and ts.partial_slot(g, tile, k_tiles, min(num_ctas, tiles * k_tiles),
                                                      tiles * k_tiles) == 0
                assert first <= g <= last
    assert len(covered) == tiles * k_tiles
    # Balance: every CTA's run is within one K step of every other's.
    sizes = [sum(k1 - k0 for _, k0, k1, _, _ in segs) for segs in runs]
    busy = [n for n in sizes if n]
    assert max(busy) - min(busy) <= 1


@pytest.mark.parametrize("m,k,l", SHAPES)
def test_dispatch_grid_of_the_schedule(m, k, l):  # noqa: E741
    for c in BALANCED_CONFIGS:
        cfg = balanced_config("permuted", *c)
        n = balanced_num_ctas(cfg, m, k, l, 132)
        tiles, k_tiles = GemvSimtBalanced.tiles(cfg, m, k, l)
        resident = 132 * (65536 // (cfg.max_registers * 32 * cfg.warps))
        assert 1 <= n <= min(resident, tiles * k_tiles)
        GemvSimtBalanced.workspace_shape(cfg, n, m, k, l)  # the Int32 schedule arithmetic holds


def test_grid_kernel_refuses_a_register_cap():
    from cute_kernels.gemv_simt import GemvSimt
    from cute_kernels.targets import target

    with pytest.raises(ValueError, match="no register cap"):
        GemvSimt(GemvSimtConfig(warps=2, r_lanes=2, max_registers=64), target("sm_90a"))
    with pytest.raises(ValueError, match="max_registers"):
        GemvSimtConfig(warps=2, r_lanes=2, max_registers=60)


def test_launcher_fills_a_new_workspace_with_the_empty_partial(monkeypatch):
    """A new workspace holds PARTIAL_EMPTY in every word (the kernel leaves it so after each launch); the plan is
    kept per (device, stream, shape), and a larger shape grows the partials, filled again."""
    from cute_kernels import tc_workspace

    calls = []
    cfg = balanced_config("permuted", 2, 2, 64)
    launcher = SplitLauncher(lambda *args: calls.append(args), GemvSimtBalanced, cfg,
                             lambda m, k, l, sms: balanced_num_ctas(cfg, m, k, l, sms))
    monkeypatch.setitem(tc_workspace._SM_COUNTS, 0, 132)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    from submission.reference import generate_input

    for m, k, l in [(256, 1024, 1), (256, 1024, 1), (4096, 7168, 2)]:  # noqa: E741
        a, b, _, _, sfa_p, sfb_p, c = generate_input(m, k, l, seed=0)
        launcher(a, b, sfa_p, sfb_p, c)
        partial, num_ctas = calls[-1][5], calls[-1][7]
        assert num_ctas == balanced_num_ctas(cfg, m, k, l, 132)
        assert partial.numel() >= ts.workspace_elems(num_ctas, cfg.rows_per_cta)
        assert bool((partial.view(torch.int32) == PARTIAL_EMPTY).all())
    assert calls[0][5] is calls[1][5] and len(launcher.plans) == 2


def test_workspace_shape_refuses_a_schedule_past_int32():
    cfg = balanced_config("permuted", 1, 2, 72)
    with pytest.raises(ValueError, match="2\\^31"):
        GemvSimtBalanced.workspace_shape(cfg, 3696, 1 << 20, 1 << 15, 1)
    assert GemvSimtBalanced.workspace_shape(cfg, 3696, 7168, 16384, 1) == (3696 * 2 * 8, 1)
