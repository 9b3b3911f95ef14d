"""Tests of submission.reference and nvfp4_gemv.shapes against docs/contract.md and the independent float64 GEMV
(submission.fp64_reference), which decodes fp4 and e4m3 from their bit formulas in numpy and reads raw storage, so
it shares neither the LUT nor torch's float8 cast with the reference. The bit formulas are themselves pinned below
against hand-written values."""

import math

import numpy as np
import pytest
import torch

from submission.reference import (
    FP4_E2M1_LUT,
    check,
    check_fp32_bound,
    exact_gemv,
    decode_e4m3,
    dequant_fp4,
    generate_full_range,
    generate_input,
    one_hot_probe,
    probe_expected,
    ref_kernel,
)
from nvfp4_gemv.shapes import BENCH_SHAPES, ODD_SHAPES, TEST_SHAPES, bytes_moved, floor_us
from submission.fp64_reference import e4m3_f64, fp4_f64, fp64_gemv

FP4 = torch.float4_e2m1fn_x2
FP8 = torch.float8_e4m3fn
GENERATORS = {"contest": generate_input, "full": generate_full_range}
SMALL_SHAPES = [(128, 256, 1), (129, 320, 2), (1, 64, 1), (127, 192, 3)]


# ---- the independent float64 GEMV (submission.fp64_reference, shared with `nvfp4-gemv check`) ----

np_fp4, np_e4m3 = fp4_f64, e4m3_f64


def raw(t):
    """The whole storage of `t` as a flat numpy uint8 array (the generator allocates dense buffers)."""
    assert t.storage_offset() == 0
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).numpy()


def np_codes(packed):
    """Packed bytes (..., n) -> fp4 codes (..., 2n), even index from the low nibble (docs/contract.md)."""
    return np.stack((packed & 0xF, packed >> 4), axis=-1).reshape(*packed.shape[:-1], -1)


def independent_gemv(data):
    """float64 c (M, L) from raw storage and the plain scales, decoded by bit formulas."""
    return fp64_gemv(data, "plain")


def as_c(values_ml):
    """(M, L) float64 -> (M, 1, L) float16 tensor, one rounding."""
    return torch.from_numpy(values_ml.astype(np.float16)).unsqueeze(1)


# ---- shapes ----


def test_shape_tables():
    assert len(TEST_SHAPES) == 9 and len(BENCH_SHAPES) == 3
    assert all(m % 128 == 0 and k % 256 == 0 for m, k, _ in TEST_SHAPES)
    assert all(k % 64 == 0 and m >= 1 for m, k, _ in ODD_SHAPES)
    assert any(m % 128 for m, _, _ in ODD_SHAPES)
    assert [s.mkl for s in BENCH_SHAPES] == [(7168, 16384, 1), (4096, 7168, 8), (7168, 2048, 4)]


@pytest.mark.parametrize(
    "idx,mb,h200_us", [(0, 66.1, 15.5), (1, 132.2, 31.1), (2, 33.1, 7.8)], ids=["bench0", "bench1", "bench2"]
)
def test_bytes_and_floor_match_contract_table(idx, mb, h200_us):
    s = BENCH_SHAPES[idx]
    assert round(bytes_moved(*s.mkl) / 1e6, 1) == mb
    assert round(floor_us(*s.mkl, 4.25e12), 1) == h200_us
    # The contest's SOL corresponds to one B200 bandwidth (~7.66 TB/s) for all three shapes.
    assert bytes_moved(*s.mkl) / s.b200_sol_us / 1e6 == pytest.approx(7.66, abs=0.01)


@pytest.mark.parametrize("shape", [(129, 320, 2), (1, 64, 3)])
def test_bytes_moved_counts_the_tensors_read(shape):
    m, k, l = shape
    a, b, sfa, sfb, _, _, c = generate_input(m, k, l, seed=0)
    per_batch_b_row = (b.shape[1] + sfb.shape[1]) * b.element_size()
    expected = a.untyped_storage().nbytes() + sfa.untyped_storage().nbytes() + l * per_batch_b_row
    expected += c.untyped_storage().nbytes()
    assert bytes_moved(m, k, l) == expected
    with pytest.raises(ValueError):
        floor_us(m, k, l, 0.0)


