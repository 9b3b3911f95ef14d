"""The host emulator of the sm_100a GEMV's operand path (cute_kernels.tc_emulator), run on the CPU.

fp4 codes travel from A and b through the TMA boxes, the swizzled shared memory and the MMAs' view of it, using
the layouts the kernel builds (traced from `GemvTcSm100.data_path` and `tma_partitions`). The GEMV computed from
what the MMAs see must equal the reference, on contest and full-range data, the contest's shapes, odd M, K not a
multiple of the K tile, and L > 1; and changing any one stride, the swizzle or a tile origin on that path must make
the emulator disagree. The scale factors' way into tensor memory and the epilogue are not emulated.
"""

import numpy as np
import pytest
import torch

from cute_kernels import gemv_tc_sm100 as tc
from cute_kernels import tc_emulator as emu
from submission.fp64_reference import e4m3_f64, fp4_f64
from submission.reference import check, generate_full_range, generate_input, ref_kernel

CONFIGS = {"n8": tc.GemvTcSm100Config(), "n128": tc.GemvTcSm100Config(mma_n=128, stages=6)}
SHAPES = [(128, 256, 1), (128, 1536, 1), (384, 7168, 2), (512, 512, 2), (1, 64, 1), (129, 320, 2), (127, 192, 3),
          (1000, 576, 3)]  # fmt: skip


def _codes(packed):
    """fp4 codes (rows, K, L) of a packed (rows, K/2, L) fp4x2 tensor, even K in the low nibble."""
    u = packed.view(torch.uint8).numpy().astype(np.int64)
    return np.stack((u & 15, u >> 4), axis=2).reshape(u.shape[0], -1, u.shape[2])


