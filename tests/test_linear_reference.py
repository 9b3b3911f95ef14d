"""The fp4 linear's formats, fp32 reference and quantizers against an independent float64 numpy decode.

`np_dequantize` is written per element from the format definitions (e2m1 sign/exponent/mantissa fields, e4m3 and
e8m0 bit fields, the swizzled byte offset formula), sharing no code with nvfp4_gemv.linear. The fp32 dequantize is
exact but for one rounding of the tensor-scale product, so the two agree bit for bit.
"""

import numpy as np
import pytest
import torch

from layouts.closed_form import permuted_offset
from nvfp4_gemv.linear import dequantize, linear_reference, quantize_mxfp4, quantize_nvfp4
from nvfp4_gemv.linear.quantize import e2m1_codes

RNG = np.random.default_rng(20261130)


# ---------------------------------------------------------------- the independent float64 decode


def e2m1_value(code: int) -> float:
    sign = -1.0 if code & 8 else 1.0
    exp, man = (code >> 1) & 3, code & 1
    return sign * (man * 0.5 if exp == 0 else (1 + man / 2) * 2.0 ** (exp - 1))


def e4m3_value(byte: int) -> float:
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 7
    if exp == 0xF and man == 7:
        return float("nan")
    return sign * (man / 8 * 2.0**-6 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7))


def e8m0_value(byte: int) -> float:
    return float("nan") if byte == 0xFF else 2.0 ** (byte - 127)


E2M1 = np.array([e2m1_value(c) for c in range(16)])
E4M3 = np.array([e4m3_value(b) for b in range(256)])
E8M0 = np.array([e8m0_value(b) for b in range(256)])


