"""Torch converters between the plain (M, K/16, L) scale layout and the permuted 32x4x4 atom layout.

Works on CPU or GPU tensors of dtype float8_e4m3fn or uint8 and returns the input's dtype and device.
The permuted tensor has shape (32, 4, rest_m, 4, rest_k, L) and the contest's strides
(16, 4, 512*rest_k, 1, 512, 512*rest_m*rest_k) over one contiguous buffer of L*rest_m*rest_k*512 bytes.
Padding rules: rows are padded up to rest_m*128 and scale columns up to rest_k*4 (K up to a multiple of 64) with
zero bytes (+0.0 in e4m3), as cuBLAS expects; batches are never padded. ``permuted_to_plain`` drops the padding
without looking at it. Plain outputs use the contest's sfa memory order [L][M][K/16]: strides (K/16, 1, M*K/16).
"""

import torch

SF_DTYPES = (torch.float8_e4m3fn, torch.uint8)


def _as_bytes(sf, ndim, name):
    if not isinstance(sf, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(sf).__name__}")
    if sf.dtype not in SF_DTYPES:
        raise TypeError(f"{name} must have dtype float8_e4m3fn or uint8, got {sf.dtype}")
    if sf.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(sf.shape)}")
    if 0 in sf.shape:
        raise ValueError(f"{name} must not be empty, got shape {tuple(sf.shape)}")
    return sf.view(torch.uint8)


def _rest(rows, cols):
    return -(-rows // 128), -(-cols // 4)


def _padded(u, rest_m, rest_k):
    """Zero-padded copy of a (rows, cols, ...) byte tensor with rest_m*128 rows and rest_k*4 columns."""
    out = u.new_zeros((rest_m * 128, rest_k * 4) + tuple(u.shape[2:]))
    out[: u.shape[0], : u.shape[1]] = u
    return out


def permuted_shape_stride(m, kc, l):
    """The contest's (shape, stride) of the permuted scales of an (m, kc, l) plain scale tensor."""
    rest_m, rest_k = _rest(m, kc)
    return (32, 4, rest_m, 4, rest_k, l), (16, 4, 512 * rest_k, 1, 512, 512 * rest_m * rest_k)


def plain_to_permuted(sf):
    """(M, K/16, L) scales -> (32, 4, rest_m, 4, rest_k, L) permuted scales with the contest's strides."""
    u = _as_bytes(sf, 3, "sf")
    m, kc, l = u.shape
    rest_m, rest_k = _rest(m, kc)
    # row = 128*mb + 32*q + r, scale column = 4*g + jj
    tiles = _padded(u, rest_m, rest_k).view(rest_m, 4, 32, rest_k, 4, l)  # (mb, q, r, g, jj, l)
    buf = u.new_empty((l, rest_m, rest_k, 32, 4, 4))  # fresh, so size-1 dims get the contest's strides too
    buf.copy_(tiles.permute(5, 0, 3, 2, 1, 4))  # memory [l][mb][g][r][q][jj]
    return buf.permute(3, 4, 1, 5, 2, 0).view(sf.dtype)  # (r, q, mb, jj, g, l)


def permuted_to_plain(sfp, m, k):
    """(32, 4, rest_m, 4, rest_k, L) permuted scales -> (m, k/16, L) plain scales, padding dropped.

    ``k`` is in K elements (a multiple of 16). Any strides are accepted; the result has the contest's sfa strides.
    """
    u = _as_bytes(sfp, 6, "sfp")
    if k <= 0 or k % 16 or m <= 0:
        raise ValueError(f"need m >= 1 and k a positive multiple of 16, got m={m}, k={k}")
    kc = k // 16
    rest_m, rest_k = _rest(m, kc)
    l = u.shape[5]
    if tuple(u.shape[:5]) != (32, 4, rest_m, 4, rest_k):
        raise ValueError(
            f"sfp shape {tuple(sfp.shape)} does not hold m={m}, k={k}: expected (32, 4, {rest_m}, 4, {rest_k}, L)"
        )
    plain = u.permute(2, 1, 0, 4, 3, 5).reshape(rest_m * 128, rest_k * 4, l)  # (mb q r, g jj, l)
    out = u.new_empty((l, m, kc)).permute(1, 2, 0)
    out.copy_(plain[:m, :kc])
    return out.view(sfp.dtype)


def to_blocked(sf2d):
    """(rows, cols) scales of one batch -> the flat blocked vector of cuBLAS/torchao block scaling.

    Length rest_m*rest_k*512; equal to one batch of ``plain_to_permuted`` read in memory order.
    """
    u = _as_bytes(sf2d, 2, "sf2d")
    rows, cols = u.shape
    rest_m, rest_k = _rest(rows, cols)
    blocks = _padded(u, rest_m, rest_k).view(rest_m, 128, rest_k, 4).transpose(1, 2)  # (mb, g, 128, 4)
    tiles = blocks.reshape(rest_m, rest_k, 4, 32, 4).transpose(2, 3)  # (mb, g, r, q, jj)
    return tiles.reshape(-1).view(sf2d.dtype)


def contest_permute(sf):
    """Reference plain -> permuted conversion, written as a scatter from docs/contract.md's coordinate formula.

    Allocates the zeroed contiguous buffer [L][rest_m][rest_k][32][4][4], views it as
    (32, 4, rest_m, 4, rest_k, L) and writes sf[i, j, l] at (i%32, (i%128)//32, i//128, j%4, j//4, l).
    """
    u = _as_bytes(sf, 3, "sf")
    m, kc, l = u.shape
    rest_m, rest_k = _rest(m, kc)
    buf = torch.zeros((l, rest_m, rest_k, 32, 4, 4), dtype=torch.uint8, device=u.device)
    out = buf.permute(3, 4, 1, 5, 2, 0)
    i = torch.arange(m, device=u.device).view(m, 1, 1)
    j = torch.arange(kc, device=u.device).view(1, kc, 1)
    b = torch.arange(l, device=u.device).view(1, 1, l)
    out[i % 32, (i % 128) // 32, i // 128, j % 4, j // 4, b] = u
    return out.view(sf.dtype)
