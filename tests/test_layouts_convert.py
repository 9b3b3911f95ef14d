"""The closed-form offsets of ``layouts.closed_form`` and the torch converters of ``layouts.convert``: exact values,
bijections, round trips, zero padding, and agreement between the two independent plain -> permuted paths.
Pure torch/numpy; no CuTe compile.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layouts import closed_form as cf
from nvfp4_gemv.shapes import TEST_SHAPES
from layouts import convert

CONTEST_SHAPES = list(TEST_SHAPES)
# (M, K, L); K = 16 and 80 leave the last 4-column group part empty.
ODD_SHAPES = [(1, 64, 1), (127, 192, 2), (129, 320, 1), (1000, 64, 3), (3, 16, 2), (300, 80, 2), (1, 16, 1)]
SHAPES = CONTEST_SHAPES + ODD_SHAPES


def _plain_scales(m, k, l, seed, dtype=torch.float8_e4m3fn):
    """Random nonzero scale bytes (every value 1..255, NaN codes included), with the contest's sfa strides."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randint(1, 256, (l, m, k // 16), generator=g, dtype=torch.uint8).permute(1, 2, 0)
    return u.view(dtype)


def _bytes(t):
    return t.view(torch.uint8)


def _memory(t):
    """The bytes of a tensor's storage in memory order."""
    u = _bytes(t)
    return torch.as_strided(u, (u.untyped_storage().nbytes(),), (1,), 0).numpy()


# ---- closed forms ----


def test_permuted_offset_exact_values():
    # m=256, k=512: rest_m=2, rest_k=8. (i=161, j=9, l=1): 1*2*8*512 + 1*8*512 + 2*512 + 1*16 + 1*4 + 1
    assert cf.permuted_offset(161, 9, 1, 256, 512) == 13333
    assert cf.permuted_offset(0, 0, 0, 256, 512) == 0
    assert cf.permuted_offset(255, 31, 1, 256, 512) == 2 * 2 * 8 * 512 - 1
    # rows 0, 32, 64, 96 of one atom are 4 bytes apart; rows 0 and 1 are 16 apart; columns 1 apart.
    assert [cf.atom_offset(r, 0) for r in (0, 32, 64, 96, 1)] == [0, 4, 8, 12, 16]
    assert [cf.atom_offset(0, e) for e in (0, 15, 16, 63)] == [0, 0, 1, 3]
    assert cf.plain_offset(2, 3, 1, 5, 64) == (1 * 5 + 2) * 4 + 3
    assert cf.fp4_nibble_offset(1, 5, 0, 2, 64) == 64 + 5
    assert cf.fp4_byte_offset(1, 5, 1, 2, 64) == (2 + 1) * 32 + 5
    assert cf.rest_mk(129, 64) == (2, 1) and cf.rest_mk(128, 65) == (1, 2)


