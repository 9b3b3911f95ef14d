"""FP4 weights to 16-bit: out[n, k] = code(W[n, k]) · scale(n, k) in bf16 or fp16, for the W4A16 linear's many-token
path (nvfp4_gemv/linear/prefill.py), where a GEMM on the dequantized rows beats decoding W once per 16 tokens.

W and its scales are read exactly as the linear reads them (uint8 (N, K/2), the even k in the low nibble; NVFP4
e4m3 scales plain or in the 128x4 atom layout, MXFP4 e8m0 scales plain), through the linear's own decode, scale and
address helpers. A thread takes four 8-code words of W, 32 apart, so that a warp's loads and stores are contiguous:

    grid (ceil(K/8 / 512), N), 128 threads   warp v, lane l of CTA (x, row): words 512x + 128v + l + 32j, j < 4
    per word: its block scale (one byte), decode_word's pairs (i, i+4) (bf16) or (i, i+2) (fp16), each times the
    scale, prmt to natural pairs (2j, 2j+1), one 128-bit store: 512 contiguous bytes of out a warp instruction

Every value is exact: an e2m1 code times an e4m3 scale has at most 6 significant bits and lies in [2^-10, 2688],
which bf16 and fp16 both hold; an MXFP4 code times 2^(s-127) is exact in bf16 down to its subnormals (2^-133)
and overflows to inf above its range. MXFP4 into fp16 is refused: most e8m0 scales fall outside fp16's range.
The global scale is not applied (the caller multiplies the GEMM's fp32 sums by it, one rounding).
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32, const_expr

from cute_kernels.compile import launch
from cute_kernels.linear_w4a16 import (
    SF_DTYPES,
    decode_word,
    fake_weight_operands,
    ld_global_nc,
    mul_x2,
    prmt,
    scale_codes,
    scale_multipliers,
    sf_address,
    weight_views,
)

THREADS = 128
WORDS = 4  # W words (8 codes each) a thread dequantizes
MAX_ROWS = 65535  # the grid's y
# Natural pairs (2j, 2j+1) from decode_word's pairs, per dtype: output word j = prmt(pairs[a], pairs[b], sel).
NATURAL = {
    "bf16": ((0, 1, 0x5410), (2, 3, 0x5410), (0, 1, 0x7632), (2, 3, 0x7632)),  # pairs (0,4) (1,5) (2,6) (3,7)
    "fp16": ((0, 1, 0x5410), (0, 1, 0x7632), (2, 3, 0x5410), (2, 3, 0x7632)),  # pairs (0,2) (1,3) (4,6) (5,7)
}
BF16_2_8 = 0x43804380  # 2^8 in both bf16 halves: NVFP4's scale fold leaves code · scale · 2^-8 in bf16


@dataclass(frozen=True)
class DequantFp4Config:
    """The cache key of one compiled dequantizer."""

    fmt: str = "nvfp4"  # "nvfp4" (e4m3 per 16) or "mxfp4" (e8m0 per 32)
    sf_kind: str = "plain"  # nvfp4: "plain" (N, K/16) or "permuted" (the 128x4 atom layout)
    out_dtype: str = "bf16"  # "bf16" or (nvfp4 only) "fp16"
    sf_dtype: str = "u8"  # the scale tensor's element type as passed: "u8" or (nvfp4) "e4m3"

    def __post_init__(self):
        if self.fmt not in ("nvfp4", "mxfp4"):
            raise ValueError(f"fmt must be 'nvfp4' or 'mxfp4', got {self.fmt!r}")
        if self.out_dtype not in ("bf16", "fp16") or (self.fmt == "mxfp4" and self.out_dtype != "bf16"):
            raise ValueError(f"out_dtype must be 'bf16' or (nvfp4 only) 'fp16', got {self.out_dtype!r} for {self.fmt}")
        if self.sf_kind not in ("plain", "permuted") or (self.fmt == "mxfp4" and self.sf_kind != "plain"):
            raise ValueError(f"sf_kind must be 'plain' or (nvfp4 only) 'permuted', got {self.sf_kind!r}")
        if self.sf_dtype not in SF_DTYPES or (self.sf_dtype == "e4m3" and self.fmt != "nvfp4"):
            raise ValueError(f"sf_dtype must be 'u8' or (nvfp4) 'e4m3', got {self.sf_dtype!r} for {self.fmt}")


class DequantFp4:
    def __init__(self, config: DequantFp4Config, target=None):
        self.cfg = config

    @staticmethod
    def can_implement(n: int, k: int) -> bool:
        """1 <= N <= 65535 rows (the grid's y; callers go in chunks), K a positive multiple of 64, and out's
        32-bit words (N·K/2) below 2^31."""
        return 1 <= n <= MAX_ROWS and k >= 64 and k % 64 == 0 and n * k < 2**32

    @staticmethod
    def fake_operands(config: DequantFp4Config):
        from cutlass.cute.runtime import make_fake_tensor

        n = cute.sym_int()
        k = cute.sym_int(divisibility=64)
        w, sf = fake_weight_operands(n, config.sf_kind, config.sf_dtype)
        odt = cutlass.BFloat16 if config.out_dtype == "bf16" else cutlass.Float16
        out = make_fake_tensor(odt, (n, k), stride=(k, 1), assumed_align=16)
        return w, sf, out

    @cute.jit
    def __call__(self, mW: cute.Tensor, mSF: cute.Tensor, mOut: cute.Tensor, stream=None):
        launch(*self.build(mW, mSF, mOut), stream=stream)

    @cute.jit
    def build(self, mW, mSF, mOut):
        cfg = self.cfg
        n, k = mOut.shape
        w_words, sf = weight_views(mW, mSF, cfg.fmt, cfg.sf_kind, n, k)
        out_words = cute.make_tensor(
            cute.recast_ptr(mOut.iterator, dtype=Uint32), cute.make_layout((n, k // 2), stride=(k // 2, 1))
        )
        per_cta = THREADS * WORDS
        shape = dict(grid=[(k // 8 + per_cta - 1) // per_cta, n, 1], block=[THREADS, 1, 1])
        return self.kernel(w_words, sf, out_words, k), shape

    @cute.kernel
    def kernel(self, w_words: cute.Tensor, sf: cute.Tensor, out_words: cute.Tensor, k: Int32):
        cfg = self.cfg
        dt = cfg.out_dtype
        tidx, _, _ = cute.arch.thread_idx()
        bidx, row, _ = cute.arch.block_idx()
        kw = k >> 3  # W words (8 codes) in a row
        first = bidx * (THREADS * WORDS) + (tidx >> 5) * (32 * WORDS) + (tidx & 31)
        atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Uint32, num_bits_per_copy=128)
        for j in cutlass.range_constexpr(WORDS):
            i = first + 32 * j  # lanes take consecutive words: 128 B of W a load, 512 B of out a store
            if i < kw:
                col = i >> 1 if cfg.fmt == "nvfp4" else i >> 2  # the word's block (16 or 32 codes)
                sc, _ = scale_multipliers(cfg.fmt, dt, ld_global_nc(sf_address(sf, cfg.fmt, row, col), 8))
                pairs = scale_codes(cfg.fmt, dt, decode_word(w_words[row, i], dt), sc)
                if const_expr(cfg.fmt == "nvfp4" and dt == "bf16"):
                    pairs = [mul_x2(v, Uint32(BF16_2_8), "bf16") for v in pairs]
                rO = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
                for q in cutlass.range_constexpr(4):
                    a, b, sel = NATURAL[dt][q]
                    rO[q] = prmt(pairs[a], pairs[b], sel)
                cute.copy(atom, rO, cute.local_tile(out_words[row, None], (4,), (i,)))
