"""The W4A16 linear over a stack of experts, routed on the device: y[s, :] = x[s / top_k] · dequant(W[ids[s]])ᵀ for
every (token, expert) slot s of a mixture-of-experts layer, in one launch.

The experts are one weight of E·N rows: expert e's row r is row e·N + r of W (E, N, K/2) and of its plain scales
(E, N, K/16 or K/32), which is how checkpoints stack them (gpt-oss's `*_blocks` [E, N, K/32, 16] are these bytes).
CTA (row tile, slot s) reads expert e = ids[s] (int32 or int64, as the router gives them) when it starts, then runs
`LinearW4A16`'s one-token kernel on rows e·N.. of that weight and x's row s / top_k (top_k = slots / tokens), and
stores y[s, rows] from the MMA's first column. The expert's global scale (NVFP4, (E,) fp32) and bias ((E, N)) are
read at e as well. Nothing is sorted, counted or synchronised on the host, so the call takes CUDA-graph capture: a
decode step with T tokens and top_k experts each is one launch of T·top_k·⌈N/rows⌉ CTAs, each expert's bytes read
once a slot (slots that share an expert read it again, from DRAM unless the L2 still holds it).

An id outside [0, E) reads expert 0's bytes and stores NaN in its slot's row: no read outside W, and no silent
answer. The sums, the K order and the split over warps are those of `LinearW4A16` with the same config.
"""

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64

from cute_kernels.compile import launch
from cute_kernels.linear_w4a16 import LinearW4A16, fake_weight_operands

ID_DTYPES = {"i32": Int32, "i64": Int64}


class Route:
    """Where one CTA's work comes from, each value formed where it is used (so the K loop holds only the expert
    id): the slot (y's row, the CTA's grid y), the token (x's row), the expert (id -1 stands for one out of range:
    expert 0's bytes, NaN stored), the expert's first row of W, and whether the id was in range."""

    def __init__(self, expert, top_k, n):
        self._e, self._top_k, self._n = expert, top_k, n

    @property
    def slot(self):
        return cute.arch.block_idx()[1]

    @property
    def token(self):
        return self.slot // self._top_k

    @property
    def expert(self):
        return cutlass.max(self._e, Int32(0))

    @property
    def row_base(self):
        return self.expert * self._n

    @property
    def valid(self):
        return self._e >= Int32(0)


class LinearW4A16Experts(LinearW4A16):
    """`LinearW4A16` with `experts`: call it as (x (T, K), W (E·N, K/2), scales (E·N, K/16 or K/32), y (T·top_k, N),
    global scales (E,) fp32, bias (E·N,), ids (T·top_k,) of the config's id dtype)."""

    @staticmethod
    def can_implement(tokens: int, slots: int, n: int, k: int, experts: int) -> bool:
        """As LinearW4A16's, with the stacked weight (E·N rows) and y of `slots` rows: every int32 offset the kernel
        forms fits (x's words T·K/2, W's E·N·K/8, y's slots·N elements)."""
        return (tokens >= 1 and slots >= 1 and n >= 1 and experts >= 1 and k >= 64 and k % 64 == 0
                and tokens * k < 2**32 and experts * n * k < 2**34 and slots * n < 2**31)

    @staticmethod
    def fake_operands(config):
        from cutlass.cute.runtime import make_fake_tensor

        tokens, slots, n = cute.sym_int(), cute.sym_int(), cute.sym_int()
        k = cute.sym_int(divisibility=64)
        xdt = cutlass.BFloat16 if config.x_dtype == "bf16" else cutlass.Float16
        x = make_fake_tensor(xdt, (tokens, k), stride=(cute.sym_int(divisibility=8), 1), assumed_align=16)
        w, sf = fake_weight_operands(cute.sym_int(), "plain", config.sf_dtype)  # E·N rows
        y = make_fake_tensor(xdt, (slots, n), stride=(cute.sym_int(), 1), assumed_align=2)
        gs = make_fake_tensor(Float32, (cute.sym_int(),), stride=(1,), assumed_align=4)
        bias = make_fake_tensor(xdt, (cute.sym_int(),), stride=(1,), assumed_align=2)
        dt = ID_DTYPES[config.experts]
        ids = make_fake_tensor(dt, (slots,), stride=(1,), assumed_align=dt.width // 8)
        return x, w, sf, y, gs, bias, ids

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mSF: cute.Tensor, mY: cute.Tensor, mGS: cute.Tensor,
                 mBias: cute.Tensor, mIds: cute.Tensor, stream=None):
        x_words, w_words, sf, m, n, k = self.views(mX, mW, mSF, mY)
        slots = mIds.shape[0]
        experts = mW.shape[0] // n
        main = self.experts_kernel(x_words, w_words, sf, mY, mGS, mBias, mIds, m, n, k, slots // m, experts)
        launch(main, self.launch_shape(slots * self.cfg.tokens_per_cta, n), stream)  # one slot a token tile

    @cute.kernel
    def experts_kernel(self, x_words: cute.Tensor, w_words: cute.Tensor, sf: cute.Tensor, mY: cute.Tensor,
                       mGS: cute.Tensor, mBias: cute.Tensor, mIds: cute.Tensor, m: Int32, n: Int32, k: Int32,
                       top_k: Int32, experts: Int32):
        _, slot, _ = cute.arch.block_idx()
        dt = ID_DTYPES[self.cfg.experts]
        raw = mIds[slot]
        valid = raw >= dt(0) and raw < dt(experts)  # in the ids' own width: an int64 id is never truncated first
        e = Int32(cutlass.select_(valid, raw, dt(-1)))
        self.body(x_words, w_words, sf, mY, mGS, mBias, m, n, k, Route(e, top_k, n))