@given(m=st.integers(1, 600), kb=st.integers(1, 12), l=st.integers(1, 3))
@settings(max_examples=60, deadline=None)
def test_permuted_offset_is_a_bijection_with_contiguous_row_blocks(m, kb, l):
    k = 64 * kb
    rest_m, rest_k = cf.rest_mk(m, k)
    i, j, b = np.meshgrid(np.arange(128 * rest_m), np.arange(4 * rest_k), np.arange(l), indexing="ij")
    off = cf.permuted_offset(i, j, b, m, k)
    assert np.array_equal(np.sort(off.ravel()), np.arange(l * rest_m * rest_k * 512))
    run = 512 * rest_k
    block_start = (b * rest_m + i // 128) * run
    np.testing.assert_array_equal(off - block_start, cf.slab_offset(i % 128, j, k))
    assert ((off - block_start >= 0) & (off - block_start < run)).all()
    first_atom = (i < 128) & (j < 4) & (b == 0)
    np.testing.assert_array_equal(off[first_atom], cf.atom_offset(i[first_atom], 16 * j[first_atom]))
    np.testing.assert_array_equal(
        cf.permuted_mkl_offset(i, 16 * j + 7, b, m, k), off
    )  # every K element of a scale maps to its byte


@given(m=st.integers(1, 400), kb=st.integers(1, 8), l=st.integers(1, 3))
@settings(max_examples=40, deadline=None)
def test_plain_and_fp4_offsets_are_bijections(m, kb, l):
    k = 64 * kb
    i, j, b = np.meshgrid(np.arange(m), np.arange(k // 16), np.arange(l), indexing="ij")
    assert np.array_equal(np.sort(cf.plain_offset(i, j, b, m, k).ravel()), np.arange(m * k // 16 * l))
    r, e, b = np.meshgrid(np.arange(m), np.arange(k), np.arange(l), indexing="ij")
    nib = cf.fp4_nibble_offset(r, e, b, m, k)
    assert np.array_equal(np.sort(nib.ravel()), np.arange(m * k * l))
    np.testing.assert_array_equal(nib // 2, cf.fp4_byte_offset(r, e // 2, b, m, k))
    np.testing.assert_array_equal(nib % 2, e % 2)  # even K element in the low nibble


def test_permuted_index_array_shape_and_values():
    idx = cf.permuted_index_array(200, 320, 2)
    assert idx.shape == (200, 20, 2) and idx.dtype == np.int64
    assert idx[161, 9, 1] == cf.permuted_offset(161, 9, 1, 200, 320)
    assert len(np.unique(idx)) == idx.size


# ---- converters ----


@pytest.mark.parametrize("m,k,l", SHAPES)
def test_plain_to_permuted_matches_contest_permute_and_closed_form(m, k, l):
    sf = _plain_scales(m, k, l, seed=m * 7 + k + l)
    kc = k // 16
    shape, stride = convert.permuted_shape_stride(m, kc, l)
    ours = convert.plain_to_permuted(sf)
    ref = convert.contest_permute(sf)
    for t in (ours, ref):
        assert t.dtype == sf.dtype and tuple(t.shape) == shape and t.stride() == stride
        assert t.untyped_storage().nbytes() == int(np.prod(shape))
    rest_m, rest_k = cf.rest_mk(m, k)
    assert stride == (16, 4, 512 * rest_k, 1, 512, 512 * rest_m * rest_k)
    mem, mem_ref = _memory(ours), _memory(ref)
    np.testing.assert_array_equal(mem, mem_ref)
    idx = cf.permuted_index_array(m, k, l)
    np.testing.assert_array_equal(mem[idx], _bytes(sf).numpy())
    # Padding rows and columns are zero: the only nonzero bytes are the (nonzero) scales themselves.
    padding = np.ones(mem.size, dtype=bool)
    padding[idx.ravel()] = False
    assert not mem[padding].any()
    assert padding.sum() == mem.size - m * kc * l


@pytest.mark.parametrize("m,k,l", SHAPES)
def test_round_trip_and_to_blocked(m, k, l):
    sf = _plain_scales(m, k, l, seed=m + 3 * k + l)
    kc = k // 16
    permuted = convert.plain_to_permuted(sf)
    back = convert.permuted_to_plain(permuted, m, k)
    assert back.dtype == sf.dtype and back.shape == sf.shape and back.stride() == (kc, 1, m * kc)
    assert torch.equal(_bytes(back), _bytes(sf))
    mem = _memory(permuted)
    per_batch = mem.size // l
    for b in range(l):
        blocked = convert.to_blocked(sf[:, :, b])
        assert blocked.dtype == sf.dtype and blocked.dim() == 1
        np.testing.assert_array_equal(_bytes(blocked).numpy(), mem[b * per_batch : (b + 1) * per_batch])


def test_permuted_to_plain_ignores_padding_and_accepts_any_strides():
    m, k, l = 130, 80, 2
    sf = _plain_scales(m, k, l, seed=1)
    permuted = convert.contest_permute(sf)
    _bytes(permuted)[:, :, 1, :, :, :] |= 0x80  # second row block: scales and padding alike
    _bytes(permuted)[:, :, :, :, -1, :] |= 0x40  # last column group, whose columns 1..3 are padding
    expected = _bytes(sf).clone()
    expected[128:] |= 0x80
    expected[:, 4:] |= 0x40
    assert torch.equal(_bytes(convert.permuted_to_plain(permuted, m, k)), expected)
    contiguous = permuted.contiguous()  # same values, other strides
    assert torch.equal(_bytes(convert.permuted_to_plain(contiguous, m, k)), expected)


@given(m=st.integers(1, 600), kc=st.integers(1, 40), l=st.integers(1, 3), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=50, deadline=None)
def test_converters_random_shapes(m, kc, l, seed):
    sf = _plain_scales(m, 16 * kc, l, seed, dtype=torch.uint8)
    permuted = convert.plain_to_permuted(sf)
    assert permuted.dtype == torch.uint8
    np.testing.assert_array_equal(_memory(permuted), _memory(convert.contest_permute(sf)))
    mem = _memory(permuted)
    idx = cf.permuted_index_array(m, 16 * kc, l)
    np.testing.assert_array_equal(mem[idx], sf.numpy())
    assert np.count_nonzero(mem) == m * kc * l  # scales are nonzero, padding is zero
    assert torch.equal(convert.permuted_to_plain(permuted, m, 16 * kc), sf)
    n = mem.size // l
    np.testing.assert_array_equal(convert.to_blocked(sf[:, :, l - 1]).numpy(), mem[(l - 1) * n :])


def test_non_contiguous_plain_input():
    sf = _plain_scales(200, 320, 3, seed=5)
    torch_contiguous = _bytes(sf).contiguous().view(sf.dtype)  # strides (kc*l, l, 1)
    assert torch_contiguous.stride() != sf.stride()
    assert torch.equal(_bytes(convert.plain_to_permuted(torch_contiguous)), _bytes(convert.plain_to_permuted(sf)))
    assert torch.equal(_bytes(convert.to_blocked(sf[:, :, 1])), _bytes(convert.to_blocked(sf[:, :, 1].contiguous())))


def test_invalid_inputs_raise():
    sf = _plain_scales(128, 64, 1, seed=0)
    with pytest.raises(TypeError):
        convert.plain_to_permuted(sf.view(torch.uint8).to(torch.int16))
    with pytest.raises(ValueError):
        convert.plain_to_permuted(sf[:, :, 0])
    with pytest.raises(ValueError):
        convert.to_blocked(sf)
    with pytest.raises(ValueError):
        convert.contest_permute(sf[:0])
    permuted = convert.plain_to_permuted(sf)
    with pytest.raises(ValueError):
        convert.permuted_to_plain(permuted, 129, 64)  # needs rest_m = 2
    with pytest.raises(ValueError):
        convert.permuted_to_plain(permuted, 128, 320)  # needs rest_k = 2
    with pytest.raises(ValueError):
        convert.permuted_to_plain(permuted, 128, 40)  # not a multiple of 16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_converters_on_gpu_match_cpu():
    sf = _plain_scales(300, 320, 2, seed=9)
    gpu = sf.cuda()
    for fn in (convert.plain_to_permuted, convert.contest_permute):
        out = fn(gpu)
        assert out.is_cuda and out.stride() == fn(sf).stride()
        assert torch.equal(_bytes(out).cpu(), _bytes(fn(sf)))
    assert torch.equal(_bytes(convert.permuted_to_plain(convert.plain_to_permuted(gpu), 300, 320)).cpu(), _bytes(sf))
    assert torch.equal(_bytes(convert.to_blocked(gpu[:, :, 1])).cpu(), _bytes(convert.to_blocked(sf[:, :, 1])))