# ---- generators ----


@pytest.mark.parametrize("kind", GENERATORS)
@pytest.mark.parametrize("shape", SMALL_SHAPES + [(256, 7168, 1)])
def test_generator_dtypes_shapes_strides(kind, shape):
    m, k, l = shape
    rm, rk = math.ceil(m / 128), k // 64
    expected = [
        (FP4, (m, k // 2, l), (k // 2, 1, m * k // 2)),
        (FP4, (128, k // 2, l), (k // 2, 1, 128 * k // 2)),
        (FP8, (m, k // 16, l), (k // 16, 1, m * k // 16)),
        (FP8, (128, k // 16, l), (k // 16, 1, 128 * k // 16)),
        (FP8, (32, 4, rm, 4, rk, l), (16, 4, 512 * rk, 1, 512, 512 * rm * rk)),
        (FP8, (32, 4, 1, 4, rk, l), (16, 4, 512 * rk, 1, 512, 512 * rk)),
        (torch.float16, (m, 1, l), (1, 1, m)),
    ]
    data = GENERATORS[kind](m, k, l, seed=3)
    assert len(data) == 7
    for t, (dtype, shp, stride) in zip(data, expected):
        assert (t.dtype, tuple(t.shape), t.stride()) == (dtype, shp, stride)
        assert t.storage_offset() == 0
        assert t.untyped_storage().nbytes() == math.prod(shp) * t.element_size()  # one dense buffer
    assert not data[6].any()


@pytest.mark.parametrize("kind", GENERATORS)
@pytest.mark.parametrize("shape", [(129, 320, 2), (1, 64, 1), (300, 128, 1)])
def test_permuted_scales_follow_contract_offsets(kind, shape):
    m, k, l = shape
    data = GENERATORS[kind](m, k, l, seed=5)
    for plain, perm, rows in ((data[2], data[4], m), (data[3], data[5], 128)):
        kc, rm, rk = k // 16, math.ceil(rows / 128), k // 64
        p = raw(plain).reshape(l, rows, kc)
        buf = raw(perm)
        i, j, b = np.meshgrid(np.arange(rows), np.arange(kc), np.arange(l), indexing="ij")
        off = b * rm * rk * 512 + (i // 128) * rk * 512 + (j // 4) * 512 + (i % 32) * 16 + ((i % 128) // 32) * 4 + j % 4
        np.testing.assert_array_equal(buf[off], p[b, i, j])
        pad = np.ones(buf.size, dtype=bool)
        pad[off.ravel()] = False
        assert not buf[pad].any()  # padding rows are zero
        assert pad.sum() == l * (rm * 128 - rows) * kc


@pytest.mark.parametrize("kind", GENERATORS)
def test_generators_are_deterministic_per_seed(kind):
    gen = GENERATORS[kind]
    d1, d2, d3 = gen(129, 320, 2, seed=11), gen(129, 320, 2, seed=11), gen(129, 320, 2, seed=12)
    assert all(np.array_equal(raw(x), raw(y)) for x, y in zip(d1, d2))
    for i in range(4):
        assert not np.array_equal(raw(d1[i]), raw(d3[i]))


def test_contest_value_sets():
    a, b, sfa, sfb, _, _, _ = generate_input(256, 1024, 2, seed=0)
    for t in (a, b):
        assert set(np.unique(raw(t)).tolist()) == {0, 1, 2, 3}
    for t in (sfa, sfb):
        assert set(np.unique(decode_e4m3(t).numpy()).tolist()) == {0.0, 1.0, 2.0}


def test_full_range_coverage():
    a, b, sfa, sfb, _, _, _ = generate_full_range(128, 4096, 1, seed=0)
    assert np.unique(raw(a)).size == 256
    assert np.unique(raw(b)).size == 256
    sfa_bytes = set(np.unique(raw(sfa)).tolist())
    assert sfa_bytes == set(range(0x7F))  # every finite non-negative e4m3: 0, subnormals 1..7, up to 448
    assert {1, 2, 3, 4, 5, 6, 7, 0x7E} <= sfa_bytes
    assert set(np.unique(raw(sfb)).tolist()) == set(range(0x20))
    assert np.unique(np_fp4(np_codes(raw(a)))).size == 15  # +0 and -0 compare equal
    assert (np_codes(raw(a)) == 8).any()  # -0 appears


def test_full_range_nonfinite_only_adds_nan_scales():
    clean = generate_full_range(64, 256, 2, seed=4)
    dirty = generate_full_range(64, 256, 2, seed=4, nonfinite=True)
    for i in (0, 1, 3, 6):
        assert np.array_equal(raw(clean[i]), raw(dirty[i]))
    s0, s1 = raw(clean[2]), raw(dirty[2])
    changed = np.flatnonzero(s0 != s1)
    assert 1 <= changed.size <= 3
    assert set(s1[changed].tolist()) <= {0x7F, 0xFF}
    assert np.isin(s1, [0x7F, 0xFF]).sum() == changed.size and not np.isin(s0, [0x7F, 0xFF]).any()
    c = ref_kernel(dirty)
    nan_rows = {(p % (64 * 16)) // 16 + 64 * (p // (64 * 16)) for p in changed}  # (l*M + m) of each NaN scale
    got = {li * 64 + mi for mi, li in zip(*np.nonzero(c[:, 0, :].isnan().numpy()))}
    assert got == nan_rows
    ok, msg = check(c, as_c(independent_gemv(dirty)))
    assert ok, msg


def test_generators_refuse_invalid_problems():
    for gen in GENERATORS.values():
        with pytest.raises(ValueError, match="K"):
            gen(128, 96, 1, seed=0)
        with pytest.raises(ValueError, match="M"):
            gen(0, 64, 1, seed=0)


# ---- reference GEMV against the independent float64 GEMV ----


@pytest.mark.parametrize("shape", TEST_SHAPES + ODD_SHAPES)
def test_reference_matches_float64_contest_data_bit_exact(shape):
    data = generate_input(*shape, seed=sum(shape))
    out = ref_kernel(data)
    assert out is data[6]
    exact = independent_gemv(data)  # on contest data every fp32 partial sum is exact
    assert np.isfinite(exact).all()
    assert torch.equal(out, as_c(exact))


@pytest.mark.parametrize("shape", TEST_SHAPES + ODD_SHAPES)
def test_reference_matches_float64_full_range(shape):
    data = generate_full_range(*shape, seed=sum(shape) + 1)
    out = ref_kernel(data)
    exact = independent_gemv(data)
    assert np.abs(exact).max() < 65504  # the generator keeps c inside fp16
    assert np.median(np.abs(exact)) > 1.0  # and away from a trivially small result
    ok, msg = check(out, as_c(exact))
    assert ok, msg


def test_reference_ignores_b_rows_other_than_zero():
    data = generate_full_range(64, 256, 2, seed=8)
    want = ref_kernel(data).clone()
    b_raw = data[1].view(torch.uint8)
    b_raw[1:] = 0xFF  # -6.0 everywhere outside row 0
    data[3].view(torch.uint8)[1:] = 0x7F  # NaN scales outside row 0
    assert torch.equal(ref_kernel(data), want)


# ---- decoders ----


def test_fp4_lut_matches_formula():
    lut = np.array(FP4_E2M1_LUT)
    np.testing.assert_array_equal(lut, np_fp4(np.arange(16)))
    assert np.array_equal(np.signbit(lut), np.arange(16) >= 8)


def test_dequant_fp4_all_bytes_low_nibble_first():
    bytes_ = torch.arange(256, dtype=torch.uint8).view(16, 16)
    got = dequant_fp4(bytes_)
    assert got.dtype == torch.float32 and tuple(got.shape) == (16, 32)
    n = np.arange(256)
    want = np.stack((np_fp4(n & 0xF), np_fp4(n >> 4)), axis=-1).reshape(16, 32)
    np.testing.assert_array_equal(got.numpy(), want)
    assert np.array_equal(np.signbit(got.numpy()), np.signbit(want))  # -0 keeps its sign
    assert torch.equal(dequant_fp4(bytes_.view(FP4)), got)


def test_decode_e4m3_all_bytes():
    bytes_ = torch.arange(256, dtype=torch.uint8)
    want = np_e4m3(np.arange(256))
    for t in (bytes_, bytes_.view(FP8)):
        got = decode_e4m3(t).numpy()
        np.testing.assert_array_equal(got, want)  # NaNs compare equal here
        assert set(np.flatnonzero(np.isnan(got)).tolist()) == {0x7F, 0xFF}
    assert want[0x01] == 2.0**-9 and want[0x7E] == 448.0 and want[0x38] == 1.0 and want[0xB8] == -1.0


# ---- one-hot probes ----


@pytest.mark.parametrize(
    "shape,col", [((128, 256, 1), 0), ((128, 256, 1), 1), ((129, 320, 2), 255), ((1, 64, 1), 63), ((127, 192, 3), 100)]
)
def test_probe_output_is_one_column_of_a(shape, col):
    m, k, l = shape
    data = one_hot_probe(m, k, l, col, seed=col)
    want = np_fp4((raw(data[0]).reshape(l, m, k // 2)[:, :, col // 2] >> (4 * (col % 2))) & 0xF).T  # (M, L)
    b0 = raw(data[1]).reshape(l, 128, k // 2)[:, 0]
    assert (np.count_nonzero(b0, axis=1) == 1).all()
    expected = probe_expected(data, col)
    assert expected.stride() == data[6].stride()
    assert torch.equal(expected, as_c(want))
    out = ref_kernel(data)
    assert torch.equal(out, expected)
    assert out.view(torch.int16).equal(expected.view(torch.int16))  # bit for bit: zeros come out +0 in both


@pytest.mark.parametrize("col,value", [(6, -1.0), (7, 0.5)])
def test_probe_fixes_nibble_order_and_sign(col, value):
    data = one_hot_probe(4, 64, 1, col, seed=0)
    data[0].view(torch.uint8).fill_(0x1A)  # low nibble 0xA = -1.0, high nibble 0x1 = +0.5
    out = ref_kernel(data)
    assert (out == value).all()
    assert torch.equal(probe_expected(data, col), out)


def test_probe_decodes_every_e4m3_scale_byte():
    col = 37
    data = one_hot_probe(256, 64, 1, col, seed=1)
    a_raw = data[0].view(torch.uint8)
    a_raw[:, col // 2, 0] = (a_raw[:, col // 2, 0] & 0x0F) | (0x2 << 4)  # A[:, col] = 1.0 (high nibble)
    data[2].view(torch.uint8)[:, col // 16, 0] = torch.arange(256, dtype=torch.uint8)  # row i's scale byte is i
    out = ref_kernel(data)[:, 0, 0].double().numpy()
    want = np_e4m3(np.arange(256))  # every e4m3 value is exact in fp16
    np.testing.assert_array_equal(out, want)
    assert torch.equal(probe_expected(data, col)[:, 0, 0].isnan(), torch.from_numpy(np.isnan(want)))


def test_probe_rejects_column_out_of_range():
    with pytest.raises(ValueError, match="col"):
        one_hot_probe(128, 256, 1, 256, seed=0)


# ---- the contest check ----


def test_check_boundary_atol():
    ref = torch.zeros(3, dtype=torch.float64)
    assert check(ref + 1e-3, ref)[0]
    assert not check(ref + np.nextafter(1e-3, 1.0), ref)[0]
    assert check(ref - 1e-3, ref)[0]


def test_check_boundary_rtol():
    ref = torch.full((2,), 1024.0, dtype=torch.float64)
    assert check(ref + 1.0, ref, rtol=2.0**-10, atol=0.0)[0]
    assert not check(ref + 1.0 + 2.0**-30, ref, rtol=2.0**-10, atol=0.0)[0]


def test_check_fp16_one_ulp_passes_two_fail():
    ref = torch.tensor([2048.0, 1.0, -3.0], dtype=torch.float16)  # fp16 spacing 2, 2**-10, 2**-9
    one = torch.tensor([2050.0, 1.0 + 2.0**-10, -3.0 - 2.0**-9], dtype=torch.float16)
    two = torch.tensor([2052.0, 1.0, -3.0], dtype=torch.float16)
    assert check(one, ref)[0]
    ok, msg = check(two, ref)
    assert not ok and msg.startswith("1 of 3") and "(0,)" in msg and "2052" in msg


@pytest.mark.parametrize(
    "out,ref,ok",
    [
        (float("nan"), float("nan"), True),
        (float("nan"), 0.0, False),
        (0.0, float("nan"), False),
        (float("inf"), float("inf"), True),
        (float("-inf"), float("-inf"), True),
        (float("inf"), float("-inf"), False),
        (float("inf"), 65504.0, False),
        (65504.0, float("inf"), False),
        (float("nan"), float("inf"), False),
    ],
)
def test_check_nonfinite_status(out, ref, ok):
    o = torch.tensor([1.0, out], dtype=torch.float16)
    r = torch.tensor([1.0, ref], dtype=torch.float16)
    got, msg = check(o, r)
    assert got == ok
    if not ok:
        assert msg.startswith("1 of 2") and "(1,)" in msg and "NaN/Inf" in msg


def test_check_reports_count_and_worst_element():
    ref = torch.zeros((4, 1, 2), dtype=torch.float16)
    out = ref.clone()
    out[1, 0, 0] = 0.5
    out[3, 0, 1] = 2.0
    out[0, 0, 1] = 0.1
    ok, msg = check(out, ref)
    assert not ok and msg.startswith("3 of 8") and "(3, 0, 1)" in msg
    assert check(out[:, :, :1], ref)[0] is False  # shape mismatch


# ---- the fp32-order bound ----


@pytest.mark.parametrize("m,k,l", SMALL_SHAPES + [(256, 7168, 1)])
def test_fp32_bound_accepts_the_reference_and_rejects_one_wrong_block(m, k, l):
    data = generate_full_range(m, k, l, seed=m + k)
    ref = ref_kernel(data).clone()
    ok, msg = check_fp32_bound(ref, data)
    assert ok, msg
    exact, mag = exact_gemv(data)
    # Drop one block term from one row: a layout or decode bug the size of a single block.
    a, b, sfa, sfb, *_ = data
    terms = (dequant_fp4(a[:, :, 0]).double().view(m, k // 16, 16) * decode_e4m3(sfa[:, :, 0]).double().unsqueeze(-1)
             * (dequant_fp4(b[0, :, 0]).double().view(k // 16, 16) * decode_e4m3(sfb[0, :, 0]).double().unsqueeze(-1)))
    block = terms.sum(dim=2)
    finite = exact[:, 0].abs() < 1e4
    row = int(torch.nonzero(finite & (block.abs().max(dim=1).values > 1e-2))[0])
    j = int(block[row].abs().argmax())
    wrong = ref.clone()
    wrong[row, 0, 0] = (exact[row, 0] - block[row, j]).to(torch.float16)
    ok, msg = check_fp32_bound(wrong, data)
    assert not ok and "outside the fp32 bound" in msg


def test_fp32_bound_requires_matching_nan_and_overflow():
    data = generate_full_range(128, 256, 1, seed=5, nonfinite=True)
    ref = ref_kernel(data).clone()
    ok, msg = check_fp32_bound(ref, data)
    assert ok, msg
    exact, _ = exact_gemv(data)
    nan_row = int(torch.nonzero(exact[:, 0].isnan())[0])
    finite_row = int(torch.nonzero(exact[:, 0].abs() < 100)[0])
    wrong = ref.clone()
    wrong[nan_row, 0, 0] = 0.0
    assert not check_fp32_bound(wrong, data)[0]
    wrong = ref.clone()
    wrong[finite_row, 0, 0] = float("inf")
    assert not check_fp32_bound(wrong, data)[0]


def test_float64_decoders_against_hand_written_values():
    """The bit formulas of the float64 GEMV, pinned: the e2m1 table, and e4m3 at its edges."""
    mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    np.testing.assert_array_equal(fp4_f64(np.arange(16)), mags + [-v for v in mags])
    assert math.copysign(1.0, fp4_f64(np.array([8]))[0]) == -1.0  # code 8 is -0
    e = e4m3_f64(np.array([0x00, 0x01, 0x07, 0x08, 0x38, 0x7E, 0xFE, 0xB8, 0x7F, 0xFF]))
    np.testing.assert_array_equal(e[:8], [0.0, 2.0**-9, 7 * 2.0**-9, 2.0**-6, 1.0, 448.0, -448.0, -1.0])
    assert np.isnan(e[8:]).all()
