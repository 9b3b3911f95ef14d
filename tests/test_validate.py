"""Tests of nvfp4_gemv.validate: valid contest tuples pass; each malformed input raises ValueError naming its tensor."""

import pytest
import torch

from submission.reference import generate_full_range, generate_input
from nvfp4_gemv.shapes import ODD_SHAPES, TEST_SHAPES
from nvfp4_gemv.validate import NAMES, validate_inputs, validate_problem

M, K, L = 129, 320, 2  # ragged M, K a multiple of 64 only, L > 1: every dimension has extent > 1


@pytest.fixture
def data():
    return list(generate_input(M, K, L, seed=0))


def with_tensor(data, name, t):
    d = list(data)
    d[NAMES.index(name)] = t
    return tuple(d)


def raises_naming(name, data, match, **kw):
    with pytest.raises(ValueError, match=match) as e:
        validate_inputs(data, **kw)
    assert str(e.value).startswith(f"{name}: "), str(e.value)
    return str(e.value)


def relocated(t, offset_elems):
    """A copy of t with the same shape and strides whose storage starts `offset_elems` elements into a buffer."""
    if t.element_size() == 1 and t.dtype != torch.uint8:  # fp4x2 and fp8 tensors are copied as bytes
        return relocated(t.view(torch.uint8), offset_elems).view(t.dtype)
    buf = torch.zeros(t.untyped_storage().nbytes() // t.element_size() + offset_elems, dtype=t.dtype)
    out = buf.as_strided(t.shape, t.stride(), offset_elems)
    out.copy_(t)
    return out


@pytest.mark.parametrize("shape", [TEST_SHAPES[0], TEST_SHAPES[4], ODD_SHAPES[0], ODD_SHAPES[1]])
def test_valid_inputs_return_mkl(shape):
    assert validate_inputs(generate_input(*shape, seed=1)) == shape
    assert validate_inputs(list(generate_full_range(*shape, seed=1))) == shape


def test_extent_one_strides_are_not_checked():
    d = generate_input(128, 256, 1, seed=0)
    c_contiguous = torch.zeros(128, 1, 1, dtype=torch.float16)  # strides (1, 1, 1), same memory as (1, 1, 128)
    assert validate_inputs(with_tensor(d, "c", c_contiguous)) == (128, 256, 1)


def test_relocated_aligned_copy_passes(data):
    d = with_tensor(data, "sfa", relocated(data[2], 16))
    assert validate_inputs(d) == (M, K, L)


WRONG_DTYPE = {
    "a": torch.uint8,
    "b": torch.int8,
    "sfa": torch.uint8,
    "sfb": torch.float8_e5m2,
    "sfa_permuted": torch.int8,
    "sfb_permuted": torch.uint8,
    "c": torch.bfloat16,
}


@pytest.mark.parametrize("name", NAMES)
def test_wrong_dtype(data, name):
    t = data[NAMES.index(name)]
    bad = t.view(WRONG_DTYPE[name])
    msg = raises_naming(name, with_tensor(data, name, bad), "expected dtype")
    assert str(t.dtype) in msg and str(WRONG_DTYPE[name]) in msg


def test_sfa_dtype_message_is_exact(data):
    raises_naming(
        "sfa",
        with_tensor(data, "sfa", data[2].view(torch.uint8)),
        r"^sfa: expected dtype torch\.float8_e4m3fn, got torch\.uint8$",
    )


def test_wrong_rank_of_a(data):
    raises_naming("a", with_tensor(data, "a", data[0][:, :, 0]), r"expected 3 dimensions \(M, K/2, L\)")


@pytest.mark.parametrize("name", NAMES[1:])  # a defines M, K, L; a wrong a shows up as disagreement below
def test_wrong_shape(data, name):
    t = data[NAMES.index(name)]
    bad = t.narrow(0, 0, t.shape[0] - 1)  # one row (or lane) short in dimension 0
    msg = raises_naming(name, with_tensor(data, name, bad), "expected shape")
    assert str(tuple(bad.shape)) in msg


@pytest.mark.parametrize("name", NAMES)
def test_wrong_stride(data, name):
    t = data[NAMES.index(name)]
    bad = t.view(torch.uint8).contiguous().view(t.dtype) if t.element_size() == 1 else t.contiguous()
    assert bad.shape == t.shape and bad.stride() != t.stride()
    msg = raises_naming(name, with_tensor(data, name, bad), "expected strides")
    assert str(t.stride()) in msg and str(bad.stride()) in msg


@pytest.mark.parametrize("name", NAMES)
def test_wrong_device(data, name):
    t = data[NAMES.index(name)]
    meta = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    if name == "a":  # a sets the device: every other tensor is then the odd one out
        raises_naming("b", with_tensor(data, name, meta), "expected device meta")
    else:
        raises_naming(name, with_tensor(data, name, meta), "expected device cpu")


def test_require_cuda(data):
    assert validate_inputs(data, require_cuda=False) == (M, K, L)
    raises_naming("a", data, "CUDA", require_cuda=True)


@pytest.mark.parametrize("offset_bytes", [2, 8])
@pytest.mark.parametrize("name", NAMES)
def test_misaligned_pointer(data, name, offset_bytes):
    t = data[NAMES.index(name)]
    bad = relocated(t, offset_bytes // t.element_size())  # 2 or 8 bytes past a 64-byte aligned allocation
    assert bad.data_ptr() % 16 and bad.stride() == t.stride()
    if t.element_size() == 1:
        assert torch.equal(bad.view(torch.uint8), t.view(torch.uint8))
    raises_naming(name, with_tensor(data, name, bad), "16-byte aligned")


@pytest.mark.parametrize("k_bad", [96, 32, 200])
def test_k_not_multiple_of_64(data, k_bad):
    a_bad = torch.zeros(L, M, k_bad // 2, dtype=torch.uint8).permute(1, 2, 0).view(torch.float4_e2m1fn_x2)
    msg = raises_naming("a", with_tensor(data, "a", a_bad), "multiple of 64")
    assert f"K = {k_bad}" in msg


@pytest.mark.parametrize(
    "name,other_shape",
    [
        ("b", (M, K + 64, L)),  # K disagrees
        ("sfa", (M + 1, K, L)),  # M disagrees
        ("sfb", (M, 2 * K, L)),
        ("sfa_permuted", (M + 128, K, L)),  # one more 128-row block
        ("sfb_permuted", (M, K, L + 1)),  # L disagrees
        ("c", (M, K, L + 1)),
    ],
)
def test_mkl_disagree_with_a(data, name, other_shape):
    other = generate_input(*other_shape, seed=2)
    raises_naming(name, with_tensor(data, name, other[NAMES.index(name)]), r"expected shape .* \(from a\)")


@pytest.mark.parametrize("dim,shape", [("M", (0, K // 2, L)), ("K", (M, 0, L)), ("L", (M, K // 2, 0))])
def test_empty_dimension(data, dim, shape):
    a_empty = torch.zeros(shape, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    raises_naming("a", with_tensor(data, "a", a_empty), f"{dim} must be >= 1")


def test_not_a_seven_tuple(data):
    raises_naming("data", tuple(data[:6]), "tuple of 7 tensors")
    raises_naming("data", data[0], "tuple of 7 tensors")
    raises_naming("sfb", with_tensor(data, "sfb", data[3].view(torch.uint8).numpy()), "torch.Tensor")


def test_validate_problem():
    assert validate_problem(1, 64, 1) == (1, 64, 1)
    assert validate_problem(7168, 16384, 1) == (7168, 16384, 1)
    for mkl, word in [((0, 64, 1), "M"), ((1, 0, 1), "K"), ((1, 64, 0), "L"), ((1, 96, 1), "K"), ((1, 64, -2), "L")]:
        with pytest.raises(ValueError, match=f"^{word} must"):
            validate_problem(*mkl)
    with pytest.raises(ValueError, match="integers"):
        validate_problem(1, 64.0, 1)