def _emulated_operands(traced, data):
    """A (M, K, L) and b row 0..N-1 (N, K, L) reassembled from what the MMAs of every tile see."""
    a, b = _codes(data[0]), _codes(data[1])
    m, k, l = a.shape  # noqa: E741
    (tm, tn, tk), _ = traced["tile"]
    m_tiles, k_tiles = -(-m // tm), -(-k // tk)
    got_a = np.zeros((m_tiles * tm, k_tiles * tk, l), dtype=np.int64)
    got_b = np.zeros((tn, k_tiles * tk, l), dtype=np.int64)
    for li in range(l):
        for kt in range(k_tiles):
            for mt in range(m_tiles):
                tile_a, tile_b = emu.operands(traced, a, b, mt, kt, li)
                got_a[mt * tm : (mt + 1) * tm, kt * tk : (kt + 1) * tk, li] = tile_a
            got_b[:, kt * tk : (kt + 1) * tk, li] = tile_b
    return got_a, got_b


def _gemv_from(operand_a, operand_b, data):
    """c (M, 1, L) fp16 from the emulated operands and the plain scales, summed in float64."""
    m, kb, l = data[0].shape  # noqa: E741
    k = 2 * kb
    sfa = e4m3_f64(data[2].view(torch.uint8).numpy())
    sfb = e4m3_f64(data[3].view(torch.uint8).numpy())
    av = fp4_f64(operand_a[:m, :k]) * np.repeat(sfa, 16, axis=1)
    bv = fp4_f64(operand_b[0, :k]) * np.repeat(sfb[0], 16, axis=0)
    with np.errstate(invalid="ignore"):
        c = np.einsum("mkl,kl->ml", av, bv)
    return torch.from_numpy(c.astype(np.float16)).unsqueeze(1)


@pytest.fixture(scope="module")
def traces():
    cache = {}

    def get(name, m, k, l):  # noqa: E741
        if (name, m, k, l) not in cache:
            cache[(name, m, k, l)] = emu.trace(CONFIGS[name], m, k, l)
        return cache[(name, m, k, l)]

    return get


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("m,k,l", SHAPES)
def test_what_the_mmas_multiply_is_a_and_b(traces, config, m, k, l):
    traced = traces(config, m, k, l)
    data = generate_full_range(m, k, l, seed=m + k + l)
    got_a, got_b = _emulated_operands(traced, data)
    a, b = _codes(data[0]), _codes(data[1])
    np.testing.assert_array_equal(got_a[:m, :k], a)
    assert not got_a[m:].any() and not got_a[:, k:].any()  # rows and K past the tensor: TMA's zero fill
    n = CONFIGS[config].mma_n
    np.testing.assert_array_equal(got_b[:, :k], b[:n])


@pytest.mark.parametrize("m,k,l", [(128, 256, 1), (129, 320, 2), (384, 7168, 2)])
@pytest.mark.parametrize("kind", ["contest", "full"])
def test_the_gemv_of_the_emulated_operands_is_the_reference(traces, m, k, l, kind):
    data = (generate_input if kind == "contest" else generate_full_range)(m, k, l, seed=3 * m + k)
    ref = ref_kernel(data[:6] + (torch.empty_like(data[6]),))
    got = _gemv_from(*_emulated_operands(traces("n8", m, k, l), data), data)
    ok, msg = check(got, ref)
    assert ok, msg
    if kind == "contest":  # every partial sum is exact: one rounding, bit for bit
        assert torch.equal(got.view(torch.int16), ref.view(torch.int16))


MUTATIONS = [
    ("tAgA", "128@1", "127@1"),  # the M tile origin of A's boxes
    ("tAgA", "256@0", "192@0"),  # the K tile origin
    ("tAsA", "((1,0),", "((2,0),"),  # where a box value lands in shared memory
    ("a_smem", "S<3,4,3>", "S<2,4,3>"),  # the MMA descriptor's swizzle against the TMA's
    ("a_smem", "(256,1)", "(128,1)"),  # the MMA view's row stride
    ("mma_a", "64@1", "32@1"),  # which K an MMA block multiplies
    ("tBgB", "((1@0,1@1),0)", "((1@1,1@0),0)"),  # b's box coordinates swapped
    ("b_smem", "(256,1)", "(256,2)"),
]


@pytest.mark.parametrize("key,old,new", MUTATIONS, ids=[f"{k}:{o}->{n}" for k, o, n in MUTATIONS])
def test_a_changed_stride_makes_the_emulator_disagree(traces, key, old, new):
    m, k, l = 384, 768, 2  # noqa: E741
    traced = dict(traces("n8", m, k, l))
    assert old in traced[key], traced[key]
    traced[key] = traced[key].replace(old, new, 1)
    data = generate_input(m, k, l, seed=5)
    ref = ref_kernel(data[:6] + (torch.empty_like(data[6]),))
    got_a, got_b = _emulated_operands(traced, data)
    a, b = _codes(data[0]), _codes(data[1])
    assert not (np.array_equal(got_a[:m, :k], a) and np.array_equal(got_b[:, :k], b[:8]))
    fp4 = np.where((got_a >= 0) & (got_a < 16), got_a, 0), np.where((got_b >= 0) & (got_b < 16), got_b, 0)
    assert not torch.equal(_gemv_from(*fp4, data), ref)


def test_layout_text_evaluation():
    swz, off, shape, stride = emu.parse_layout("S<3,4,3> o 0 o ((128,64),1,4):((256,1),0,64)")
    assert swz == (3, 4, 3) and off == 0
    offs = emu.evaluate(shape, stride)
    assert offs[:3].tolist() == [0, 256, 512] and offs[128] == 1 and offs[128 * 64] == 64
    assert emu.swizzle(np.array([0b1010000000]), swz).tolist() == [0b1010000000 ^ 0b0001010000]
    _, _, shape, stride = emu.parse_layout("(((256,8),1),16,2,2):(((1@0,1@1),0),8@1,256@0,1@2)")
    crd = emu.evaluate(shape, stride)
    assert crd[257].tolist() == [1, 1, 0] and crd[2048].tolist() == [0, 8, 0]
