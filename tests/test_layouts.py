"""The CuTe layouts of ``layouts.sf_cute``, evaluated in host code on the CPU, against the closed forms, CUTLASS's
``tile_atom_to_shape_SF`` and the torch converters, element by element; and a stride-mutation test showing that
corrupting any one stride of any layout makes the agreement check fail.

Evaluation: one ``@cute.jit`` host function per layout, compiled once with dynamic (m, k, l), writes
layout(idx) for every 1-D index idx (colexicographic over the layout's modes) into an int32 numpy buffer.
Host code needs no GPU and no particular CUTE_DSL_ARCH.
"""

import functools
import subprocess
import sys

import cutlass
import cutlass.cute as cute
import numpy as np
import pytest
import torch
from cutlass.cute.runtime import make_ptr
from cutlass.utils.blockscaled_layout import tile_atom_to_shape_SF
from hypothesis import given, settings
from hypothesis import strategies as st

from layouts import closed_form as cf
from nvfp4_gemv.shapes import TEST_SHAPES
from layouts import convert, sf_cute

CONTEST_SHAPES = list(TEST_SHAPES)
ODD_SHAPES = [(1, 64, 1), (127, 192, 2), (129, 320, 1), (1000, 64, 3), (1000, 320, 2), (200, 192, 1)]
SHAPES = CONTEST_SHAPES + ODD_SHAPES
# Every mode of every layout has extent > 1 here, so a wrong stride moves some offset.
MUTATION_SHAPE = (300, 192, 2)


def _by_col(kind):
    return lambda m, k, l: sf_cute.sf_layout_by_col(kind, m, k, l)


