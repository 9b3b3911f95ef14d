"""NVFP4 scale-factor layout algebra: CuTe layouts, their closed-form twins, and torch converters.

``sf_cute`` holds the CuTe layouts (for ``@cute.jit`` code); ``closed_form`` the same maps in numpy; ``convert``
the torch plain <-> permuted converters. Importing this package does not import cutlass: the ``sf_cute`` names
load on first use, so CUTE_DSL_ARCH may still be set after ``import layouts``.
"""

from layouts.constants import ATOM_BYTES, ATOM_K, ATOM_ROWS, ATOM_SF_COLS, SF_KINDS, SF_VEC
from layouts.closed_form import (
    atom_offset,
    fp4_byte_offset,
    fp4_nibble_offset,
    permuted_index_array,
    permuted_mkl_offset,
    permuted_offset,
    plain_offset,
    rest_mk,
    slab_offset,
)
from layouts.convert import (
    SF_DTYPES,
    contest_permute,
    permuted_shape_stride,
    permuted_to_plain,
    plain_to_permuted,
    to_blocked,
)

_SF_CUTE_NAMES = (
    "sf_atom",
    "sf_layout_permuted_mkl",
    "sf_layout_by_col",
    "sf_slab_layout",
    "fp4_packed_view",
    "fp4_byte_layout",
)

__all__ = [
    "ATOM_BYTES",
    "ATOM_K",
    "ATOM_ROWS",
    "ATOM_SF_COLS",
    "SF_KINDS",
    "SF_VEC",
    "atom_offset",
    "fp4_byte_offset",
    "fp4_nibble_offset",
    "permuted_index_array",
    "permuted_mkl_offset",
    "permuted_offset",
    "plain_offset",
    "rest_mk",
    "slab_offset",
    "SF_DTYPES",
    "contest_permute",
    "permuted_shape_stride",
    "permuted_to_plain",
    "plain_to_permuted",
    "to_blocked",
    *_SF_CUTE_NAMES,
]


def __getattr__(name):
    if name in _SF_CUTE_NAMES:
        from layouts import sf_cute

        return getattr(sf_cute, name)
    raise AttributeError(f"module 'layouts' has no attribute {name!r}")
