"""The W4A16 linear over a stack of experts, routed on the device: y[s, :] = x[s / top_k] · dequant(W[ids[s]])ᵀ for
every (token, expert) slot s of a mixture-of-experts layer, in one launch.

The experts are one weight of E·N rows: expert e's row r is row e·N + r of W (E, N, K/2) and of its plain scales
(E, N, K/16 or K/32), which is how checkpoints stack them (gpt-oss's `*_blocks` [E, N, K/32, 16] are these bytes).
CTA (row tile, slot s) reads expert e = ids[s] (int32 or int64, as the router gives them) when it starts, then runs
`LinearW4A16`'s one-token kernel on rows e·N.. of that weight. The expert's global scale (NVFP4, (E,) fp32) and bias
((E, N)) are read at e as well.

Slots that share an expert (`expert_group`, dispatched by `kernels.expert_group_for`): the slots naming e, in slot
order, are cut into runs of one token tile (8 MMA columns). Each warp of the CTA of slot s scans the ids, 32 a round
with a ballot (`scan_group`): if s begins a run, the CTA computes the run's slots in its MMA columns, x's row s' / top_k
in column j for the run's slot s', and stores y[s', rows]; else it goes on. So the expert's bytes are read once a run,
not once a slot, and the result of a slot does not depend on which others share its run (each MMA column is summed on
its own, in the same K order). The scan stops at s where s begins no run, and at the run's end where it does: up to
⌈slots / 32⌉ rounds a warp. A CTA row takes slots/E of the slots (1 to 8; `slots_per_cta`), strided over the grid's
rows, so that where runs are long the CTAs of slots that begin none are fewer. Without groups, CTA s computes slot s
alone, in the first column (slots that share an expert read it again, from DRAM unless the L2 still holds it).

The same runs from a table (`expert_runs`): `kernels.run_table` counts and places the ids on the device (torch ops,
or one launch of `cute_kernels.run_table` where `kernels.RUN_TABLE_KERNEL` is on; no sync) into a row a run,
(expert, its slots), and CTA row r computes row r; rows past the last run (the table has as many as there can be
runs) exit. No scan, whose cost grows with the slots each CTA reads, and the runs of one expert sit on neighbouring
CTA rows. The slots of a run and their columns are the scan's, so the results are the same bits. A tabled run may
also be two token tiles (`token_tiles` 2: up to 16 slots, the table 1 + 16 wide), so that an expert with more than 8
slots is read half as often; each MMA column is still summed on its own, so the bits are again the same. A run of
two tiles whose second holds no slot (an expert with 8 or fewer) is computed by the one-tile body, so that its CTA
neither loads x for nor multiplies the empty tile (the kernel holds both bodies; a CTA takes one).

Nothing is sorted, counted or synchronised on the host, so the call takes CUDA-graph capture: a decode step with T
tokens and top_k experts each is one launch of at most T·top_k·⌈N/rows⌉ CTAs (with a run table, the table's
kernels before it). An id outside [0, E) reads expert 0's bytes and stores NaN in its slot's row (such ids form a
group of their own): no read outside W, and no silent answer. The sums, the K order and the split over warps are
those of `LinearW4A16` with the same config.
"""

import dataclasses

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Int64, Uint32, const_expr

from cute_kernels.compile import launch
from cute_kernels.linear_w4a16 import SF_DTYPES, LinearW4A16

ID_DTYPES = {"i32": Int32, "i64": Int64}
RUN_UNUSED = -2  # a run table row's expert where the row holds no run (the table has rows for the most runs)