# name -> (builder(m, k, l), natural extents(m, k, l) of the coordinate domain)
BUILDERS = {
    "atom": (lambda m, k, l: sf_cute.sf_atom(), lambda m, k, l: (128, 64)),
    "permuted_mkl": (
        sf_cute.sf_layout_permuted_mkl,
        lambda m, k, l: (128 * cf.rest_mk(m, k)[0], 64 * cf.rest_mk(m, k)[1], l),
    ),
    "cutlass_sf": (
        lambda m, k, l: tile_atom_to_shape_SF((m, k, l), 16),
        lambda m, k, l: (128 * cf.rest_mk(m, k)[0], 64 * cf.rest_mk(m, k)[1], l),
    ),
    "by_col_permuted": (_by_col("permuted"), lambda m, k, l: (128 * cf.rest_mk(m, k)[0], k // 16, l)),
    "by_col_plain": (_by_col("plain"), lambda m, k, l: (128 * cf.rest_mk(m, k)[0], k // 16, l)),
    "slab": (lambda m, k, l: sf_cute.sf_slab_layout(k), lambda m, k, l: (128, k // 16)),
    "unit_slices": (sf_cute.sf_unit_slices, lambda m, k, l: (128, k // 64, 4, cf.rest_mk(m, k)[0], l)),
    "fp4_nibble": (sf_cute.fp4_packed_view, lambda m, k, l: (m, k, l)),
    "fp4_byte": (sf_cute.fp4_byte_layout, lambda m, k, l: (m, k // 2, l)),
}


def _ptr(buf):
    return make_ptr(cutlass.Int32, buf.ctypes.data, cute.AddressSpace.gmem)


def _compile_evaluator(build):
    """Compile build(m, k, l) into a host function filling an int32 buffer; returns run(m, k, l, n)."""

    @cute.jit
    def fill(out_ptr: cute.Pointer, n: cutlass.Int32, m: cutlass.Int32, k: cutlass.Int32, l: cutlass.Int32):
        layout = build(m, k, l)
        out = cute.make_tensor(out_ptr, cute.make_layout(n + 1))
        out[n] = cute.size(layout)
        for idx in cutlass.range(n):
            out[idx] = layout(idx)

    dummy = np.zeros(2, np.int32)
    compiled = cute.compile(fill, _ptr(dummy), 1, 64, 1, 1)

    def run(m, k, l, n):
        out = np.zeros(n + 1, np.int32)
        compiled(_ptr(out), n, m, k, l)
        return out[:n], int(out[n])

    return run


@functools.cache
def _evaluator(name):
    return _compile_evaluator(BUILDERS[name][0])


def _cute_offsets(name, m, k, l, run=None):
    """(offsets, coordinates): offsets[idx] = layout(idx); coordinates = colex decomposition of idx."""
    extents = BUILDERS[name][1](m, k, l)
    n = int(np.prod(extents))
    offsets, size = (run or _evaluator(name))(m, k, l, n)
    assert size == n, f"{name}{(m, k, l)}: layout size {size}, domain size {n}"
    coords = np.unravel_index(np.arange(n, dtype=np.int64), extents, order="F")
    return offsets.astype(np.int64), coords


def _closed_form(name, coords, m, k, l):
    if name == "atom":
        return cf.atom_offset(*coords)
    if name in ("permuted_mkl", "cutlass_sf"):
        return cf.permuted_mkl_offset(*coords, m, k)
    if name == "by_col_permuted":
        return cf.permuted_offset(*coords, m, k)
    if name == "by_col_plain":
        return cf.plain_offset(*coords, m, k)
    if name == "slab":
        return cf.slab_offset(*coords, k)
    if name == "unit_slices":
        return cf.unit_slice_offset(*coords, m, k)
    if name == "fp4_nibble":
        return cf.fp4_nibble_offset(*coords, m, k)
    if name == "fp4_byte":
        return cf.fp4_byte_offset(*coords, m, k)
    raise KeyError(name)


def _valid(name, coords, m):
    """Mask of coordinates that exist in the layout's buffer (plain scales have no padding rows)."""
    if name == "by_col_plain":
        return coords[0] < m
    return np.ones(coords[0].shape, dtype=bool)


def _agrees(name, m, k, l, run=None):
    offsets, coords = _cute_offsets(name, m, k, l, run)
    valid = _valid(name, coords, m)
    return np.array_equal(offsets[valid], _closed_form(name, coords, m, k, l)[valid])


def _plain_scales(m, k, l, seed):
    """Random nonzero scale bytes, (m, k/16, l) with the contest's sfa strides."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 256, (l, m, k // 16), generator=g, dtype=torch.uint8).permute(1, 2, 0)


def _memory(t):
    """The bytes of a tensor's storage in memory order (the tensor covers its storage exactly)."""
    return torch.as_strided(t, (t.untyped_storage().nbytes() // t.element_size(),), (1,), 0).numpy()


# ---- agreement: CuTe layout == closed form (== CUTLASS) for every layout and shape ----


@pytest.mark.parametrize("m,k,l", SHAPES)
@pytest.mark.parametrize("name", [n for n in BUILDERS if n != "atom"])
def test_cute_layout_equals_closed_form(name, m, k, l):
    assert _agrees(name, m, k, l)


def test_atom_equals_closed_form_and_is_a_bijection_onto_512_bytes():
    offsets, coords = _cute_offsets("atom", 128, 64, 1)
    np.testing.assert_array_equal(offsets, cf.atom_offset(*coords))
    # The 16 K elements of one scale share a byte; the 128 x 4 scales fill [0, 512) exactly once.
    assert np.array_equal(np.sort(offsets[coords[1] % 16 == 0]), np.arange(512))


@pytest.mark.parametrize("m,k,l", SHAPES)
def test_permuted_mkl_equals_cutlass_tile_atom_to_shape_sf(m, k, l):
    ours, _ = _cute_offsets("permuted_mkl", m, k, l)
    theirs, _ = _cute_offsets("cutlass_sf", m, k, l)
    np.testing.assert_array_equal(ours, theirs)


@cute.jit
def _static_layouts(m: cutlass.Constexpr, k: cutlass.Constexpr, l: cutlass.Constexpr, out: cutlass.Constexpr):
    for layout in (sf_cute.sf_layout_permuted_mkl(m, k, l), tile_atom_to_shape_SF((m, k, l), 16)):
        out.append((layout.shape, layout.stride))


def _flatten(t):
    return [x for e in t for x in _flatten(e)] if isinstance(t, tuple) else [t]


@pytest.mark.parametrize("m,k,l", [(128, 256, 1), (2432, 4608, 2), (129, 320, 3)])
def test_permuted_mkl_has_cutlass_shape_and_strides_with_static_sizes(m, k, l):
    out = []
    _static_layouts(m, k, l, out)
    rest_m, rest_k = cf.rest_mk(m, k)
    shape = (((32, 4), rest_m), ((16, 4), rest_k), (1, l))
    stride = (((16, 4), 512 * rest_k), ((0, 1), 512), (0, 512 * rest_m * rest_k))
    for got_shape, got_stride in out:  # ours, then CUTLASS's
        assert got_shape == shape
        # CUTLASS writes stride 0 for modes of extent 1; such a stride is never multiplied by anything but 0.
        for n, got, want in zip(_flatten(shape), _flatten(got_stride), _flatten(stride)):
            assert got == want or n == 1


def test_constants():
    assert (sf_cute.SF_VEC, sf_cute.ATOM_ROWS, sf_cute.ATOM_SF_COLS, sf_cute.ATOM_K, sf_cute.ATOM_BYTES) == (
        16,
        128,
        4,
        64,
        512,
    )


def test_package_imports_cutlass_only_on_first_use_of_a_cute_name():
    code = (
        "import sys, layouts; assert 'cutlass' not in sys.modules; "
        "from layouts import sf_cute; assert layouts.sf_layout_by_col is sf_cute.sf_layout_by_col; "
        "assert layouts.ATOM_BYTES == 512"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(AttributeError):
        _ = __import__("layouts").no_such_layout


def test_unknown_kind_raises():
    with pytest.raises(ValueError, match="kind"):
        _compile_evaluator(_by_col("swizzled"))


@given(
    m=st.integers(1, 700),
    kb=st.integers(1, 24),
    l=st.integers(1, 3),
    name=st.sampled_from(["permuted_mkl", "by_col_permuted", "by_col_plain", "slab", "unit_slices", "fp4_nibble"]),
)
@settings(max_examples=40, deadline=None)
def test_cute_layout_equals_closed_form_random_shapes(name, m, kb, l):
    assert _agrees(name, m, 64 * kb, l)


# ---- agreement with the torch buffers: the CuTe offsets find the right bytes ----


@pytest.mark.parametrize("m,k,l", SHAPES)
def test_by_col_layouts_read_the_torch_buffers(m, k, l):
    sf = _plain_scales(m, k, l, seed=m + k + l)
    sf_np = sf.numpy()
    permuted = _memory(convert.contest_permute(sf))
    plain = _memory(sf)
    for name, buf in (("by_col_permuted", permuted), ("by_col_plain", plain)):
        offsets, (i, j, b) = _cute_offsets(name, m, k, l)
        valid = i < m
        np.testing.assert_array_equal(buf[offsets[valid]], sf_np[i[valid], j[valid], b[valid]])
        if name == "by_col_permuted":
            assert not buf[offsets[~valid]].any(), "padding rows must read zero"
            assert np.array_equal(np.sort(offsets), np.arange(buf.size)), "permuted view must cover the buffer once"


@pytest.mark.parametrize("m,k,l", SHAPES)
def test_permuted_mkl_and_slab_read_the_torch_buffer(m, k, l):
    sf = _plain_scales(m, k, l, seed=3 * m + k)
    sf_np = sf.numpy()
    permuted = _memory(convert.plain_to_permuted(sf))
    offsets, (i, e, b) = _cute_offsets("permuted_mkl", m, k, l)
    valid = i < m
    np.testing.assert_array_equal(permuted[offsets[valid]], sf_np[i[valid], e[valid] // 16, b[valid]])
    # Each 128-row block's scales are one contiguous run, laid out by the slab layout.
    slab, (r, j) = _cute_offsets("slab", m, k, l)
    rest_m, rest_k = cf.rest_mk(m, k)
    run = 512 * rest_k
    assert np.array_equal(np.sort(slab), np.arange(run))
    for b_ in range(l):
        for mb in range(rest_m):
            block = permuted[(b_ * rest_m + mb) * run : (b_ * rest_m + mb + 1) * run]
            rows = 128 * mb + r
            ok = rows < m
            np.testing.assert_array_equal(block[slab[ok]], sf_np[rows[ok], j[ok], b_])


def _pack_fp4(codes):
    """(rows, k, l) nibble codes -> (rows, k/2, l) bytes, memory [l][rows][k/2], even K element in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).permute(2, 0, 1).contiguous().permute(1, 2, 0)


@pytest.mark.parametrize("m,k,l", SHAPES + [(128, 7168, 1)])
def test_fp4_views_read_the_packed_bytes(m, k, l):
    g = torch.Generator().manual_seed(m * k + l)
    codes = torch.randint(0, 16, (m, k, l), generator=g, dtype=torch.uint8)
    packed = _pack_fp4(codes)
    mem = _memory(packed)
    codes_np = codes.numpy()
    nib, (row, e, b) = _cute_offsets("fp4_nibble", m, k, l)
    np.testing.assert_array_equal((mem[nib >> 1] >> (4 * (nib & 1))) & 15, codes_np[row, e, b])
    byte, (row, c, b) = _cute_offsets("fp4_byte", m, k, l)
    np.testing.assert_array_equal(mem[byte], packed.numpy()[row, c, b])


# ---- static sizes give the same static layouts ----


@pytest.mark.parametrize("m,k,l", [(129, 320, 2), (512, 512, 2)])
def test_static_sizes_build_static_layouts_with_the_same_offsets(m, k, l):
    builders = [(n, BUILDERS[n][0]) for n in ("permuted_mkl", "by_col_permuted", "by_col_plain", "fp4_nibble")]

    @cute.jit
    def fill_static(out_ptr: cute.Pointer, n: cutlass.Int32, which: cutlass.Constexpr[int]):
        layout = builders[which][1](m, k, l)
        out = cute.make_tensor(out_ptr, cute.make_layout(n + 2))
        out[n] = cute.size(layout)
        out[n + 1] = 1 if cute.is_static(layout) else 0
        for idx in cutlass.range(n):
            out[idx] = layout(idx)

    for which, (name, _) in enumerate(builders):
        dynamic, _ = _cute_offsets(name, m, k, l)
        n = dynamic.size
        out = np.zeros(n + 2, np.int32)
        cute.compile(fill_static, _ptr(out), n, which)(_ptr(out), n)
        assert out[n] == n and out[n + 1] == 1, name
        np.testing.assert_array_equal(out[:n], dynamic)


# ---- mutation: corrupting any one stride must make the agreement check fail ----

# stride function -> the layouts built from it
STRIDE_TABLES = {
    "_atom_stride": ["atom", "permuted_mkl"],
    "_atom_grid_stride": ["permuted_mkl"],
    "_by_col_stride": ["by_col_permuted", "by_col_plain"],
    "_slab_stride": ["slab"],
    "_unit_slices_stride": ["unit_slices"],
    "_fp4_nibble_stride": ["fp4_nibble"],
    "_fp4_byte_stride": ["fp4_byte"],
}


def _perturb_leaf(tree, target, counter=None):
    """Copy of a nested stride tuple with leaf number `target` (depth-first) increased by one."""
    counter = counter if counter is not None else [0]
    if isinstance(tree, tuple):
        return tuple(_perturb_leaf(t, target, counter) for t in tree)
    hit = counter[0] == target
    counter[0] += 1
    return tree + 1 if hit else tree


def _n_leaves(tree):
    return sum(_n_leaves(t) for t in tree) if isinstance(tree, tuple) else 1


def _stride_sample(table, layout):
    """The stride tuple a table returns for MUTATION_SHAPE (stride tables are plain Python on ints)."""
    m, k, _ = MUTATION_SHAPE
    fn = getattr(sf_cute, table)
    if table == "_atom_grid_stride":
        return fn(*cf.rest_mk(m, k))
    if table == "_by_col_stride":
        return fn(layout.removeprefix("by_col_"), m, k)
    if table in ("_fp4_nibble_stride", "_fp4_byte_stride", "_unit_slices_stride"):
        return fn(m, k)
    return fn()


MUTATIONS = [
    (table, layout, leaf)
    for table, layouts_ in STRIDE_TABLES.items()
    for layout in layouts_
    for leaf in range(_n_leaves(_stride_sample(table, layout)))
]


def test_mutation_cases_cover_every_stride():
    # 4 atom strides (twice), 3 grid, 6 + 6 by-col, 4 slab, 5 unit slices, 4 nibble, 3 byte.
    assert len(MUTATIONS) == 4 + 4 + 3 + 6 + 6 + 4 + 5 + 4 + 3


@pytest.mark.parametrize("table,layout,leaf", MUTATIONS)
def test_corrupting_one_stride_breaks_agreement(monkeypatch, table, layout, leaf):
    m, k, l = MUTATION_SHAPE
    assert _agrees(layout, m, k, l)
    original = getattr(sf_cute, table)
    monkeypatch.setattr(sf_cute, table, lambda *args: _perturb_leaf(original(*args), leaf))
    mutated = _compile_evaluator(BUILDERS[layout][0])
    assert not _agrees(layout, m, k, l, run=mutated)
