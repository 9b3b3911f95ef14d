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

`trace_tmem(config)` runs the kernel's TMEM construction (`tmem_scales`, `_s2t_partition`, `accumulator_layout`,
`epilogue_copy`, `column0`) in a jit function that launches nothing, on the CPU, and keeps the layouts and the
pointers' addresses. `scales_seen` moves scale bytes global -> TMA box -> shared memory -> tcgen05.cp -> TMEM -> the
scale each MMA applies to each (row, K); `emulate_gemv` runs the block-scaled MMAs on what they see, leaves the
accumulator in TMEM, reads it back through each epilogue thread's tcgen05.ld and stores its row, summing split tiles
in CTA order. Taken as given, not traced: that tcgen05.cp 32x128b copies each 16-byte shared row to one lane's four
columns in byte order, that each of the MMA's four warp-copies of a scale is the same, and the fp32 rounding of the
accumulator once a K block (the hardware's internal order is not documented).
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
        m = re.match(r"-?\d+(/\d+)?(@\d+)*", text[pos:])
        tok = m.group(0)
        pos += len(tok)
        if "@" in tok:
            value, *modes = tok.split("@")
            return (_number(value), tuple(int(x) for x in modes))
        return _number(tok)

    return item()


def _number(tok: str):
    """'3' -> 3, '1/2' -> 0.5 (a stride in units larger than the element, such as a byte of a 16-bit TMA unit)."""
    if "/" in tok:
        num, den = tok.split("/")
        return int(num) / int(den)
    return int(tok)


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
    frac = any(isinstance(d[0] if isinstance(d, tuple) else d, float) for _, d in pairs)
    out = np.zeros((size, rank) if basis else size, dtype=np.float64 if frac else np.int64)
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
    from layouts import sf_cute

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
            (tAsA, tAgA), (tBsB, tBgB), (tAsSFA, tAgSFA), (tBsSFB, tBgSFB) = kernel.tma_partitions(
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
                tma_sfa=str(tma_sfa.layout), tma_sfb=str(tma_sfb.layout),
                tAgSFA=str(tAgSFA.layout), tAsSFA=str(tAsSFA.layout), tBgSFB=str(tBgSFB.layout),
                tBsSFB=str(tBsSFB.layout),
                # The byte layouts the scale TMA atoms were made from (data_path's views of mSFA and mSFB).
                gmem_sfa=str(sf_cute.sf_layout_permuted_mkl(*mA.shape)), gmem_sfb=str(kernel.sfb_layout(mB.shape)),
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


# ---------------------------------------------------------------- tensor memory: the scales' copy, the MMA, the epilogue
#
# A TMEM address is lane << 16 | column (32-bit columns). A TMEM pointer to 8-bit scales counts bytes: CuTe rotates
# the two low bits of an element offset into bits 30..31 (the byte within the column), so offset 1 from column 32 is
# 0x40000020 and offset 262144 is lane 1. The per-thread and per-K-block offsets of the kernel's TMEM tensors live in
# their pointers, which print without a value; `trace_tmem` reads them by running the kernel's own construction in a
# jit function that launches nothing (it runs on the CPU) and storing each pointer's `toint()`, and it lets the DSL do
# the pointer arithmetic of every offset the emulator needs, so no address here comes from a formula of ours.

SMEM_SF = 1024  # where the traced SFA and SFB stages start in shared memory (any 128-aligned address)
TMEM_LANES, TMEM_BYTES_PER_LANE = 128, 4 * 512


def _tmem_objects(kernel, tidxs):
    """The kernel's TMEM tensors at trace time, built as the kernel builds them, for an allocation at address 0:
    (named pointers, named layouts text, per-thread epilogue (register index, row) of column 0, t2r atom TV texts)."""
    import cutlass

    f8 = cutlass.Float8E4M3FN
    tiled_mma, _ = kernel._make_tiled_mmas()
    _, _, sfa_smem, sfb_smem = kernel.smem_layouts(tiled_mma)
    acc_ptr = cute.make_ptr(cutlass.Float32, 0, cute.AddressSpace.tmem, assumed_align=16)
    tCtSFA, tCtSFB = kernel.tmem_scales(tiled_mma, acc_ptr, sfa_smem, sfb_smem)
    sSFA = cute.make_tensor(cute.make_ptr(f8, SMEM_SF, cute.AddressSpace.smem, assumed_align=128), sfa_smem)
    sSFB = cute.make_tensor(cute.make_ptr(f8, SMEM_SF, cute.AddressSpace.smem, assumed_align=128), sfb_smem)
    ptrs, texts = {}, {}
    for g, sSF, tCtSF in (("a", sSFA, tCtSFA), ("b", sSFB, tCtSFB)):
        _, src, dst = kernel._s2t_partition(sSF, tCtSF)
        ptrs[f"s2t_{g}"] = dst.iterator
        texts[f"s2t_{g}"] = str(dst.layout)
        # The source is a shared-memory descriptor tensor; its layout counts 16-byte rows from sSF's address.
        texts[f"s2t_src_{g}"] = re.search(r'smem_desc, "([^"]+)"', str(src)).group(1)
        for kb in range(kernel.num_kblocks):
            ptrs[f"sf{g}_{kb}"] = tCtSF[(None, None, kb)].iterator  # the MMA's scale operand of K block kb
        texts[f"sf{g}"] = str(tCtSF[(None, None, 0)].layout)
    acc_layout = kernel.accumulator_layout(tiled_mma)
    tCtAcc_base = cute.make_tensor(acc_ptr, acc_layout)
    for s in range(kernel.config.acc_stages):
        ptrs[f"acc_{s}"] = tCtAcc_base[(None, None, None, s)].iterator
    texts["acc"] = str(tCtAcc_base[(None, None, None, 0)].layout)
    texts["mma_c"] = str(tiled_mma.get_slice(0).partition_C(cute.make_identity_tensor(kernel.mma_tiler[:2])).layout)
    tAcc = tCtAcc_base[((None, None), 0, 0, None)]
    col0 = {}
    for tidx in tidxs:
        t2r, tTR_tAcc, tTR_cAcc = kernel.epilogue_copy(tAcc, tidx)
        ptrs[f"t2r_{tidx}"] = tTR_tAcc.iterator
        texts[f"t2r_{tidx}"] = str(tTR_tAcc.layout)
        col0[tidx] = kernel.column0(tTR_cAcc)
        texts["t2r_src_tv"], texts["t2r_dst_tv"] = str(t2r.layout_src_tv), str(t2r.layout_dst_tv)
        texts["t2r_thr"] = str(t2r.thr_id)
    return ptrs, texts, col0


def trace_tmem(config) -> dict:
    """The TMEM side of `GemvTcSm100(config)` (shape-independent): layouts as CuTe prints them, and a function
    `address(name, offsets)` giving the DSL's TMEM address (uint32) of element `offsets` of the named tensor."""
    import cutlass
    import torch
    from cutlass.cute.runtime import from_dlpack

    from cute_kernels import gemv_tc_sm100 as tc
    from cute_kernels.targets import target

    kernel = tc.GemvTcSm100(config, target("sm_100a"))
    tidxs = range(32 * kernel.epi_warps)
    out: dict = {}

    @cute.jit
    def names():
        ptrs, texts, col0 = _tmem_objects(kernel, tidxs)
        out.update(names=list(ptrs), texts=texts, col0=col0)

    names()
    index = {n: i for i, n in enumerate(out["names"])}

    @cute.jit
    def addresses(which: cute.Tensor, offs: cute.Tensor, res: cute.Tensor, n: cutlass.Int32):
        ptrs, _, _ = _tmem_objects(kernel, tidxs)
        for q in cutlass.range(n):
            w = which[q]
            off = cutlass.Int32(offs[q])
            for i, p in enumerate(ptrs.values()):
                if w == i:
                    res[q] = cutlass.Int64((p + off).toint())

    compiled, memo = {}, {}

    def address(name_of_each, offsets):
        """uint32 TMEM addresses of the pointers `name_of_each` (a name or one name per offset) plus `offsets`."""
        offsets = np.asarray(offsets, dtype=np.int64).ravel()
        key = (str(name_of_each), offsets.tobytes())
        if key not in memo:
            memo[key] = _address(name_of_each, offsets)
        return memo[key]

    def _address(name_of_each, offsets):
        which = np.broadcast_to(np.asarray([index[x] for x in np.atleast_1d(name_of_each)], np.int64), offsets.shape)
        which = np.array(which)
        res = torch.zeros(len(offsets), dtype=torch.int64)
        args = (from_dlpack(torch.from_numpy(which)), from_dlpack(torch.from_numpy(offsets)),
                from_dlpack(res), cutlass.Int32(len(offsets)))
        if "f" not in compiled:
            compiled["f"] = cute.compile(addresses, *args)
        compiled["f"](*args)
        return res.numpy() & 0xFFFFFFFF

    out["address"] = address
    out["tile"] = (kernel.mma_tiler, kernel.num_kblocks, config.acc_stages)
    return out


def decode_tmem(addr, elem_bytes: int):
    """(lane, byte offset within the lane's 2 KiB) of TMEM addresses; for 8-bit elements the byte within the column
    is in bits 30..31. Lanes past 127 come back as they are, for the caller to reject."""
    addr = np.asarray(addr, dtype=np.int64)
    sub = (addr >> 30) & 3 if elem_bytes == 1 else 0
    return (addr >> 16) & 0x3FFF, 4 * (addr & 0xFFFF) + sub


def _tma_units(tma_text: str, gmem_text: str) -> dict:
    """Bytes per unit of each TMA coordinate, from the TMA view and the byte layout it was made from (the same
    modes; each leaf's byte stride over its TMA stride)."""
    _, _, tshape, tstride = parse_layout(tma_text)
    _, _, _, gstride = parse_layout(gmem_text)
    units: dict = {}
    for (n, t), (_, gs) in zip(_flatten(tshape, tstride), _flatten(tshape, gstride)):
        if isinstance(t, tuple) and t[0] != 0 and n > 1:
            unit = gs / t[0]
            assert units.setdefault(t[1][0], unit) == unit, (tma_text, gmem_text)
    return units


def _sf_smem(traced, g: str, sf_bytes, tile, li: int):
    """The stage-0 shared-memory bytes a scale TMA box of tile (row tile, K tile), batch li leaves: {offset: byte}
    as an array indexed by shared offset. `sf_bytes` is the permuted buffer's storage, flat."""
    key = "SFA" if g == "a" else "SFB"
    tma, gmem = traced[f"tma_{g.replace('a', 'sfa').replace('b', 'sfb')}"], traced[f"gmem_sf{g}"]
    units = _tma_units(tma, gmem)
    _, _, tshape, tstride = parse_layout(tma)
    extent = np.floor(evaluate(tshape, tstride, rank=len(units))).max(axis=0) + 1  # the tensor map's dims
    _, _, _, gmodes = _cached(traced[f"t{key[-1]}g{key}"], rank=len(units))
    crd = gmodes[0] + gmodes[1][tile[0]] + gmodes[2][tile[1]] + gmodes[3][li]
    inb = (np.floor(crd) < extent).all(axis=1)  # TMA zero-fills a box past the tensor map
    byte = np.rint(sum(crd[:, d] * u for d, u in units.items())).astype(np.int64)
    _, off_s, _, smodes = _cached(traced[f"t{key[-1]}s{key}"])
    s_off = smodes[0] + smodes[1][0] + off_s
    smem = np.full(int(s_off.max()) + 1, UNWRITTEN, dtype=np.int64)
    smem[s_off] = np.where(inb, sf_bytes[np.where(inb, byte, 0)], 0)
    return smem


def _offsets(text: str):
    _, _, shape, stride = parse_layout(text)
    return [evaluate(s, d) for s, d in zip(shape, stride)]


def scales_seen(traced, tmem, sfa_bytes, sfb_bytes, tile, li: int):
    """(SFA bytes 128 x tile_k, SFB bytes 128 x tile_k) that the MMAs of K tile tile[1] apply to each (row, K) of A
    and each (b row, K): global -> TMA box -> shared memory -> tcgen05.cp -> TMEM -> the MMA's scale operand.
    A value no copy delivered, or whose four warp copies in TMEM differ, reads UNWRITTEN."""
    tmem_img = np.full((TMEM_LANES, TMEM_BYTES_PER_LANE), UNWRITTEN, dtype=np.int64)
    (tm, _, tk), kblocks, _ = tmem["tile"]
    texts, address = tmem["texts"], tmem["address"]
    seen = []
    for g, sf_bytes, t in (("a", sfa_bytes, tile), ("b", sfb_bytes, (0, tile[1]))):
        smem = _sf_smem(traced, g, sf_bytes, t, li)
        # tcgen05.cp 32x128b.warpx4 of K block kb: 16-byte row r (the descriptor's layout, in 16-byte units from the
        # stage's base) to the destination values (r, byte c of the row, warp copy w).
        src = _offsets(texts[f"s2t_src_{g}"])  # ((row, copy), 1, 1, kb, stage)
        dst = _offsets(texts[f"s2t_{g}"])  # ((row, byte, copy), 1, 1, kb)
        rows = src[0].reshape(4, 32).T[:, 0]  # (32,) per row, copy 0; the copies of a row share a source
        assert (src[0].reshape(4, 32).T == rows[:, None]).all()
        for kb in range(kblocks):
            off = dst[0] + dst[3][kb]
            lane, byte = decode_tmem(address(f"s2t_{g}", off), 1)
            r, c = np.arange(32 * 16 * 4) % 32, np.arange(32 * 16 * 4) // 32 % 16
            s_off = 16 * (rows[r] + src[3][kb] + src[4][0]) + c
            ok = (lane < TMEM_LANES) & (byte < TMEM_BYTES_PER_LANE)
            tmem_img[lane[ok], byte[ok]] = np.where(s_off < len(smem), smem[np.minimum(s_off, len(smem) - 1)],
                                                    UNWRITTEN)[ok]
        # The MMA of K block kb reads its scales at its operand address plus the scale layout: mode 0 is
        # (((row % 32, row // 32), warp copy), (K % 16, K // 16)).
        mode0 = _offsets(texts[f"sf{g}"])[0].reshape(64, 4, 128).transpose(2, 1, 0)  # (row, copy, K in block)
        out = np.full((128, tk), UNWRITTEN, dtype=np.int64)
        for kb in range(kblocks):
            lane, byte = decode_tmem(address(f"sf{g}_{kb}", mode0.ravel()), 1)
            ok = (lane < TMEM_LANES) & (byte < TMEM_BYTES_PER_LANE)
            vals = np.where(ok, tmem_img[np.where(ok, lane, 0), np.where(ok, byte, 0)], UNWRITTEN).reshape(mode0.shape)
            agree = (vals == vals[:, :1]).all(axis=1)
            out[:, 64 * kb : 64 * (kb + 1)] = np.where(agree, vals[:, 0], UNWRITTEN)
        seen.append(out)
    return seen[0][:tm], seen[1]


def _epilogue_maps(tmem):
    """Per accumulator stage: where the MMA leaves C(row, column) in TMEM (its C partition and the accumulator
    layout), and for each epilogue thread the TMEM (lane, byte) its column-0 register loads (the tcgen05.ld atom's
    TV layouts and the thread's source partition) with the tile row it stores that register to."""
    texts, address = tmem["texts"], tmem["address"]
    _, _, acc_stages = tmem["tile"]
    crd = evaluate(*parse_layout(texts["mma_c"])[2:], rank=2)
    acc = evaluate(*parse_layout(texts["acc"])[2:])
    _, _, thr_shape, thr_stride = parse_layout(texts["t2r_thr"])
    nthr = int(np.prod([x for x, _ in _flatten(thr_shape, thr_stride)]))
    _, _, dshape, dstride = parse_layout(texts["t2r_dst_tv"])
    dst_tv = [evaluate(x, y) for x, y in zip(dshape, dstride)]  # (thread, value) -> atom value index
    maps = []
    for s in range(acc_stages):
        lane, byte = decode_tmem(address(f"acc_{s}", acc), 4)
        names, offs = [], []
        for tidx, (reg, _) in tmem["col0"].items():
            modes = _offsets(texts[f"t2r_{tidx}"])  # ((atom values, 1), 1, 1, STAGE)
            v = dst_tv[0][tidx % nthr] + dst_tv[1][reg]
            names.append(f"t2r_{tidx}")
            offs.append(modes[0][v] + modes[3][s])
        rl, rb = decode_tmem(address(names, offs), 4)
        reads = {t: (int(rl[i]), int(rb[i]), row) for i, (t, (_, row)) in enumerate(tmem["col0"].items())}
        maps.append((crd, lane, byte, reads))
    return maps


def emulate_gemv(traced, tmem, data, num_ctas: int):
    """c (M, 1, L) fp16 as the kernel would compute it on `num_ctas` CTAs: operands and scales as the MMAs see them,
    block-scaled MMAs (per 16 K elements: fp4 x e4m3 scale, exact products, fp32 accumulation per MMA), the
    accumulator left in TMEM, read back by each epilogue thread's tcgen05.ld and stored to its row, tiles split over
    CTAs summed from the fp32 workspace in CTA order (`tile_scheduler`'s slots and offsets, as `store_split_tile`)."""
    import torch

    from cute_kernels import tile_scheduler as ts
    from submission.fp64_reference import e4m3_f64, fp4_f64, storage_bytes

    def codes(packed):
        u = packed.view(torch.uint8).numpy().astype(np.int64)
        return np.stack((u & 15, u >> 4), axis=2).reshape(u.shape[0], -1, u.shape[2])

    a, b = codes(data[0]), codes(data[1])
    sfa, sfb = storage_bytes(data[4]).astype(np.int64), storage_bytes(data[5]).astype(np.int64)
    m, k, l = a.shape  # noqa: E741
    (tm, tn, tk), kblocks, acc_stages = tmem["tile"]
    if "maps" not in tmem:
        tmem["maps"] = _epilogue_maps(tmem)
    maps = tmem["maps"]
    m_tiles, k_tiles = ts.num_m_tiles(m, tm), ts.num_k_tiles(k, tk)
    total = m_tiles * l * k_tiles
    G = ts.effective_ctas(num_ctas, total)

    def value(codes_, scales):
        ok = (codes_ >= 0) & (scales >= 0)
        with np.errstate(invalid="ignore"):
            return np.where(ok, fp4_f64(np.where(ok, codes_, 0)) * e4m3_f64(np.where(ok, scales, 0)), np.nan)

    c = np.full((m, l), np.nan)
    partial = np.full(ts.workspace_elems(num_ctas, tm), np.nan, dtype=np.float32)
    split = {}
    for g in range(G):
        w, w_end = ts.cta_run(g, num_ctas, total)
        stage = 0
        while w < w_end:
            tile, k0, k1, w = ts.next_segment(w, w_end, k_tiles)
            mt, li = ts.output_tile_coord(tile, m_tiles)
            acc = np.zeros((tm, tn), dtype=np.float32)
            for kt in range(k0, k1):
                op_a, op_b = operands(traced, a, b, mt, kt, li)
                sa, sb = scales_seen(traced, tmem, sfa, sfb, (mt, kt), li)
                va, vb = value(op_a, sa), value(op_b, sb[:tn])
                for kb in range(kblocks):
                    blk = slice(64 * kb, 64 * (kb + 1))
                    with np.errstate(invalid="ignore"):
                        acc = (acc.astype(np.float64) + va[:, blk] @ vb[:, blk].T).astype(np.float32)
            crd, lane, byte, reads = maps[stage]
            img = np.full((TMEM_LANES, TMEM_BYTES_PER_LANE // 4), np.nan, dtype=np.float32)
            ok = (lane < TMEM_LANES) & (byte < TMEM_BYTES_PER_LANE) & (crd[:, 0] < tm) & (crd[:, 1] < tn)
            img[lane[ok], byte[ok] // 4] = acc[crd[ok, 0], crd[ok, 1]]
            stage = (stage + 1) % acc_stages
            first = ts.tile_first_cta(tile, k_tiles, G, total)
            last = ts.tile_last_cta(tile, k_tiles, G, total)
            slot = ts.partial_slot(g, tile, k_tiles, G, total)
            for rl, rb, row in reads.values():
                v = img[rl, rb // 4] if rl < TMEM_LANES and rb < TMEM_BYTES_PER_LANE else np.nan
                row_g = mt * tm + row
                if first == last:
                    if row_g < m:
                        c[row_g, li] = v
                else:
                    partial[ts.partial_offset(g, slot, row, tm)] = v
            if first != last:
                split[tile] = (first, last, mt, li)
        # the last CTA of a split tile sums every partial in CTA order
        for tile, (first, last, mt, li) in list(split.items()):
            if last != g:
                continue
            for row in range(tm):
                acc32 = np.float32(0.0)
                for cta in range(first, last + 1):
                    idx = ts.partial_offset(cta, ts.partial_slot(cta, tile, k_tiles, G, total), row, tm)
                    acc32 = np.float32(acc32 + partial[idx])
                if mt * tm + row < m:
                    c[mt * tm + row, li] = acc32
            del split[tile]
    with np.errstate(over="ignore", invalid="ignore"):
        return torch.from_numpy(c.astype(np.float16)).unsqueeze(1)
