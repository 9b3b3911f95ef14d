"""An independent float64 NVFP4 GEMV, the check on the fp32 reference (submission.reference) and on the kernels.

It shares nothing with the reference but the input tuple: fp4 and e4m3 are decoded from their bit formulas in numpy
(not the reference's lookup table or torch's float8 cast), A and b are read from their raw storage, and the scales
from the plain buffers or from the raw permuted buffers at the offsets of docs/contract.md (through
layouts.closed_form). Sums are float64, so on contest data the fp16 rounding of this GEMV is the exact answer.
"""

from __future__ import annotations


def fp4_f64(codes):
    """e2m1 codes -> float64 from the bit formula: sign bit 3, exponent bits 2..1 (bias 1), mantissa bit 0."""
    import numpy as np

    codes = codes.astype(np.int64)
    e, mant = (codes >> 1) & 3, codes & 1
    mag = np.where(e == 0, 0.5 * mant, np.exp2(e - 1.0) * (1.0 + 0.5 * mant))
    return np.where(codes & 8, -mag, mag)


def e4m3_f64(byte):
    """e4m3fn bytes -> float64 from the bit formula: bias 7, subnormals at exponent 0, NaN at S.1111.111."""
    import numpy as np

    byte = byte.astype(np.int64)
    e, mant = (byte >> 3) & 15, byte & 7
    mag = np.where(e == 0, mant / 8.0 * 2.0**-6, np.exp2(e - 7.0) * (1.0 + mant / 8.0))
    mag = np.where((e == 15) & (mant == 7), np.nan, mag)
    return np.where(byte & 0x80, -mag, mag)


def storage_bytes(t):
    """Every byte of t's storage from t's first element on, as a flat numpy uint8 array (no copy)."""
    import torch

    u = t.view(torch.uint8)
    return u.as_strided((u.untyped_storage().nbytes() - u.storage_offset(),), (1,)).numpy()


def fp64_gemv(data, sf_kind: str = "permuted"):
    """float64 c as an (M, L) numpy array, decoded by bit formulas; the scales come from the plain buffers or, for
    sf_kind="permuted", from the raw permuted buffers at the contract's offsets (layouts.closed_form)."""
    import numpy as np
    import torch

    from layouts.closed_form import permuted_index_array

    a, b, sfa, sfb, sfa_p, sfb_p, _ = data
    m, kb, l = a.shape  # noqa: E741
    k = 2 * kb
    a_u8 = a.view(torch.uint8).permute(2, 0, 1).numpy()  # (L, M, K/2)
    b_u8 = b.view(torch.uint8)[0].T.numpy()  # (L, K/2)
    if sf_kind == "permuted":
        sa = storage_bytes(sfa_p)[permuted_index_array(m, k, l)].transpose(2, 0, 1)  # (L, M, K/16)
        sb = storage_bytes(sfb_p)[permuted_index_array(128, k, l)][0].T  # (L, K/16)
    else:
        sa = sfa.view(torch.uint8).permute(2, 0, 1).numpy()
        sb = sfb.view(torch.uint8)[0].T.numpy()
    # Tables of the bit formulas over every code and byte, so each element costs one lookup.
    fp4, e4m3 = fp4_f64(np.arange(16)), e4m3_f64(np.arange(256))
    sa, sb = np.ascontiguousarray(sa), np.ascontiguousarray(sb)
    out = np.empty((m, l))
    with np.errstate(invalid="ignore"):
        for li in range(l):
            bv = fp4[np.stack((b_u8[li] & 15, b_u8[li] >> 4), -1).reshape(k)] * np.repeat(e4m3[sb[li]], 16)
            av = fp4[np.stack((a_u8[li] & 15, a_u8[li] >> 4), -1).reshape(m, k)]
            av *= np.repeat(e4m3[sa[li]], 16, axis=1)
            out[:, li] = av @ bv
    return out
