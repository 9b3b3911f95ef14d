"""The NVFP4 format's constants, defined once (no imports, so any module, the single-file submission included, can
use them)."""

SF_VEC = 16  # K elements per e4m3 scale
ATOM_ROWS = 128  # rows of one scale atom
ATOM_SF_COLS = 4  # scale columns of one atom
ATOM_K = ATOM_SF_COLS * SF_VEC  # 64 K elements: the K granularity of the permuted layout, and of every kernel
ATOM_BYTES = ATOM_ROWS * ATOM_SF_COLS  # 512
SF_KINDS = ("permuted", "plain")  # the scale buffers the kernels read: the contest's 32x4x4 atoms, or row-major
