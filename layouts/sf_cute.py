"""CuTe layouts for NVFP4 scale factors and packed fp4 operands, callable inside ``@cute.jit`` code.

The scale atom is 512 bytes: 128 rows x 4 scale columns (64 K elements), row r at byte (r%32)*16 + (r//32)*4.
Atoms run K-fastest inside a 128-row block, then blocks, then batches, so one 128-row block's scales are one
contiguous run of 512*rest_k bytes (the contest's ``sfa_permuted``). ``sf_layout_by_col`` is the view the kernels
use: one coordinate domain, (row, scale column, batch), over either the permuted or the plain row-major buffer.
Sizes may be Python ints (static layout) or dynamic ``cutlass.Int32`` (ceil-divs are written as ``(x + d - 1) // d``).
Every stride comes from one small ``_*_stride`` function, so a test can perturb any single stride.

    One atom: byte of (row r, scale column j) = (r % 32)*16 + (r // 32)*4 + j

           j:  0   1   2   3
      r =  0:  0   1   2   3      r = 32:   4 ..   7     r = 64:   8 ..  11     r = 96:  12 ..  15
      r =  1: 16  17  18  19      r = 33:  20 ..  23
      r = 31: 496 ..     499      r = 63: 500 .. 503     r = 95: 504 .. 507     r = 127: 508 .. 511
"""

import cutlass.cute as cute

from layouts.constants import ATOM_BYTES, ATOM_K, ATOM_ROWS, ATOM_SF_COLS, SF_KINDS, SF_VEC  # noqa: F401

UNIT_SLICE_BYTES = 128  # one quarter's bytes of one atom: rows 8u..8u+7 (all four 32-row groups), 4 columns


def _ceil_div(x, d):
    return (x + d - 1) // d


def _rest_m(m):
    return _ceil_div(m, ATOM_ROWS)


def _rest_k(k):
    return _ceil_div(k, ATOM_K)


def _multiple(x, d):
    """x, with "divisible by d" recorded for the compiler when x is dynamic (alignment of vector accesses)."""
    return x if isinstance(x, int) else cute.assume(x, divby=d)


# ---- stride tables (one function per layout; offsets in bytes unless stated) ----


def _atom_stride():
    # ((row % 32, row // 32), (K element % 16, K element // 16)); the 16 K elements of one scale share a byte.
    return ((16, 4), (0, 1))


def _atom_grid_stride(rest_m, rest_k):
    # (128-row block, 64-K block, batch), in atoms: K-fastest, then blocks, then batches.
    return (rest_k, 1, rest_m * rest_k)


