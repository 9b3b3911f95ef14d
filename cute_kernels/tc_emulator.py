"""A host emulator of the sm_100a GEMV's operand path (cute_kernels.gemv_tc_sm100), built from the layouts the kernel
itself builds, evaluated on the CPU.

`trace(config, m, k, l)` runs the kernel's own `data_path` and `tma_partitions` at trace time (a compile of a
function that launches nothing) on fake tensors of a static shape and keeps the layouts as CuTe prints them:
- each TMA box's global coordinates for every (M tile, K tile, batch), and the shared-memory offsets it fills;
- the shared-memory layout the MMAs' descriptors are made from, with its swizzle;
- the MMA's own (row, K) coordinates of each operand value.
`operands(traced, a, b, mt, kt, l)` then moves fp4 codes as the hardware would: global → TMA box → (swizzled)
shared memory → what each of the stage's MMAs multiplies, and returns the 128 × tile_k A tile and the N × tile_k
b tile the MMAs see. A stride changed anywhere on that path makes these differ from the true tiles.

The scale factors' path into tensor memory and the epilogue are not emulated here.
"""

from __future__ import annotations

import re

import cutlass
import cutlass.cute as cute
import numpy as np

_SWIZZLE = re.compile(r"^S<(\d+),(\d+),(\d+)> o (\d+) o (.*)$")


# ---------------------------------------------------------------- CuTe layout text -> numpy


def _parse_tuple(text: str):
    """'((256,128),1)' -> nested tuples of ints or (value, mode) pairs for strides such as '128@1'."""
    pos = 0

    def item():
        nonlocal pos
        if text[pos] == "(":
            pos += 1
            out = []
            while text[pos] != ")":
                out.append(item())
                if text[pos] == ",":
                    pos += 1
            pos += 1
            return tuple(out)
        m = re.match(r"-?\d+(@\d+)*", text[pos:])
        tok = m.group(0)
        pos += len(tok)
        if "@" in tok:
            value, *modes = tok.split("@")
            return (int(value), tuple(int(x) for x in modes))
        return int(tok)

    return item()


def parse_layout(text: str):
    """(swizzle (B, M, S) or None, offset, shape, stride) of a printed CuTe layout or composed layout."""
    text = text.replace(" ", "") if not text.startswith("S<") else text
    swz, offset = None, 0
    m = _SWIZZLE.match(text)
    if m:
        swz = tuple(int(x) for x in m.groups()[:3])
        offset = int(m.group(4))
        text = m.group(5).replace(" ", "")
    shape_text, stride_text = text.split(":")
    return swz, offset, _parse_tuple(shape_text), _parse_tuple(stride_text)


def _flatten(shape, stride):
    if isinstance(shape, tuple):
        pairs = []
        for s, d in zip(shape, stride):
            pairs.extend(_flatten(s, d))
        return pairs
    return [(shape, stride)]


