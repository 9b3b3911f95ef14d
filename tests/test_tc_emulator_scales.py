"""The host emulator of the sm_100a GEMV's scale path and epilogue (cute_kernels.tc_emulator), run on the CPU.

Scale bytes travel from the permuted SFA/SFB buffers through the TMA boxes, shared memory and tcgen05.cp into
tensor memory, where each MMA reads them at its scale operand's address; the emulated block-scaled MMAs leave the
accumulator in TMEM, each epilogue thread's tcgen05.ld brings its row back, and split tiles are summed from the
workspace in CTA order. All of it uses the layouts and TMEM pointers the kernel builds (`trace`, `trace_tmem`). The
emulated c must equal the reference (bit for bit on contest data), and one changed stride, TMEM column or lane
offset, pointer or register choice on that path must make it disagree.
"""

import numpy as np
import pytest
import torch

from cute_kernels import gemv_tc_sm100 as tc
from cute_kernels import tc_emulator as emu
from submission.fp64_reference import storage_bytes
from submission.reference import check, generate_full_range, generate_input, ref_kernel

CONFIGS = {"n8": tc.GemvTcSm100Config(), "n128": tc.GemvTcSm100Config(mma_n=128, stages=6)}
# (M, K, L, CTAs): odd M, K not a multiple of the K tile, L > 1, whole tiles per CTA, and tiles split over CTAs.
CASES = [(200, 576, 2, 148), (256, 512, 2, 2), (384, 1024, 1, 5)]


@pytest.fixture(scope="module")
def traces():
    cache = {}

    def get(name, m=None, k=None, l=None):  # noqa: E741
        key = (name, m, k, l)
        if key not in cache:
            cache[key] = emu.trace_tmem(CONFIGS[name]) if m is None else emu.trace(CONFIGS[name], m, k, l)
        return cache[key]

    return get


def _reference(data):
    return ref_kernel(data[:6] + (torch.empty_like(data[6]),))


