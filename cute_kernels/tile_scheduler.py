"""Deterministic K-balanced split schedule for the batched GEMV: (M tiles x L) output tiles, each K-split over CTAs.

The work is the list of (output tile, K tile) pairs, output tile t = l * m_tiles + m_tile, K fastest:
w = t * k_tiles + k. CTA g of G owns the contiguous run [floor(g*W/G), floor((g+1)*W/G)) of W = tiles * k_tiles,
so every CTA reads the same number of K tiles (to within one) whatever the shape. A run cut by tile borders
gives segments; a tile covered by more than one CTA is finished by the last CTA to arrive, which adds the fp32
partials in CTA order (a fixed order, so results are bit-identical run to run; no float atomics).

Every function here is plain integer arithmetic (`//`, `%`, `*`, `+` and a `minimum` callable) so the same
formulas run on Python ints on the host and on `cutlass.Int32` values inside the kernel.
"""

from __future__ import annotations

TILE_M = 128
PARTIAL_SLOTS = 2  # partial segments a CTA can leave: the head of its run and the tail
MIN_K_TILES_PER_CTA = 4  # a split never gives a CTA fewer K tiles: a tile's fan-in is at most (k_tiles - 1) // 4 + 2


def ceil_div(a, b):
    return (a + b - 1) // b


def num_m_tiles(m, tile_m=TILE_M):
    return ceil_div(m, tile_m)


def num_output_tiles(m, l, tile_m=TILE_M):
    return num_m_tiles(m, tile_m) * l


def output_tile_coord(tile, m_tiles):
    """(m_tile, l) of output tile `tile` (tiles run batch-major, so neighbours share a batch)."""
    return tile % m_tiles, tile // m_tiles


def effective_ctas(num_ctas, total_work, minimum=min):
    """The CTAs that get work: at most one per work item. With more CTAs than work items some runs would be empty,
    and a tile would count a CTA that never arrives among its contributors; those CTAs get no work instead."""
    return minimum(num_ctas, total_work)


def cta_work_begin(cta, num_ctas, total_work):
    """First work item of `cta`; `cta_work_begin(cta + 1, ...)` is one past its last."""
    return (cta * total_work) // num_ctas


def cta_run(cta, num_ctas, total_work, minimum=min):
    """[begin, end) of `cta`'s work under the effective CTA count: empty (at the end of the work) for a CTA past it."""
    g = effective_ctas(num_ctas, total_work, minimum)
    return (cta_work_begin(minimum(cta, g), g, total_work), cta_work_begin(minimum(cta + 1, g), g, total_work))


def cta_of_work(w, num_ctas, total_work):
    """The CTA whose run holds work item `w` (inverse of `cta_work_begin`)."""
    return ((w + 1) * num_ctas - 1) // total_work


def next_segment(w, w_end, k_tiles, minimum=min):
    """Segment of a run that starts at work item `w` (w < w_end): (tile, k_begin, k_end, next w)."""
    tile = w // k_tiles
    seg_end = minimum(w_end, (tile + 1) * k_tiles)
    return tile, w - tile * k_tiles, seg_end - tile * k_tiles, seg_end


def tile_first_cta(tile, k_tiles, num_ctas, total_work):
    return cta_of_work(tile * k_tiles, num_ctas, total_work)


def tile_last_cta(tile, k_tiles, num_ctas, total_work):
    return cta_of_work((tile + 1) * k_tiles - 1, num_ctas, total_work)


def partial_slot(cta, tile, k_tiles, num_ctas, total_work, minimum=min):
    """Workspace slot of `cta`'s partial for `tile`: 0 where its run starts, 1 for the tile where it ends."""
    first_tile = cta_work_begin(cta, num_ctas, total_work) // k_tiles
    return minimum(tile - first_tile, 1)


def partial_offset(cta, slot, row, tile_m=TILE_M):
    """Index of (cta, slot, row) in the fp32 partial workspace of shape (num_ctas, PARTIAL_SLOTS, tile_m)."""
    return (cta * PARTIAL_SLOTS + slot) * tile_m + row


def workspace_elems(num_ctas, tile_m=TILE_M):
    return num_ctas * PARTIAL_SLOTS * tile_m


def choose_num_ctas(m, k, l, num_sms, tile_k, tile_m=TILE_M, min_k_tiles=MIN_K_TILES_PER_CTA):
    """Grid size: one CTA per SM, each with at least `min_k_tiles` K tiles of work (bounding how many CTAs share a
    tile, and so the finishing CTA's fan-in), and never fewer than one."""
    total = num_output_tiles(m, l, tile_m) * num_k_tiles(k, tile_k)
    return max(1, min(num_sms, total // min_k_tiles))


def num_k_tiles(k, tile_k):
    return ceil_div(k, tile_k)


def cta_segments(cta, num_ctas, m, k, l, tile_k, tile_m=TILE_M):
    """Host view of `cta`'s segments: a list of (tile, k_begin, k_end, num_contributors, slot)."""
    k_tiles = num_k_tiles(k, tile_k)
    total = num_output_tiles(m, l, tile_m) * k_tiles
    w, w_end = cta_run(cta, num_ctas, total)
    num_ctas = effective_ctas(num_ctas, total)
    out = []
    while w < w_end:
        tile, k0, k1, w = next_segment(w, w_end, k_tiles)
        first = tile_first_cta(tile, k_tiles, num_ctas, total)
        last = tile_last_cta(tile, k_tiles, num_ctas, total)
        out.append((tile, k0, k1, last - first + 1, partial_slot(cta, tile, k_tiles, num_ctas, total)))
    return out
