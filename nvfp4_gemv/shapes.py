"""Problem shapes of the NVFP4 batched GEMV, and the byte count that sets its memory floor.

Shapes are (M, K, L): M rows of A, K the reduction length in fp4 elements, L batches. TEST_SHAPES and BENCH_SHAPES
are the contest's; ODD_SHAPES are ragged ones (M not a multiple of 128, K a multiple of 64 only, M = 1) that a
library must also handle. `bytes_moved` is the one place that counts bytes: A, SFA, one row of b and of SFB, and C,
each read or written once per batch.
"""

from __future__ import annotations

from typing import NamedTuple


class BenchShape(NamedTuple):
    """A benchmark shape with the contest's B200 speed-of-light time for it."""

    m: int
    k: int
    l: int  # noqa: E741  (the contest's name for the batch count)
    b200_sol_us: float

    @property
    def mkl(self) -> tuple[int, int, int]:
        return (self.m, self.k, self.l)


# The contest's correctness shapes: every M a multiple of 128, every K a multiple of 256.
TEST_SHAPES: tuple[tuple[int, int, int], ...] = (
    (128, 256, 1),
    (128, 1536, 1),
    (128, 3072, 1),
    (256, 7168, 1),
    (2432, 4608, 2),
    (384, 7168, 2),
    (512, 512, 2),
    (512, 4096, 2),
    (512, 1536, 2),
)

# The contest's timed shapes; the score is the geometric mean of their mean times.
BENCH_SHAPES: tuple[BenchShape, ...] = (
    BenchShape(7168, 16384, 1, 8.622),
    BenchShape(4096, 7168, 8, 17.275),
    BenchShape(7168, 2048, 4, 4.317),
)

# Shapes outside the contest that the kernels must still get right: a single row, M one short of and one past a
# 128-row block, K that is a multiple of 64 but not of 128 or 256, and a large ragged batch.
ODD_SHAPES: tuple[tuple[int, int, int], ...] = (
    (1, 64, 1),
    (127, 192, 3),
    (129, 320, 2),
    (1000, 1024, 8),
    (127, 4096, 8),
)


class DecodeShape(NamedTuple):
    """A GEMV shape that LLM decode runs: one weight matrix (or L experts' weights) times one token's activation."""

    m: int
    k: int
    l: int  # noqa: E741
    source: str

    @property
    def mkl(self) -> tuple[int, int, int]:
        return (self.m, self.k, self.l)


# The decode suite: the contest's timed shapes, then dense and MoE-expert projections of public models. M = output
# features, K = input features, L = experts (or batched matrices) in one launch.
DECODE_SUITE: tuple[DecodeShape, ...] = tuple(DecodeShape(*s.mkl, "contest benchmark") for s in BENCH_SHAPES) + (
    DecodeShape(6144, 4096, 1, "Llama-3-8B qkv_proj"),
    DecodeShape(28672, 4096, 1, "Llama-3-8B gate_up_proj"),
    DecodeShape(4096, 14336, 1, "Llama-3-8B down_proj"),
    DecodeShape(8192, 28672, 1, "Llama-3-70B down_proj"),
    DecodeShape(5760, 2880, 1, "gpt-oss-120b expert gate_up (M, K per expert)"),
    DecodeShape(4096, 7168, 1, "the contest's 4096 x 7168 matrix, one batch"),
    DecodeShape(4096, 4096, 1, "Llama-3-8B o_proj"),
    DecodeShape(10240, 8192, 1, "Llama-3-70B qkv_proj"),
    DecodeShape(2048, 7168, 8, "DeepSeek-V3 routed experts gate/up, 8 active"),
    DecodeShape(7168, 2048, 8, "DeepSeek-V3 routed experts down, 8 active"),
    DecodeShape(1536, 2048, 8, "Qwen3-30B-A3B experts gate_up, 8 active"),
    DecodeShape(14336, 4096, 2, "Mixtral-8x7B experts w1, 2 active"),
    DecodeShape(576, 7168, 1, "DeepSeek-V3 kv_a_proj (M not a multiple of 128)"),
    DecodeShape(1536, 7168, 1, "DeepSeek-V3 q_a_proj"),
)
SUITES = {"contest": tuple(s.mkl for s in BENCH_SHAPES), "decode": tuple(s.mkl for s in DECODE_SUITE)}


def bytes_moved(m: int, k: int, l: int) -> int:  # noqa: E741
    """Bytes a GEMV must move at least: L * (A + SFA + b row 0 + SFB row 0 + C) = L*(MK/2 + MK/16 + K/2 + K/16 + 2M).

    K is a multiple of 16 for every valid problem, so each term is a whole number of bytes.
    """
    return l * (m * k // 2 + m * k // 16 + k // 2 + k // 16 + 2 * m)


def floor_us(m: int, k: int, l: int, bandwidth_bytes_per_s: float) -> float:  # noqa: E741
    """The memory-bound time floor in microseconds: bytes_moved / bandwidth."""
    if bandwidth_bytes_per_s <= 0:
        raise ValueError(f"bandwidth_bytes_per_s must be positive, got {bandwidth_bytes_per_s}")
    return bytes_moved(m, k, l) / bandwidth_bytes_per_s * 1e6