def test_tmem_pointers_hold_the_offsets_their_layouts_do_not_print(traces):
    """The kernel's TMEM tensors print the same layout for every K block and every epilogue thread; the offsets are
    in their pointers: SFA from column sf_tmem_col, 4 columns per K block, SFB 16 columns later; accumulator stage
    s at column N*s; epilogue thread t's tcgen05.ld starts at lane 32*(t // 32) (its warp's lane quadrant)."""
    for name, cfg in CONFIGS.items():
        tmem = traces(name)
        names = [f"sfa_{kb}" for kb in range(4)] + [f"sfb_{kb}" for kb in range(4)] + ["s2t_a", "s2t_b"]
        lane, byte = emu.decode_tmem(tmem["address"](names, np.zeros(len(names))), 1)
        col = cfg.sf_tmem_col
        assert (lane == 0).all()
        assert (byte // 4).tolist() == [col + 4 * kb for kb in range(4)] + [col + 16 + 4 * kb for kb in range(4)] + [
            col, col + 16]
        lane, byte = emu.decode_tmem(tmem["address"](["acc_0", "acc_1"], [0, 0]), 4)
        assert lane.tolist() == [0, 0] and (byte // 4).tolist() == [0, cfg.mma_n]
        tidx = list(range(128))
        lane, byte = emu.decode_tmem(tmem["address"]([f"t2r_{t}" for t in tidx], np.zeros(128)), 4)
        assert lane.tolist() == [32 * (t // 32) for t in tidx] and not byte.any()
        assert all(tmem["col0"][t] == (0, t) for t in tidx)  # register 0 of thread t is row t, column 0
        # An 8-bit TMEM offset's two low bits are the byte within the column, in address bits 30..31.
        assert [hex(x) for x in tmem["address"]("sfa_0", [1, 2, 4, 262144])] == [
            hex(col | 1 << 30), hex(col | 2 << 30), hex(col + 1), hex(col | 1 << 16)]


@pytest.mark.parametrize("config,m,k,l", [("n8", 200, 576, 2), ("n8", 384, 1024, 1), ("n128", 200, 576, 2)])
def test_the_scales_each_mma_applies_are_the_plain_scales(traces, config, m, k, l):
    traced, tmem = traces(config, m, k, l), traces(config)
    data = generate_full_range(m, k, l, seed=m + k)
    sfa, sfb = storage_bytes(data[4]).astype(np.int64), storage_bytes(data[5]).astype(np.int64)
    plain_a = np.repeat(data[2].view(torch.uint8).numpy().astype(np.int64), 16, axis=1)  # (M, K, L)
    plain_b = np.repeat(data[3].view(torch.uint8).numpy().astype(np.int64), 16, axis=1)  # (128, K, L)
    for li in range(l):
        for kt in range(-(-k // 256)):
            for mt in range(-(-m // 128)):
                got_a, got_b = emu.scales_seen(traced, tmem, sfa, sfb, (mt, kt), li)
                want_a = np.zeros((128, 256), np.int64)
                rows, ks = plain_a[128 * mt : 128 * (mt + 1), 256 * kt : 256 * (kt + 1), li].shape
                want_a[:rows, :ks] = plain_a[128 * mt : 128 * mt + rows, 256 * kt : 256 * kt + ks, li]
                want_b = np.zeros((128, 256), np.int64)
                want_b[:, :ks] = plain_b[:, 256 * kt : 256 * kt + ks, li]
                np.testing.assert_array_equal(got_a, want_a)  # rows past M and K past the tensor: zero fill
                np.testing.assert_array_equal(got_b, want_b)


@pytest.mark.parametrize("config,m,k,l,ctas", [("n8", *c) for c in CASES] + [("n128", *CASES[0])])
@pytest.mark.parametrize("kind", ["contest", "full"])
def test_the_emulated_kernel_computes_the_reference(traces, config, m, k, l, ctas, kind):
    data = (generate_input if kind == "contest" else generate_full_range)(m, k, l, seed=7 * m + k)
    ref = _reference(data)
    got = emu.emulate_gemv(traces(config, m, k, l), traces(config), data, ctas)
    ok, msg = check(got, ref)
    assert ok, msg
    if kind == "contest":
        assert torch.equal(got.view(torch.int16), ref.view(torch.int16))


def _mutated_tmem(tmem, key, old, new):
    out = {x: y for x, y in tmem.items() if x != "maps"}
    texts = dict(out["texts"])
    keys = [x for x in texts if x.startswith("t2r_") and x[4:].isdigit()] if key == "t2r_*" else [key]
    for x in keys:
        assert old in texts[x], texts[x]
        texts[x] = texts[x].replace(old, new, 1)
    out["texts"] = texts
    return out


MUTATIONS = [
    # the scale path
    ("tAgSFA", "4@1", "3@1"),  # the K tile origin of SFA's boxes
    ("tBgSFB", "1/2@0", "1@0"),  # a byte of SFB's box read as a 16-bit unit
    ("tAsSFA", "((1,0),", "((2,0),"),  # where an SFA box byte lands in shared memory
    ("s2t_src_a", "0,0,32,128)", "0,0,16,128)"),  # the shared rows tcgen05.cp copies for a K block
    ("s2t_a", "8388608", "4194304"),  # the lane of a warp's copy: lane 32*w -> 16*w
    ("s2t_b", "0,0,16)", "0,0,8)"),  # the TMEM columns of SFB's K block
    ("sfa", "((262144,4)", "((262144,8)"),  # the TMEM column the MMA reads for row // 32
    ("sfb", "(0,1)", "(0,4)"),  # the byte (scale) the MMA reads for K // 16
    # the epilogue
    ("acc", "((65536,1)", "((131072,1)"),  # the accumulator's lane stride
    ("mma_c", "(1@0,1@1)", "(1@1,1@0)"),  # the MMA's C coordinates
    ("t2r_dst_tv", "(32,8):(8,1)", "(32,8):(1,32)"),  # which atom value a thread's register is
    ("t2r_*", "(1,65536)", "(1,32768)"),  # the lane stride of the tcgen05.ld source
    ("t2r_*", "0,0,8)", "0,0,0)"),  # the epilogue reads accumulator stage 0 while the MMAs wrote stage 1
]


@pytest.mark.parametrize("key,old,new", MUTATIONS, ids=[f"{k}:{o}->{n}" for k, o, n in MUTATIONS])
def test_a_changed_scale_or_epilogue_mapping_makes_the_emulator_disagree(traces, key, old, new):
    m, k, l, ctas = 200, 576, 2, 5  # noqa: E741  (CTAs with several segments: both accumulator stages, and splits)
    traced, tmem = dict(traces("n8", m, k, l)), traces("n8")
    if key in traced:
        assert old in traced[key], traced[key]
        traced[key] = traced[key].replace(old, new, 1)
    else:
        tmem = _mutated_tmem(tmem, key, old, new)
    data = generate_input(m, k, l, seed=5)
    got = emu.emulate_gemv(traced, tmem, data, ctas)
    assert not torch.equal(got, _reference(data))


@pytest.mark.parametrize("change", ["sfb pointer is sfa's", "thread 5 stores row 6"])
def test_a_changed_tmem_pointer_or_row_makes_the_emulator_disagree(traces, change):
    m, k, l, ctas = 200, 576, 2, 148  # noqa: E741
    tmem = {x: y for x, y in traces("n8").items() if x != "maps"}
    if change == "sfb pointer is sfa's":
        address = tmem["address"]
        tmem["address"] = lambda names, offs: address(
            [n.replace("sfb_", "sfa_") for n in np.broadcast_to(np.atleast_1d(names), np.shape(np.ravel(offs)))]
            if np.ndim(names) else str(names).replace("sfb_", "sfa_"), offs)
    elif change == "thread 5 stores row 6":
        tmem["col0"] = {**tmem["col0"], 5: (0, 6)}
    data = generate_input(m, k, l, seed=5)
    assert not torch.equal(emu.emulate_gemv(traces("n8", m, k, l), tmem, data, ctas), _reference(data))