def evaluate(shape, stride, rank: int = 3):
    """The layout at every linear index (first mode fastest): int offsets, or (size, rank) coordinates where the
    strides are scaled bases (value@mode)."""
    pairs = _flatten(shape, stride)
    size = int(np.prod([s for s, _ in pairs]))
    idx = np.arange(size, dtype=np.int64)
    basis = any(isinstance(d, tuple) for _, d in pairs)
    out = np.zeros((size, rank) if basis else size, dtype=np.int64)
    div = 1
    for s, d in pairs:
        c = (idx // div) % s
        div *= s
        if isinstance(d, tuple):
            value, modes = d
            out[:, modes[0]] += c * value
        elif basis:
            if d != 0:
                raise ValueError("an integer stride in a coordinate layout")
        else:
            out += c * d
    return out


def swizzle(offsets, swz):
    """CuTe's Swizzle<B, M, S>: XOR bits [M + S, M + S + B) into bits [M, M + B)."""
    if swz is None:
        return offsets
    b, m, s = swz
    mask = ((1 << b) - 1) << (m + s)
    return offsets ^ ((offsets & mask) >> s)


def mode_sizes(shape):
    return [int(np.prod([x for x, _ in _flatten(s, s)])) for s in shape]


# ---------------------------------------------------------------- tracing the kernel's own layouts


def trace(config, m: int, k: int, l: int, rows_b: int = 128) -> dict:  # noqa: E741
    """The operand-path layouts of `GemvTcSm100(config)` for static (M, K, L), as CuTe prints them."""
    from cute_kernels import gemv_tc_sm100 as tc
    from cute_kernels.targets import target

    kernel = tc.GemvTcSm100(config, target("sm_100a"))
    out: dict = {}

    class _Probe:
        @cute.jit
        def __call__(self, mA: cute.Tensor, mB: cute.Tensor, mSFA: cute.Tensor, mSFB: cute.Tensor):
            (tiled_mma, tiled_mma_sfb, a_smem, b_smem, sfa_smem, sfb_smem, tma_atom_a, tma_a, tma_atom_b, tma_b,
             tma_atom_sfa, tma_sfa, tma_atom_sfb, tma_sfb) = kernel.data_path(mA, mB, mSFA, mSFB)
            smem = cute.AddressSpace.smem
            f4, f8 = cutlass.Float4E2M1FN, cutlass.Float8E4M3FN
            sA = cute.make_tensor(cute.make_ptr(f4, 1024, smem, assumed_align=1024), a_smem)
            sB = cute.make_tensor(cute.make_ptr(f4, 1024, smem, assumed_align=1024), b_smem)
            sSFA = cute.make_tensor(cute.make_ptr(f8, 1024, smem, assumed_align=128), sfa_smem)
            sSFB = cute.make_tensor(cute.make_ptr(f8, 1024, smem, assumed_align=128), sfb_smem)
            (tAsA, tAgA), (tBsB, tBgB), _, _ = kernel.tma_partitions(
                tiled_mma, tiled_mma_sfb, tma_atom_a, tma_a, tma_atom_b, tma_b, tma_atom_sfa, tma_sfa,
                tma_atom_sfb, tma_sfb, sA, sB, sSFA, sSFB,
            )
            thr = tiled_mma.get_slice(0)
            tile_k = kernel.mma_tiler[2]
            out.update(
                tma_a=str(tma_a.layout), tma_b=str(tma_b.layout),
                tAgA=str(tAgA.layout), tAsA=str(tAsA.layout), tBgB=str(tBgB.layout), tBsB=str(tBsB.layout),
                a_smem=str(a_smem), b_smem=str(b_smem),
                mma_a=str(thr.partition_A(cute.make_identity_tensor((kernel.mma_tiler[0], tile_k))).layout),
                mma_b=str(thr.partition_B(cute.make_identity_tensor((kernel.mma_tiler[1], tile_k))).layout),
            )  # fmt: skip

    # A static extent of 1 prints with stride 0, which would make every row of a TMA box read row 0; the kernel is
    # compiled with dynamic extents, where that cannot happen. M >= 2 traces the same tiles.
    a, b, sfa, sfb, *_ = tc.fake_arguments(max(m, 2), k, l, rows_b=rows_b)
    cute.compile(_Probe(), a, b, sfa, sfb, options="--gpu-arch sm_100a")
    out["tile"] = (kernel.mma_tiler, kernel.num_kblocks)
    return out


# ---------------------------------------------------------------- moving the bytes


def _axis_of(tma_text: str) -> list[int]:
    """For the logical dims (row, K, batch) of a TMA view, the TMA coordinate each one is (from its strides). A dim
    of extent 1 prints with stride 0; it takes the coordinate no other dim has, in order."""
    _, _, _, stride = parse_layout(tma_text)
    axis = [d[1][0] if isinstance(d, tuple) else None for d in stride]
    free = iter(sorted(set(range(len(axis))) - {a for a in axis if a is not None}))
    return [a if a is not None else next(free) for a in axis]


_CACHE: dict = {}
UNWRITTEN = -1  # an operand value no TMA box delivered


def _cached(text: str, rank: int = 3):
    """(swizzle, offset, per-mode sizes, evaluated first mode, per-mode evaluated rest) of a layout text."""
    key = (text, rank)
    if key not in _CACHE:
        swz, off, shape, stride = parse_layout(text)
        modes = [evaluate(s, d, rank) for s, d in zip(shape, stride)]
        _CACHE[key] = (swz, off, [len(x) for x in modes], modes)
    return _CACHE[key]


def _operand(traced, key: str, codes, tile, li: int, rows: int):
    """The operand tile (rows × tile_k) the stage's MMAs read, moved from `codes` (rows_total, K, L) through the
    traced TMA box, shared-memory and MMA layouts."""
    g = key[0]  # "A" or "B"
    axis = _axis_of(traced[f"tma_{g.lower()}"])
    _, _, _, gmodes = _cached(traced[f"t{g}g{g}"])
    # The box's coordinates, offset by the origin of tile (row tile, K tile, batch): one value of each rest mode.
    origin = gmodes[1][tile[0]] + gmodes[2][tile[1]] + gmodes[3][li]
    cbox = gmodes[0] + origin
    row, kk, bat = (cbox[:, ax] for ax in axis)
    swz_s, off_s, _, smodes = _cached(traced[f"t{g}s{g}"])
    s_off = swizzle(smodes[0] + smodes[1][0] + off_s, swz_s)  # stage 0
    n_rows, k_total, _ = codes.shape
    inb = (row < n_rows) & (kk < k_total)
    # The MMAs: value v of K block kb reads shared offset swizzle(smem_layout(v, 0, kb, stage 0)) and multiplies it
    # as operand coordinate mma(v, 0, kb).
    swz_m, off_m, _, mmodes = _cached(traced[f"{g.lower()}_smem"])
    _, _, _, imodes = _cached(traced[f"mma_{g.lower()}"], rank=2)
    kblocks = traced["tile"][1]
    reads = [swizzle(mmodes[0] + mmodes[1][0] + mmodes[2][kb] + mmodes[3][0] + off_m, swz_m) for kb in range(kblocks)]
    # Shared memory no box wrote holds UNWRITTEN, so an MMA reading it shows in the operand.
    smem = np.full(int(max(s_off.max(), *(r.max() for r in reads))) + 1, UNWRITTEN, dtype=np.int64)
    smem[s_off] = np.where(inb, codes[np.minimum(row, n_rows - 1), np.minimum(kk, k_total - 1), bat], 0)
    tile_k = traced["tile"][0][2]
    out = np.full((rows, tile_k), UNWRITTEN, dtype=np.int64)
    for kb in range(kblocks):
        crd = imodes[0] + imodes[1][0] + imodes[2][kb]
        out[crd[:, 0], crd[:, 1]] = smem[reads[kb]]
    return out


def operands(traced, a_codes, b_codes, mt: int, kt: int, li: int):
    """(A tile 128 × tile_k, b tile N × tile_k) as the MMAs of output tile (mt, batch li), K tile kt, see them.
    `a_codes` (M, K, L) and `b_codes` (rows, K, L) are fp4 codes 0..15; rows and K past the tensor read as 0."""
    (tm, tn, _), _ = traced["tile"]
    return (
        _operand(traced, "A", a_codes, (mt, kt), li, tm),
        _operand(traced, "B", b_codes, (0, kt), li, tn),
    )