def _by_col_stride(kind, m, k):
    rest_m, rest_k = _rest_m(m), _rest_k(k)
    if kind == "permuted":
        block = _multiple(ATOM_BYTES * rest_k, ATOM_BYTES)
        return ((16, 4, block), (1, ATOM_BYTES), _multiple(block * rest_m, ATOM_BYTES))
    if kind == "plain":
        kc = _multiple(k // SF_VEC, ATOM_SF_COLS)  # k % 64 == 0
        return ((kc, 32 * kc, ATOM_ROWS * kc), (1, ATOM_SF_COLS), m * kc)
    raise ValueError(f"sf layout kind must be one of {SF_KINDS}, got {kind!r}")


def _unit_slices_stride(m, k):
    # (byte of a quarter's slice, 64-K group, quarter, 128-row block, batch) over the permuted buffer.
    block = _multiple(ATOM_BYTES * _rest_k(k), ATOM_BYTES)
    return (1, ATOM_BYTES, UNIT_SLICE_BYTES, block, _multiple(block * _rest_m(m), ATOM_BYTES))


def _slab_stride():
    return ((16, 4), (1, ATOM_BYTES))


def _fp4_nibble_stride(rows, k):
    # (row, (K element % 2, K element // 2), batch), in nibbles.
    k = _multiple(k, ATOM_K)
    return (k, (1, 2), rows * k)


def _fp4_byte_stride(rows, k):
    half_k = _multiple(k // 2, ATOM_K // 2)
    return (half_k, 1, rows * half_k)


# ---- layouts ----


def sf_atom():
    """The 512-byte scale atom in K-element units: ((32,4),(16,4)) : ((16,4),(0,1)).

    Coordinate (row in [0,128), K element in [0,64)) -> byte in [0,512).
    """
    return cute.make_layout(((32, 4), (SF_VEC, ATOM_SF_COLS)), stride=_atom_stride())


def sf_layout_permuted_mkl(m, k, l):
    """The atom tiled over (M, K, L) in K-element units; rows padded to 128, K to 64.

    Shape (((32,4),rest_m), ((16,4),rest_k), (1,l)): coordinate (row, K element, batch) -> byte of the permuted
    buffer. The same function as CUTLASS's ``tile_atom_to_shape_SF((m, k, l), 16)``.
    """
    rest_m, rest_k = _rest_m(m), _rest_k(k)
    # A blocked product of the atom with the (rest_m, rest_k, l) atom grid, written mode by mode: mode i = (atom mode
    # i, grid mode i), grid strides in units of one atom. cute.blocked_product gives the same layout, but its
    # complement step dies with SIGFPE inside the DSL (4.8.1) once the atom is not injective, which the
    # stride-mutation test needs to survive; concatenating layouts with make_layout needs DSL 4.8.
    (row_stride, k_stride) = _atom_stride()
    grid = [_multiple(ATOM_BYTES * s, ATOM_BYTES) for s in _atom_grid_stride(rest_m, rest_k)]
    shape = (((32, 4), rest_m), ((SF_VEC, ATOM_SF_COLS), rest_k), (1, l))
    return cute.make_layout(shape, stride=((row_stride, grid[0]), (k_stride, grid[1]), (0, grid[2])))


def sf_layout_by_col(kind, m, k, l):
    """(row, scale column, batch) -> byte, over the permuted or the plain scale buffer.

    Shape ((32, 4, rest_m), (4, rest_k), l), with row = r + 32*q + 128*mb and scale column j = jj + 4*g.
    kind "permuted": the contest's sfa_permuted/sfb_permuted (rows padded to 128*rest_m).
    kind "plain": the row-major (M, K/16, L) buffer; rows >= m are outside it, so the caller predicates them.
    ``k`` is in K elements and must be a multiple of 64.
    """
    stride = _by_col_stride(kind, m, k)
    shape = ((32, 4, _rest_m(m)), (ATOM_SF_COLS, _rest_k(k)), l)
    return cute.make_layout(shape, stride=stride)


def sf_unit_slices(m, k, l):
    """The permuted buffer as (byte b, 64-K group g, quarter u, 128-row block mb, batch l) -> byte.

    Quarter u of a block is the 32 rows 8u + r + 32q (r < 8, q < 4). In every atom their scales are one run of 128
    bytes, byte b = r*16 + q*4 + jj for scale column 4g + jj: the slice the Hopper TMA kernel copies, one box of
    (128 bytes × several groups) per stage. The first 16 bytes of quarter 0 hold rows 0, 32, 64, 96; row 0's four
    scales are bytes 0..3 (what a GEMV needs of b's scales).
    """
    shape = (UNIT_SLICE_BYTES, _rest_k(k), 4, _rest_m(m), l)
    return cute.make_layout(shape, stride=_unit_slices_stride(m, k))


def sf_slab_layout(k):
    """The scales of one 128-row block of the permuted buffer: ((32,4),(4,rest_k)) : ((16,4),(1,512)).

    Coordinate (row in block, scale column) -> byte in one contiguous run of 512*rest_k bytes.
    """
    rest_k = _rest_k(k)
    return cute.make_layout(((32, 4), (ATOM_SF_COLS, rest_k)), stride=_slab_stride())


def fp4_packed_view(rows, k, l):
    """(row, K element, batch) -> nibble index in the packed fp4 buffer of A (rows = M) or b (rows = 128).

    Byte = nibble // 2; the low nibble holds the even K element. Shape (rows, (2, k//2), l). A dynamic ``k`` is
    declared to the compiler as a multiple of 64, as the contract guarantees.
    """
    return cute.make_layout((rows, (2, k // 2), l), stride=_fp4_nibble_stride(rows, k))


def fp4_byte_layout(rows, k, l):
    """(row, byte column, batch) -> byte of the packed fp4 buffer: (rows, k//2, l) : (k//2, 1, rows*k//2).

    A dynamic ``k`` is declared to the compiler as a multiple of 64, as the contract guarantees.
    """
    return cute.make_layout((rows, k // 2, l), stride=_fp4_byte_stride(rows, k))
