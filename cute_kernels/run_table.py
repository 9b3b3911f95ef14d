"""The run table of a routed experts call, made on the device in one launch: the table `LinearW4A16Experts` reads
with `expert_runs` (a CTA row a run), in place of a dozen torch kernels.

The table's contract (`nvfp4_gemv.linear.kernels.run_table` states it and keeps a torch model of it): int32 (rows,
1 + cap), row r = (expert, slot 0, ..., slot cap-1) of run r. The slots that name expert e, in slot order, are cut into
runs of `cap` (the last shorter; -1 past its end); the runs come in expert order, then the runs of the ids outside
[0, E) (expert -1); rows past the last run hold expert RUN_UNUSED. Deterministic: the same table, bit for bit, as the
torch model, whatever the order the hardware runs the threads in.

One CTA of THREADS threads, four steps with a barrier between:

    1. every thread: the table filled as unused, a bucket count zeroed for each expert and one for the bad ids
    2. every thread: each slot's bucket counted in shared memory (integer atomics: the counts do not depend on
       their order)
    3. warp 0: each bucket's first row, ⌈count / cap⌉ runs a bucket summed in bucket order (a lane's share of the
       buckets, then a warp scan)
    4. slots in order, a chunk at a time staged in shared memory by every thread, then placed 32 a round: a lane's
       rank among the slots of its bucket is the bucket's slots placed before the round plus the lanes below it with
       the same bucket (`match.any`), so the order is the slots', not the atomics'.
       - Up to 1,024 buckets (`buckets` one of SIDE_BY_SIDE_BUCKETS: E < 1024), `placers(buckets)` warps (16 up to
         512 buckets, 8 up to 1,024: their counts are COUNT_WORDS int32s, 32 KiB) place side by side. A chunk is
         SEGMENT slots a placing warp: each ranks its own segment against counts of its own (a placers × buckets
         table in shared memory), every thread then sums those counts over the warps below it, bucket by bucket,
         and every thread places its slots: ⌈SEGMENT / 32⌉ rounds a warp. (`kernels.run_table_buckets` takes this
         placement from `kernels.RUN_TABLE_SIDE_BY_SIDE_MIN_SLOTS` slots: on an H100, 0.27-0.54 of warp 0's time
         from 1,024 slots with 16 warps and 0.38-0.66 with 8, and 0.1-0.7 µs more up to 128 slots, for the counts
         zeroed and summed a chunk.)
       - Past that (`buckets` BUCKETS), the warps' counts do not fit, and warp 0 places each chunk of CHUNK slots
         alone: ⌈slots / 32⌉ dependent rounds (a few hundred cycles each; about 10 ns a slot measured on an H100).

Steps 1-3 take about (rows · (1 + cap) + slots) / THREADS stores and loads a thread and (E + 1) / 32 a lane. Up to
BUCKETS - 1 experts (the counts live in shared memory); the caller keeps the torch table past that.
"""

from dataclasses import dataclass

import cutlass
import cutlass.cute as cute
from cutlass import Int32, Uint32, const_expr

from cute_kernels.compile import SmemAllocator, launch
from cute_kernels.linear_w4a16 import MMA_COLUMNS
from cute_kernels.linear_w4a16_experts import ID_DTYPES, RUN_UNUSED, expert_key

THREADS = 512
WARPS = THREADS // 32
BUCKETS = 4096  # E + 1 (the bad ids' bucket) at most
COUNT_WORDS = 8192  # the side-by-side counts, placers × buckets int32s: 32 KiB of shared memory
SIDE_BY_SIDE_BUCKETS = (512, 1024)  # E + 1 at most for 16 and for 8 warps to place side by side
CHUNK = 2048  # slots staged in shared memory at a time where warp 0 places alone
SEGMENT = CHUNK // WARPS  # a placing warp's slots of a chunk, where warps place side by side (a chunk: placers × it)
RANK_SHIFT = 16  # a staged slot's bucket in the low bits, its rank among its warp's segment above (< SEGMENT)


@cute.jit
def bucket(mIds: cute.Tensor, j, experts):
    """Slot j's bucket: its expert, or E for an id outside [0, E)."""
    e = expert_key(mIds, j, experts)
    return Int32(cutlass.select_(e >= 0, e, experts))


def buckets_for(experts: int) -> int:
    """The bucket count for E experts: the fewest of SIDE_BY_SIDE_BUCKETS that holds E + 1 (the most warps side by
    side whose counts fit), else BUCKETS (warp 0 alone)."""
    return next((b for b in SIDE_BY_SIDE_BUCKETS if experts + 1 <= b), BUCKETS)