class Route:
    """Where one CTA's work comes from, each value formed where it is used (so the K loop holds only the expert
    id and the slot, or with groups the two slots this lane stores): the expert (id -1 stands for one out of range:
    expert 0's bytes, NaN stored), the expert's first row of W, whether the id was in range, this lane's token (x's
    row of its MMA column) and the slot (y's row) of each of its two output columns 2c, 2c + 1 (-1 where it stores
    none).

    One slot (`tiles` None): `slot` in the first column, its token in every column. With a run (`scan_group`'s, or a
    run table's row): each token tile's (this lane's token slot, its two output slots) from `lane_slots`, the run's
    first slot `slot`."""

    def __init__(self, expert, top_k, n, kp, slot, tiles=None):
        self._e, self._top_k, self._n, self._kp, self._slot, self._tiles = expert, top_k, n, kp, slot, tiles

    @property
    def expert(self):
        return cutlass.max(self._e, Int32(0))

    @property
    def row_base(self):
        return self.expert * self._n

    @property
    def valid(self):
        return self._e >= Int32(0)

    def token_of(self, t: int):
        """x's row of this lane's MMA column in token tile t."""
        return (self._slot if self._tiles is None else self._tiles[t][0]) // self._top_k

    def slot_of(self, b: int, t: int):
        """y's row for this lane's output column 2c + b of token tile t, or -1."""
        if const_expr(self._tiles is not None):
            return self._tiles[t][1 + b]
        c = cute.arch.lane_idx() % 4
        return Int32(cutlass.select_((2 * c + b) // self._kp == 0, self._slot, Int32(-1)))


@cute.jit
def nth_set_bit(mask, n):
    """The position of set bit n (0 the lowest) of `mask`, which has more than n: the largest p with at most n set
    bits below it, by a binary search of five popcounts (straight-line; `fns.b32` is a branching sequence on sm_90)."""
    pos = Int32(0)
    for step in cutlass.range_constexpr(4, -1, -1):
        probe = pos + (1 << step)
        below = Int32(cute.arch.popc(Uint32(mask) << Uint32(32 - probe)))  # the bits below probe (1 <= probe < 32)
        pos = Int32(cutlass.select_(below <= n, probe, pos))
    return pos


def lane_slots(member, first, kp: int):
    """(this lane's token slot, its two output slots) of a run whose column j holds slot member(j) (-1 past the run's
    end): column r / kp's slot, or `first` past the end (a repeated column, never stored), and the slots of output
    columns (2c + b) / kp (or -1). The one lane-to-column map of a group, whether the run was scanned or tabled."""
    lane = cute.arch.lane_idx()
    c = lane % 4
    s_tok = member(lane // 4 // kp)
    return Int32(cutlass.select_(s_tok >= 0, s_tok, first)), member((2 * c) // kp), member((2 * c + 1) // kp)


def table_route(mTable, row, e, first, top_k, n, kp: int, tile_tokens: int, tiles: int) -> Route:
    """The route of run table row `row` (expert e, first slot `first`) over its first `tiles` token tiles."""
    return Route(e, top_k, n, kp, first, [lane_slots(lambda j, t=t: mTable[row, 1 + tile_tokens * t + j], first, kp)
                                          for t in range(tiles)])


@cute.jit
def expert_key(mIds: cute.Tensor, j, experts):
    """Slot j's expert id as the kernel takes it: in [0, E), or -1 for an id outside (compared in the ids' own width,
    so an int64 id is never truncated first)."""
    dt = mIds.element_type
    raw = mIds[j]
    return Int32(cutlass.select_(raw >= dt(0) and raw < dt(experts), raw, dt(-1)))


@cute.jit
def scan_group(mIds: cute.Tensor, slot, key, experts, cap: int, kp: int):
    """A warp's scan of the ids for the group of slot `slot` (expert `key`): the slots with that expert in slot order,
    cut into runs of `cap` (a token tile). Returns (leads, (this lane's token slot, its two output slots)): whether
    `slot` begins a run (its CTA computes the run; the others go on), this lane's MMA column's slot (r / kp of the
    run, or `slot` past the run's end: a repeated column, never stored) and the slots of its output columns
    (2c + b) / kp (or -1). Every lane and warp gets the same answer (ballots over 32 ids a round, deterministic).
    The scan stops at the end of the run, or at `slot` when it begins none."""
    lane = cute.arch.lane_idx()
    slots = mIds.shape[0]
    found = Int32(-1)  # lane l: the slot of the run's member l % cap (-1: the run has fewer)
    rank = Int32(0)  # matches before `slot`
    seen = Int32(0)  # matches in the rounds before this one
    base = Int32(0)
    going = True
    while going:
        j = base + lane
        kj = Int32(-2)
        if j < slots:
            kj = expert_key(mIds, j, experts)
        m = Uint32(cute.arch.vote_ballot_sync(kj == key))
        below = slot - base  # this round's ids before `slot`: the lowest `below` bits, clamped to 0..32
        lows = (Uint32(1) << Uint32(cutlass.min(cutlass.max(below, Int32(0)), Int32(31)))) - Uint32(1)
        rank = rank + Int32(cute.arch.popc(Uint32(cutlass.select_(below >= 32, Uint32(0xFFFFFFFF), lows)) & m))
        count = Int32(cute.arch.popc(m))
        if below < 32:  # `slot` is in this round or an earlier one: rank is final
            n = rank - seen + lane % cap  # member lane % cap of the run is match n of this round
            if n >= 0 and n < count:
                found = base + nth_set_bit(m, n)
        seen = seen + count
        base = base + 32
        going = base < slots and (below >= 32 or (rank % cap == 0 and seen - rank < cap))
    return rank % cap == 0, lane_slots(lambda j: cute.arch.shuffle_sync(found, j), slot, kp)


class LinearW4A16Experts(LinearW4A16):
    """`LinearW4A16` with `experts`: call it as (x (T, K), W (E, N, K/2), scales (E, N, K/16 or K/32), y (T, top_k,
    N), global scales (E,) fp32, bias (E, N), ids (T, top_k) of the config's id dtype), each as the caller holds it
    (W, scales, y and ids contiguous): the kernel views the stacked experts as one weight of E·N rows and the ids and
    y by slot, so a call makes no torch views."""

    def __init__(self, config, target=None):
        super().__init__(config, target)
        # a tabled run of two tiles whose second holds no slot: the one-tile kernel's body, the same split
        self.one_tile = None
        if config.expert_runs and config.token_tiles > 1:
            self.one_tile = type(self)(dataclasses.replace(config, token_tiles=1), target)

    @staticmethod
    def can_implement(tokens: int, slots: int, n: int, k: int, experts: int) -> bool:
        """As LinearW4A16's, with the stacked weight (E·N rows) and y of `slots` rows: every int32 offset the kernel
        forms fits (x's words T·K/2, W's E·N·K/8, y's slots·N elements)."""
        return (tokens >= 1 and slots >= 1 and n >= 1 and experts >= 1 and k >= 64 and k % 64 == 0
                and tokens * k < 2**32 and experts * n * k < 2**34 and slots * n < 2**31)

    @staticmethod
    def fake_operands(config):
        from cutlass.cute.runtime import make_fake_tensor

        tokens, top_k, n, experts = cute.sym_int(), cute.sym_int(), cute.sym_int(), cute.sym_int()
        k = cute.sym_int(divisibility=64)
        xdt = cutlass.BFloat16 if config.x_dtype == "bf16" else cutlass.Float16
        x = make_fake_tensor(xdt, (tokens, k), stride=(cute.sym_int(divisibility=8), 1), assumed_align=16)
        kb, cols = cute.sym_int(divisibility=32), cute.sym_int(divisibility=2)
        w = make_fake_tensor(cutlass.Uint8, (experts, n, kb), stride=(cute.sym_int(), kb, 1), assumed_align=16)
        sf = make_fake_tensor(SF_DTYPES[config.sf_dtype], (experts, n, cols), stride=(cute.sym_int(), cols, 1),
                              assumed_align=16)
        y = make_fake_tensor(xdt, (tokens, top_k, n), stride=(cute.sym_int(), cute.sym_int(), 1), assumed_align=2)
        gs = make_fake_tensor(Float32, (cute.sym_int(),), stride=(1,), assumed_align=4)
        bias = make_fake_tensor(xdt, (cute.sym_int(), cute.sym_int()), stride=(cute.sym_int(), 1), assumed_align=2)
        dt = ID_DTYPES[config.experts]
        if config.expert_runs:  # the run table (rows, 1 + the CTA's tokens): a row's expert, then its slots
            width = 1 + config.tokens_per_cta
            ids = make_fake_tensor(dt, (cute.sym_int(), width), stride=(width, 1), assumed_align=dt.width // 8)
        else:
            ids = make_fake_tensor(dt, (tokens, top_k), stride=(cute.sym_int(), 1), assumed_align=dt.width // 8)
        return x, w, sf, y, gs, bias, ids

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mSF: cute.Tensor, mY: cute.Tensor, mGS: cute.Tensor,
                 mBias: cute.Tensor, mIds: cute.Tensor, stream=None):
        tokens, top_k, n = mY.shape
        slots = tokens * top_k
        y = cute.make_tensor(mY.iterator, cute.make_layout((slots, n), stride=(n, 1)))  # y by slot (contiguous)
        x_words, w_words, sf, m, n, k = self.views(mX, mW, mSF, y)  # W and scales: expert e's row r at e·N + r
        bias = cute.make_tensor(mBias.iterator, cute.make_layout((mBias.shape[0] * mBias.shape[1],), stride=(1,)))
        if const_expr(self.cfg.expert_runs):
            ids = mIds  # the run table: a CTA row a table row
            rows = mIds.shape[0]
        else:
            ids = cute.make_tensor(mIds.iterator, cute.make_layout((slots,), stride=(1,)))
            per_cta = self.slots_per_cta(slots, mW.shape[0])
            rows = (slots + per_cta - 1) // per_cta
        main = self.experts_kernel(x_words, w_words, sf, y, mGS, bias, ids, m, n, k, top_k, mW.shape[0])
        shape = self.launch_shape(rows * self.cfg.tokens_per_cta, n)  # a CTA row: one token tile
        if const_expr(self.cfg.expert_runs):
            # Programmatic dependent launch: the grid starts while the run table's one CTA (launched just before, on
            # the same stream) is still working, and each CTA waits for it before reading the table.
            shape = dict(shape, use_pdl=True)
        launch(main, shape, stream)

    def slots_per_cta(self, slots, experts):
        """Slots a CTA row takes, y, y + rows, y + 2 rows, ... (rows: the grid's): one without groups; with groups,
        the slots an expert has on average (slots / E, 1 to 8), so that where runs are long the CTAs of the slots
        that begin none are that many fewer, and a CTA row still meets about one run's first slot (strided: a
        router's first slots of each expert come early)."""
        if const_expr(not self.cfg.expert_group):
            return 1
        return cutlass.min(cutlass.max(slots // cutlass.max(experts, 1), 1), self.cfg.tile_tokens)

    @cute.kernel
    def experts_kernel(self, x_words: cute.Tensor, w_words: cute.Tensor, sf: cute.Tensor, mY: cute.Tensor,
                       mGS: cute.Tensor, mBias: cute.Tensor, mIds: cute.Tensor, m: Int32, n: Int32, k: Int32,
                       top_k: Int32, experts: Int32):
        _, row, _ = cute.arch.block_idx()
        kp = self.cfg.k_parts
        if const_expr(self.cfg.expert_runs):
            cute.arch.griddepcontrol_wait()  # the table (and what came before it on the stream) is complete
            e = mIds[row, 0]
            if e != Int32(RUN_UNUSED):
                first = mIds[row, 1]
                tt, tiles = self.cfg.tile_tokens, self.cfg.token_tiles
                if const_expr(self.one_tile is not None):
                    if mIds[row, 1 + tt] < Int32(0):  # the second tile holds no slot
                        self.one_tile.body(x_words, w_words, sf, mY, mGS, mBias, m, n, k,
                                           table_route(mIds, row, e, first, top_k, n, kp, tt, 1))
                    else:
                        self.body(x_words, w_words, sf, mY, mGS, mBias, m, n, k,
                                  table_route(mIds, row, e, first, top_k, n, kp, tt, tiles))
                else:
                    self.body(x_words, w_words, sf, mY, mGS, mBias, m, n, k,
                              table_route(mIds, row, e, first, top_k, n, kp, tt, tiles))
        elif const_expr(self.cfg.expert_group):
            slots = mIds.shape[0]
            _, rows, _ = cute.arch.grid_dim()
            per_cta = self.slots_per_cta(slots, experts)
            i = Int32(0)
            while i < per_cta:
                slot = row + i * rows
                if slot < slots:
                    e = expert_key(mIds, slot, experts)
                    leads, group = scan_group(mIds, slot, e, experts, self.cfg.tile_tokens, kp)
                    if leads:
                        self.body(x_words, w_words, sf, mY, mGS, mBias, m, n, k,
                                  Route(e, top_k, n, kp, slot, [group]))
                        cute.arch.sync_threads()  # the next run's sums reuse the shared memory
                i = i + 1
        else:
            e = expert_key(mIds, row, experts)
            self.body(x_words, w_words, sf, mY, mGS, mBias, m, n, k, Route(e, top_k, n, kp, row))
