"""Closed-form offsets of every layout in ``sf_cute``, in plain Python/numpy (scalars or integer arrays).

Written from docs/contract.md's formula with // and %, independently of the CuTe stride tables, so that a test can
check the CuTe layouts, these functions and the torch converters against each other element by element.
Arguments: i = row, j = scale column (K element // 16), e = K element, l = batch; m, k = the matrix's M and K
(K in elements). rest_m = ceil(m/128), rest_k = ceil(k/64). Offsets are in bytes, except ``fp4_nibble_offset``.
"""

import numpy as np

from layouts.constants import ATOM_BYTES, ATOM_K, ATOM_ROWS, ATOM_SF_COLS, SF_KINDS, SF_VEC  # noqa: F401


def rest_mk(m, k):
    """(ceil(m/128), ceil(k/64)): the atom grid of an M x K matrix."""
    return -(-m // 128), -(-k // 64)


def atom_offset(r, e):
    """Byte of (row r in [0,128), K element e in [0,64)) in one 512-byte atom."""
    return (r % 32) * 16 + (r // 32) * 4 + e // SF_VEC


def permuted_offset(i, j, l, m, k):
    """Byte of scale (row i, scale column j, batch l) in the contiguous sfa_permuted buffer (docs/contract.md)."""
    rest_m, rest_k = rest_mk(m, k)
    return (
        l * rest_m * rest_k * 512
        + (i // 128) * rest_k * 512
        + (j // 4) * 512
        + (i % 32) * 16
        + ((i % 128) // 32) * 4
        + j % 4
    )


def permuted_mkl_offset(i, e, l, m, k):
    """Byte of the scale of (row i, K element e, batch l) in the permuted buffer."""
    return permuted_offset(i, e // SF_VEC, l, m, k)


def plain_offset(i, j, l, m, k):
    """Byte of scale (i, j, l) in the row-major (M, K/16, L) buffer; valid for i < m only."""
    kc = k // SF_VEC
    return (l * m + i) * kc + j


def slab_offset(i, j, k):
    """Byte of (row i in [0,128), scale column j) inside one 128-row block's contiguous run of the permuted buffer."""
    return permuted_offset(i, j, 0, 128, k)


def unit_slice_offset(b, g, u, mb, l, m, k):
    """Byte of (slice byte b, 64-K group g, quarter u, 128-row block mb, batch l) of the permuted buffer: the scale
    of row 128*mb + 32*q + 8*u + r, scale column 4*g + jj, where b = r*16 + q*4 + jj."""
    r, q, jj = b // 16, (b % 16) // 4, b % 4
    return permuted_offset(128 * mb + 32 * q + 8 * u + r, 4 * g + jj, l, m, k)


def fp4_nibble_offset(row, e, l, rows, k):
    """Nibble index of fp4 element (row, K element e, batch l) in a packed (rows, k/2, L) byte buffer.

    The byte is nibble // 2; nibble % 2 == 0 means the low nibble.
    """
    return ((l * rows + row) * (k // 2) + e // 2) * 2 + e % 2


def fp4_byte_offset(row, b, l, rows, k):
    """Byte (row, byte column b, batch l) of the packed (rows, k/2, L) buffer."""
    return (l * rows + row) * (k // 2) + b


def permuted_index_array(m, k, l):
    """int64 array of shape (m, k//16, l): entry [i, j, b] is the permuted-buffer byte of plain scale (i, j, b).

    ``permuted.reshape(-1)[permuted_index_array(m, k, l)]`` equals the plain (m, k//16, l) scales.
    """
    i, j, b = np.meshgrid(
        np.arange(m, dtype=np.int64),
        np.arange(-(-k // SF_VEC), dtype=np.int64),
        np.arange(l, dtype=np.int64),
        indexing="ij",
    )
    return permuted_offset(i, j, b, m, k)
