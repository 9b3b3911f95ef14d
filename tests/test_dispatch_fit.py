"""The GEMV's many-rows model (nvfp4_gemv.dispatch: wave_score) against the committed sweeps it was fitted to, and
the held-out sweep measured after the fit (nvfp4_gemv.dispatch_fit). CPU only: the sweeps are CSVs under docs/."""

import math

import pytest

from nvfp4_gemv import dispatch, dispatch_fit


@pytest.fixture(scope="module")
def fitting_data():
    return dispatch_fit.load()


def committed(mkl):
    return dispatch_fit.pick(mkl, dispatch.WAVE_CONSTANTS, dispatch.WAVE_WEIGHTS)


def test_the_committed_numbers_are_the_fit_of_the_committed_sweeps(fitting_data):
    assert len(fitting_data) == 73  # shapes with every config measured, many rows
    constants, weights = dispatch_fit.fit(fitting_data)
    assert constants == dispatch.WAVE_CONSTANTS
    assert weights == dispatch.WAVE_WEIGHTS
    assert len(weights) == len(dispatch.WAVE_FEATURES)


def test_the_model_picks_within_a_few_percent_of_the_best_config(fitting_data):
    """Geomean x the read over the shapes: the fitting set and the held-out one, each against the best config of
    each shape as measured, and against the rule the model replaced (numbers in BENCHMARKS.md)."""
    best = dispatch_fit.geomean([min(c.values()) for c in fitting_data.values()])
    ours = dispatch_fit.picked(fitting_data, committed)
    assert ours == pytest.approx(1.1317, abs=5e-4) and ours / best < 1.01
    check = dispatch_fit.load(dispatch_fit.WAVE_CHECK)
    assert len(check) == 56 and not set(check) & set(fitting_data)
    best = dispatch_fit.geomean([min(c.values()) for c in check.values()])
    ours = dispatch_fit.picked(check, committed)
    assert ours == pytest.approx(1.1454, abs=5e-4) and ours / best < 1.015


def test_simt_config_for_takes_the_models_pick_where_rows_are_many():
    for m, k, l in ((31822, 1152, 4), (18353, 1856, 1), (7168, 16384, 1), (28672, 4096, 1), (4096, 7168, 8)):  # noqa: E741
        cfg = dispatch.simt_config_for(m, k, l)
        assert (cfg.warps, cfg.r_lanes, cfg.unroll) == committed((m, k, l))
    # The misses of the replaced rule that the fit is for (x the read, contest-timed, docs/*_contest.csv):
    assert committed((31822, 1152, 4))[0] == 3  # 1.30; 2-warp CTAs (the old pick) 1.50, 1-warp 1.23
    assert committed((18353, 1856, 1))[0] == 4  # 1.08; 1-warp CTAs (one wave, the old pick) 1.18


def test_wave_features_by_hand():
    """31822 x 1152 x 4 in 2-warp CTAs on 132 SMs: 996 slabs, 15936 CTAs, 16 an SM at 64 registers (7.55 waves);
    36 K pieces, 32 a CTA step, so a last step with 4 pieces; both warps busy."""
    f = dispatch.wave_features(996, 1152, 132, "permuted", (2, 2, 2))
    n = 15936 / (132 * 16)
    assert f == pytest.approx((math.log(8 / n), 0.0, 1.0, 4 / 32, math.log(132 * 16 * 2 / 132)))
    # Under one wave: 32 slabs of 4096 x 7168 x 1 in 8-warp CTAs (512 CTAs, 4 an SM); 224 pieces, 128 a CTA
    # step, so a last step of 96.
    f = dispatch.wave_features(32, 7168, 132, "permuted", (8, 2, 4))
    assert f == pytest.approx((0.0, math.log(512 / 528), 1.0, 96 / 128, math.log(512 * 8 / 132)))