def swizzled_offset(n, kb, k):
    """Byte of scale (row n, block kb) in the swizzled buffer, as the format defines it."""
    rest_k = -(-k // 64)
    return ((n // 128) * rest_k + kb // 4) * 512 + (n % 32) * 16 + ((n // 32) % 4) * 4 + kb % 4


def np_dequantize(weight_u8, scale_u8, fmt, scale_layout="plain", global_scale=1.0):
    """float64 (N, K) from numpy uint8 weight (N, K/2) and scale bytes, element by element."""
    n_rows, k = weight_u8.shape[0], 2 * weight_u8.shape[1]
    n, e = np.meshgrid(np.arange(n_rows), np.arange(k), indexing="ij")
    byte = weight_u8[n, e // 2].astype(np.int64)
    code = np.where(e % 2 == 0, byte & 0xF, byte >> 4)
    block = 16 if fmt == "nvfp4" else 32
    if scale_layout == "swizzled":
        sbyte = scale_u8.reshape(-1)[swizzled_offset(n, e // 16, k)]
    else:
        sbyte = scale_u8[n, e // block]
    table = E4M3 if fmt == "nvfp4" else E8M0
    return E2M1[code] * table[sbyte] * float(global_scale)


def u8(t):
    return t.view(torch.uint8).numpy()


def random_weight(n, k):
    return torch.from_numpy(RNG.integers(0, 256, (n, k // 2), dtype=np.uint8))


def random_e4m3(shape, nan=False):
    b = RNG.integers(0, 256, shape, dtype=np.uint8)
    if not nan:
        b[(b & 0x7F) == 0x7F] = 0x38
    return torch.from_numpy(b).view(torch.float8_e4m3fn)


def swizzle(scale_plain):
    """Plain (N, K/16) scales into the swizzled buffer, by the format's offset formula (padding = 0)."""
    n, kc = scale_plain.shape
    k = 16 * kc
    buf = np.zeros((-(-n // 128) * 128) * kc, dtype=np.uint8)
    i, j = np.meshgrid(np.arange(n), np.arange(kc), indexing="ij")
    buf[swizzled_offset(i, j, k)] = u8(scale_plain)
    return torch.from_numpy(buf.reshape(-1, kc)).view(scale_plain.dtype)


def test_swizzled_formula_is_the_contests_permuted_layout():
    n, k = 300, 2880
    i, j = np.meshgrid(np.arange(n), np.arange(k // 16), indexing="ij")
    assert np.array_equal(swizzled_offset(i, j, k), permuted_offset(i, j, 0, n, k))


def test_e2m1_code_table():
    w = torch.from_numpy(np.arange(256, dtype=np.uint8).reshape(4, 64))  # every byte: every (low, high) pair
    s = torch.full((4, 8), 1.0).to(torch.float8_e4m3fn)
    got = dequantize(w, s, "nvfp4").numpy()
    assert got[0, 0:2].tolist() == [0.0, 0.0]
    assert got[1, 30:32].tolist() == [-6.0, 2.0]  # byte 0x4F (row 1, column 15): low nibble F = -6 at even k
    assert got[3, 116:118].tolist() == [-1.0, -6.0]  # byte 0xFA (row 3, column 58): low A = -1, high F = -6
    assert got[0, 14:16].tolist() == [6.0, 0.0]  # byte 0x07
    assert got[0, 6:8].tolist() == [1.5, 0.0]  # byte 0x03
    assert np.array_equal(got, np_dequantize(w.numpy(), u8(s), "nvfp4").astype(np.float32))
    assert sorted(set(E2M1.tolist())) == [-6, -4, -3, -2, -1.5, -1, -0.5, 0, 0.5, 1, 1.5, 2, 3, 4, 6]


# ---------------------------------------------------------------- dequantize, full range, against numpy

SHAPES = [(1, 64), (7, 128), (130, 192), (256, 64), (5, 2880)]


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("scale_layout", ["plain", "swizzled"])
def test_nvfp4_dequantize_full_range(n, k, scale_layout):
    """Every fp4 code, e4m3 scales over their whole range (subnormals, negatives, NaN) and a tensor scale."""
    w = random_weight(n, k)
    s = random_e4m3((n, k // 16), nan=True)
    s_arg = swizzle(s) if scale_layout == "swizzled" else s
    g = 0.37109375
    want = np_dequantize(w.numpy(), u8(s), "nvfp4", "plain", g).astype(np.float32)
    for gs in (g, torch.tensor(g), torch.tensor([g])):
        got = dequantize(w, s_arg, "nvfp4", scale_layout, gs)
        assert got.dtype == torch.float32 and got.shape == (n, k)
        np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(  # the swizzled buffer, read by the format's formula
        dequantize(w, s_arg, "nvfp4", scale_layout).numpy(),
        np_dequantize(w.numpy(), u8(s_arg), "nvfp4", scale_layout).astype(np.float32),
    )


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("scale_dtype", [torch.uint8, torch.float8_e8m0fnu])
def test_mxfp4_dequantize_full_range(n, k, scale_dtype):
    """e8m0 bytes 0..255: 2^-127 (an fp32 subnormal), up to 2^127 (6 · 2^127 overflows fp32 to inf), 0xFF NaN."""
    w = random_weight(n, k)
    s = torch.from_numpy(RNG.integers(0, 256, (n, k // 32), dtype=np.uint8))
    s.view(-1)[:4] = torch.tensor([0, 1, 254, 255], dtype=torch.uint8)[: s.numel()]
    with np.errstate(over="ignore"):
        want = np_dequantize(w.numpy(), s.numpy(), "mxfp4").astype(np.float32)
    got = dequantize(w.view(torch.float4_e2m1fn_x2), s.view(scale_dtype), "mxfp4")
    np.testing.assert_array_equal(got.numpy(), want)
    nb = k // 32
    if s.numel() > 3:  # the block of scale byte 0xFF is all NaN; the block of byte 0 is at most 6 · 2^-127
        assert torch.isnan(got[3 // nb, 32 * (3 % nb): 32 * (3 % nb) + 32]).all()
    assert got[0, :32].abs().max() <= 6 * 2.0**-127


def test_mxfp4_scale_extremes_exact():
    w = torch.full((1, 64), 0x77, dtype=torch.uint8)  # every code 6.0
    s = torch.tensor([[0, 1, 254, 255]], dtype=torch.uint8)
    got = dequantize(w, s, "mxfp4")
    assert got[0, 0].item() == 6 * 2.0**-127 and got[0, 0].item() > 0  # an fp32 subnormal, not flushed
    assert got[0, 32].item() == 6 * 2.0**-126
    assert got[0, 64].item() == float("inf")  # 6 · 2^127 is past fp32's range
    assert torch.isnan(got[0, 96:]).all()
    w2 = torch.full((1, 64), 0x22, dtype=torch.uint8)  # code 2 = 1.0
    assert dequantize(w2, s, "mxfp4")[0, 64].item() == 2.0**127


def test_nvfp4_subnormal_scales_exact():
    w = torch.full((1, 32), 0x11, dtype=torch.uint8)  # code 1 = 0.5
    s = torch.tensor([[0x01, 0x07, 0x08, 0x00]], dtype=torch.uint8).view(torch.float8_e4m3fn)
    got = dequantize(w, s, "nvfp4")[0, ::16].tolist()
    assert got == [0.5 * 2.0**-9, 0.5 * 7 * 2.0**-9, 0.5 * 2.0**-6, 0.0]


# ---------------------------------------------------------------- one-hot probes: nibble order, sign, scale index

PROBES = [(0, 0), (0, 1), (3, 17), (31, 62), (32, 63), (127, 64), (128, 65), (129, 190), (255, 191), (200, 100)]
TARGET = {"nvfp4": (0x4C, 6.0), "mxfp4": (130, 8.0)}  # the probed block's scale byte and value; others are 1.0
UNIT = {"nvfp4": 0x38, "mxfp4": 127}


@pytest.mark.parametrize("fmt,scale_layout", [("nvfp4", "plain"), ("nvfp4", "swizzled"), ("mxfp4", "plain")])
@pytest.mark.parametrize("n0,k0", PROBES)
@pytest.mark.parametrize("code", [0x5, 0xD])  # +3 and -3
def test_one_hot_probe(fmt, scale_layout, n0, k0, code):
    """One nonzero code at (n0, k0) under a unique block scale: y is exactly code · scale · global at n0 for the
    x row that hits k0, and zero everywhere else (the other nibble of the same byte included)."""
    n, k = 256, 192
    block = 16 if fmt == "nvfp4" else 32
    w = torch.zeros((n, k // 2), dtype=torch.uint8)
    w[n0, k0 // 2] = code << (4 * (k0 % 2))
    plain = torch.full((n, k // block), UNIT[fmt], dtype=torch.uint8)
    byte, value = TARGET[fmt]
    assert value == (e4m3_value(byte) if fmt == "nvfp4" else e8m0_value(byte))
    plain[n0, k0 // block] = byte
    g = 0.25 if fmt == "nvfp4" else None
    if fmt == "nvfp4":
        plain = plain.view(torch.float8_e4m3fn)
        scale = swizzle(plain) if scale_layout == "swizzled" else plain
        if scale_layout == "swizzled":  # fill the padding and every other byte with unit scales too
            scale = scale.view(torch.uint8).clone()
            scale[scale == 0] = UNIT[fmt]
            scale = scale.view(torch.float8_e4m3fn)
    else:
        scale = plain
    x = torch.zeros((3, k), dtype=torch.bfloat16)
    x[0, k0] = 1.0
    x[1, k0 ^ 1] = 1.0  # the other nibble of the byte
    x[2] = 1.0
    y = linear_reference(x, w, scale, fmt, g, None, scale_layout).float()
    expected = e2m1_value(code) * value * (g or 1.0)
    want = torch.zeros((3, n))
    want[0, n0] = want[2, n0] = expected
    assert torch.equal(y, want)


# ---------------------------------------------------------------- linear_reference against numpy


@pytest.mark.parametrize("fmt,scale_layout", [("nvfp4", "plain"), ("nvfp4", "swizzled"), ("mxfp4", "plain")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lead,n,k", [((1,), 7, 64), ((5,), 130, 192), ((2, 3), 33, 2880), ((16,), 256, 128)])
def test_linear_reference_against_numpy(fmt, scale_layout, dtype, lead, n, k):
    w = random_weight(n, k)
    if fmt == "nvfp4":
        plain = torch.from_numpy(RNG.integers(0x20, 0x48, (n, k // 16), dtype=np.uint8)).view(torch.float8_e4m3fn)
        scale, g = (swizzle(plain) if scale_layout == "swizzled" else plain), 0.75
    else:
        plain = scale = torch.from_numpy(RNG.integers(120, 131, (n, k // 32), dtype=np.uint8))
        g = None
    x = torch.randn(*lead, k).to(dtype)
    bias = torch.randn(n).to(dtype)
    y = linear_reference(x, w, scale, fmt, g, bias, scale_layout)
    assert y.dtype == dtype and y.shape == (*lead, n)
    wd = np_dequantize(w.numpy(), u8(plain), fmt, "plain", g or 1.0)
    x64 = x.double().reshape(-1, k).numpy()
    y64 = x64 @ wd.T + bias.double().numpy()
    bound = 1e-6 * (np.abs(x64) @ np.abs(wd).T) + 2.0 ** -(8 if dtype == torch.bfloat16 else 11) * np.abs(y64)
    assert (np.abs(y.double().reshape(-1, n).numpy() - y64) <= bound + 1e-30).all()


def test_linear_reference_rounds_once():
    """Bias is added in fp32 before the one rounding: 1 + 2^-9 + 2^-9 rounds to bf16 1 + 2^-7... not 1."""
    w = torch.zeros((1, 32), dtype=torch.uint8)
    w[0, 0] = 0x02  # code 2 = 1.0 at k = 0
    s = torch.full((1, 4), 1.0).to(torch.float8_e4m3fn)
    x = torch.zeros((1, 64), dtype=torch.bfloat16)
    x[0, 0] = 1.0
    bias = torch.tensor([2.0**-8 + 2.0**-9], dtype=torch.bfloat16)  # rounds up from a half-ulp tie only in fp32
    y = linear_reference(x, w, s, "nvfp4", None, bias)
    assert y.item() == 1.0 + 2.0**-7


def test_nan_block_scale_poisons_its_output_only():
    n, k = 8, 64
    w = random_weight(n, k)
    s = torch.full((n, 2), 127, dtype=torch.uint8)
    s[3, 1] = 0xFF
    y = linear_reference(torch.randn(4, k, dtype=torch.bfloat16), w, s, "mxfp4")
    assert torch.isnan(y[:, 3]).all() and not torch.isnan(y[:, [0, 1, 2, 4, 5, 6, 7]]).any()


@pytest.mark.parametrize("lead", [(0,), (2, 0), (0, 3)])
def test_empty_x(lead):
    w, s = random_weight(5, 64), random_e4m3((5, 4))
    y = linear_reference(torch.empty(*lead, 64, dtype=torch.float16), w, s, "nvfp4")
    assert y.shape == (*lead, 5) and y.dtype == torch.float16


# ---------------------------------------------------------------- quantizers


def _nearest_property(w, q, s, g, fmt):
    """Each dequantized value is a nearest grid value (code · block scale) of its weight: ties included."""
    block = 16 if fmt == "nvfp4" else 32
    deq = dequantize(q, s, fmt, "plain", g).double()
    step = (dequantize(torch.full_like(q, 0x22), s, fmt, "plain", g)).double()  # code 2 = 1.0: the block scale
    grid = torch.tensor(E2M1).view(1, 1, 16) * step.unsqueeze(-1)
    best = (w.double().unsqueeze(-1) - grid).abs().amin(-1)
    err = (w.double() - deq).abs()
    # dequantize rounds code · scale · global in fp32, the grid here is float64
    assert (err <= best + 2.0**-22 * (w.double().abs() + step)).all()
    return err, step, block


@pytest.mark.parametrize("n,k", [(1, 64), (130, 192), (64, 2880)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_quantize_nvfp4_round_trip(n, k, dtype):
    w = (torch.randn(n, k) * torch.logspace(-3, 2, k)).to(dtype)
    q, s, g = quantize_nvfp4(w)
    assert q.dtype == torch.uint8 and q.shape == (n, k // 2)
    assert s.dtype == torch.float8_e4m3fn and s.shape == (n, k // 16)
    assert g.dtype == torch.float32 and g.numel() == 1
    amax = w.float().abs().max()
    assert g.item() == (amax / 2688).item()
    blocks = w.float().abs().view(n, k // 16, 16).amax(-1)
    assert torch.equal(s, (blocks / (6 * g)).to(torch.float8_e4m3fn))
    err, step, _ = _nearest_property(w.float(), q, s, g, "nvfp4")
    normal = (s.float() >= 2.0**-6).repeat_interleave(16, dim=1)  # a subnormal e4m3 scale can be far off
    assert (err[normal] <= step[normal]).all()  # at most half the widest e2m1 gap (4 -> 6), in block-scale units
    rel = (dequantize(q, s, "nvfp4", "plain", g) - w.float()).norm() / w.float().norm()
    assert rel < 0.12
    q2, s2, g2 = quantize_nvfp4(w, "swizzled")
    assert torch.equal(q2, q) and torch.equal(dequantize(q2, s2, "nvfp4", "swizzled", g2),
                                              dequantize(q, s, "nvfp4", "plain", g))


@pytest.mark.parametrize("n,k", [(1, 64), (130, 192), (64, 2880)])
def test_quantize_mxfp4_round_trip(n, k):
    w = torch.randn(n, k) * torch.logspace(-30, 30, k)
    q, s, g = quantize_mxfp4(w)
    assert g is None and q.shape == (n, k // 2) and s.dtype == torch.uint8 and s.shape == (n, k // 32)
    amax = w.abs().view(n, k // 32, 32).amax(-1).double()
    assert torch.equal(s.long(), (torch.floor(torch.log2(amax)) - 2 + 127).long())
    err, step, _ = _nearest_property(w, q, s, None, "mxfp4")
    assert (err <= 2 * step).all()  # block_amax / scale < 8: saturating at 6 costs at most 2 steps


def test_quantize_exact_inputs_reproduce_bits():
    """Weights that are exactly code · e4m3 scale · global, with a 6 in every block and 6 · 448 · global the
    tensor's amax, quantize back to the same codes, scales and global scale."""
    n, k = 130, 256
    codes = torch.from_numpy(RNG.integers(0, 16, (n, k), dtype=np.uint8))
    codes.view(n, k // 16, 16)[:, :, 5] = 7  # a +6 in every block
    scale_bytes = torch.from_numpy(RNG.integers(0x01, 0x7F, (n, k // 16), dtype=np.uint8))
    scale_bytes[7, 3] = 0x7E  # 448: the tensor's amax is 6 · 448 · global
    scales = scale_bytes.view(torch.float8_e4m3fn)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    for g in (1.0, 2.0**-10):
        w = dequantize(packed, scales, "nvfp4", "plain", g)
        q, s, gq = quantize_nvfp4(w)
        assert gq.item() == g
        assert torch.equal(s.view(torch.uint8), scale_bytes)
        assert torch.equal(q, packed)


def test_quantize_mxfp4_exact_inputs_reproduce_bits():
    n, k = 9, 128
    codes = torch.from_numpy(RNG.integers(0, 16, (n, k), dtype=np.uint8))
    codes.view(n, k // 32, 32)[:, :, 0] = 0xE  # a -4 in every block: floor(log2 4) - 2 = 0, the scale exactly
    scale = torch.from_numpy(RNG.integers(0, 255, (n, k // 32), dtype=np.uint8))
    scale[0, 0], scale[0, 1], scale[0, 2] = 0, 1, 252
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    w = dequantize(packed, scale, "mxfp4")
    q, s, _ = quantize_mxfp4(w)
    assert torch.equal(s, scale) and torch.equal(q, packed)


def test_e2m1_rounding_ties_to_even_and_saturates():
    q = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.5, 1e30, -0.25, -0.0, -5.0, 0.2500001, 4.9999])
    assert e2m1_codes(q).tolist() == [0, 2, 2, 4, 4, 6, 6, 7, 7, 8, 8, 14, 1, 6]


def test_quantize_zero_and_bad_weights():
    q, s, g = quantize_nvfp4(torch.zeros(4, 64))
    assert g.item() == 1.0 and not q.any() and not s.view(torch.uint8).any()
    q, s, _ = quantize_mxfp4(torch.zeros(4, 64))
    assert not q.any() and not s.any()
    with pytest.raises(ValueError, match="weight: expected finite"):
        quantize_nvfp4(torch.tensor([[float("nan")] * 64]))
    with pytest.raises(ValueError, match=r"weight: expected shape \(N, K\)"):
        quantize_mxfp4(torch.zeros(4, 48))
    with pytest.raises(ValueError, match="weight: expected dtype"):
        quantize_mxfp4(torch.zeros(4, 64, dtype=torch.int32))
    with pytest.raises(ValueError, match="scale_layout"):
        quantize_nvfp4(torch.zeros(4, 64), "blocked")