def placers(buckets: int) -> int:
    """The warps that place a chunk's slots side by side with `buckets` buckets (1: warp 0 alone)."""
    return COUNT_WORDS // buckets if buckets in SIDE_BY_SIDE_BUCKETS else 1


@dataclass(frozen=True)
class RunTableConfig:
    """The cache key of one compiled table maker."""

    ids: str = "i64"  # the ids' dtype: "i32" or "i64"
    cap: int = MMA_COLUMNS  # slots a run at most (the experts kernel's token tile)
    buckets: int = BUCKETS  # E + 1 at most: one of SIDE_BY_SIDE_BUCKETS (warps side by side) or BUCKETS (warp 0)

    def __post_init__(self):
        if self.ids not in ID_DTYPES:
            raise ValueError(f"ids must be one of {sorted(ID_DTYPES)}, got {self.ids!r}")
        if not 1 <= self.cap <= 32:
            raise ValueError(f"cap must be 1 to 32, got {self.cap}")
        if self.buckets not in (*SIDE_BY_SIDE_BUCKETS, BUCKETS):
            raise ValueError(f"buckets must be one of {(*SIDE_BY_SIDE_BUCKETS, BUCKETS)}, got {self.buckets}")


class RunTable:
    """Call it as (ids (slots,) contiguous, table (rows, 1 + cap) int32 contiguous, E): writes every element of the
    table (rows from `kernels.run_table_rows`, the most runs there can be)."""

    def __init__(self, config: RunTableConfig, target=None):
        self.cfg = config

    @staticmethod
    def can_implement(slots: int, experts: int) -> bool:
        """At least one slot, 1 to BUCKETS - 1 experts, and the table's elements and the slots within int32."""
        return slots >= 1 and 1 <= experts < BUCKETS and slots < 2**31 // 64

    @staticmethod
    def fake_operands(config: RunTableConfig):
        from cutlass.cute.runtime import make_fake_tensor

        dt = ID_DTYPES[config.ids]
        width = 1 + config.cap
        ids = make_fake_tensor(dt, (cute.sym_int(),), stride=(1,), assumed_align=dt.width // 8)
        table = make_fake_tensor(Int32, (cute.sym_int(), width), stride=(width, 1), assumed_align=4)
        return ids, table, Int32(1)

    @cute.jit
    def __call__(self, mIds: cute.Tensor, mTable: cute.Tensor, experts: Int32, stream=None):
        launch(self.kernel(mIds, mTable, experts), dict(grid=[1, 1, 1], block=[THREADS, 1, 1]), stream)

    @cute.kernel
    def kernel(self, mIds: cute.Tensor, mTable: cute.Tensor, experts: Int32):
        # The routed kernel that reads the table is launched programmatically dependent on this one: it may start now,
        # and waits (griddepcontrol.wait) until this grid has finished and its stores are visible.
        cute.arch.griddepcontrol_launch_dependents()
        cap = self.cfg.cap
        width = 1 + cap
        tidx, _, _ = cute.arch.thread_idx()
        warp, lane = tidx // 32, cute.arch.lane_idx()
        slots, rows = mIds.shape[0], mTable.shape[0]
        buckets = self.cfg.buckets
        warps = placers(buckets)
        parallel = const_expr(warps > 1)
        chunk = warps * SEGMENT if parallel else CHUNK
        smem = SmemAllocator()
        count = smem.allocate_tensor(Int32, cute.make_layout(buckets), 16)  # a bucket's slots (step 4: placed)
        first = smem.allocate_tensor(Int32, cute.make_layout(buckets), 16)  # a bucket's first row
        keys = smem.allocate_tensor(Int32, cute.make_layout(chunk), 16)
        # the side by side placement's counts: a warp's slots of a bucket in its segment, then the rank of its first
        warp_count = None
        if const_expr(parallel):
            warp_count = smem.allocate_tensor(Int32, cute.make_layout((warps, buckets), stride=(buckets, 1)), 16)

        # 1. the table unused, the counts zero
        i = tidx
        while i < rows * width:
            r = i // width
            c = i - r * width
            mTable[r, c] = Int32(cutlass.select_(c == 0, Int32(RUN_UNUSED), Int32(-1)))
            i = i + THREADS
        b = tidx
        while b <= experts:
            count[b] = Int32(0)
            b = b + THREADS
        cute.arch.sync_threads()

        # 2. the counts
        j = tidx
        while j < slots:
            cute.arch.atomic_add(count.iterator + bucket(mIds, j, experts), Int32(1))
            j = j + THREADS
        cute.arch.sync_threads()

        # 3. each bucket's first row: a lane's share of the buckets in order, then an exclusive warp scan
        if warp == 0:
            share = (experts + 32) // 32  # ⌈(E + 1) / 32⌉
            lo = lane * share
            hi = cutlass.min(lo + share, experts + 1)
            runs = Int32(0)
            b = lo
            while b < hi:
                runs = runs + (count[b] + (cap - 1)) // cap
                b = b + 1
            total = runs
            for d in cutlass.range_constexpr(5):
                up = cute.arch.shuffle_sync_up(total, 1 << d)
                if lane >= (1 << d):
                    total = total + up
            row = total - runs
            b = lo
            while b < hi:
                first[b] = row
                row = row + (count[b] + (cap - 1)) // cap
                count[b] = Int32(0)
                b = b + 1
        cute.arch.sync_threads()

        # 4. the slots in order, a chunk at a time
        base = Int32(0)
        while base < slots:
            n = cutlass.min(slots - base, Int32(chunk))
            j = tidx
            while j < n:
                keys[j] = bucket(mIds, base + j, experts)
                j = j + THREADS
            if const_expr(parallel):
                b = tidx
                while b <= experts:
                    for w in cutlass.range_constexpr(warps):
                        warp_count[w, b] = Int32(0)
                    b = b + THREADS
            cute.arch.sync_threads()
            if const_expr(parallel):
                # each placing warp ranks its segment of the chunk among its own slots of each bucket
                seg = warp * SEGMENT  # warps past the placers have none: their segment starts at or past the chunk
                rank_rounds(keys, warp_count, warp, lane, seg, cutlass.min(n, seg + SEGMENT))
                cute.arch.sync_threads()
                # a bucket's count before each warp's segment, and after the chunk
                b = tidx
                while b <= experts:
                    before = count[b]
                    for w in cutlass.range_constexpr(warps):
                        mine = warp_count[w, b]
                        warp_count[w, b] = before
                        before = before + mine
                    count[b] = before
                    b = b + THREADS
                cute.arch.sync_threads()
                j = tidx
                while j < n:
                    key = keys[j] & ((1 << RANK_SHIFT) - 1)
                    place(mTable, first, key, warp_count[j // SEGMENT, key] + (keys[j] >> RANK_SHIFT), base + j,
                          experts, cap)
                    j = j + THREADS
            else:
                if warp == 0:
                    rank_rounds(keys, count, warp, lane, Int32(0), n, mTable, first, base, experts, cap)
            cute.arch.sync_threads()  # keys are restaged
            base = base + chunk


@cute.jit
def place(mTable: cute.Tensor, first: cute.Tensor, key, rank, slot, experts, cap: cutlass.Constexpr):
    """Slot `slot` of bucket `key` at `rank` among its bucket's slots: its run's row and column, and the row's expert
    where the slot opens the run."""
    r = first[key] + rank // cap
    c = rank - (rank // cap) * cap
    mTable[r, 1 + c] = slot
    if c == 0:
        mTable[r, 0] = Int32(cutlass.select_(key == experts, Int32(-1), key))


@cute.jit
def rank_rounds(keys: cute.Tensor, counts: cute.Tensor, warp, lane, lo, hi, mTable=None, first=None, base=None,
                experts=None, cap: cutlass.Constexpr = 0):
    """One warp's slots keys[lo:hi] in rounds of 32, in order: a lane's rank is its bucket's count so far
    (counts[warp, key], or counts[key] with no table of warps) plus the lanes below it with the same bucket. With
    mTable the slot is placed at once (warp 0 alone, counts the buckets' own); else its rank is kept in its key's
    high bits, for `place` once every warp's counts are summed."""
    o = lo
    while o < hi:
        valid = o + lane < hi
        # a lane past the slots takes a bucket of its own (BUCKETS + lane): it matches no other
        key = Int32(BUCKETS) + lane
        if valid:
            key = keys[o + lane]
        peers = Uint32(cute.arch.match_sync(Uint32(0xFFFFFFFF), key))
        below = Int32(cute.arch.popc(peers & cute.arch.lanemask_lt()))
        last = below == Int32(cute.arch.popc(peers)) - 1
        rank = Int32(0)
        if const_expr(mTable is None):
            if valid:
                rank = counts[warp, key] + below
            cute.arch.sync_warp()  # every lane has read its bucket's count before the last peer moves it
            if valid:
                if last:
                    counts[warp, key] = rank + 1
                keys[o + lane] = key + (rank << RANK_SHIFT)
        else:
            if valid:
                rank = counts[key] + below
            cute.arch.sync_warp()
            if valid:
                if last:
                    counts[key] = rank + 1
                place(mTable, first, key, rank, base + o + lane, experts, cap)
        cute.arch.sync_warp()
        o = o + 32
