"""The W4A16 linear with x prepared once a call in the order its loads want ("x in fragment order").

`linear_w4a16` loads each lane's 64 bytes of x a 128-K step in four 16-byte loads at offsets 64c + 16v of its token's
row: the 4 lanes of a token touch four half sectors an instruction, a warp's load spans 16 lines (8 tokens x 2),
and a PRMT a register pairs the elements for the MMA's B operand. Here a first kernel (`fragments_kernel`, one
16-byte chunk a thread) writes x once a call as

    words (s, g, v, t, c, i): step s, token group g = tok // 8, chunk v, token t = tok % 8, lane c, pair i
                              = the pair PAIRS[mma dtype][i] of x elements 128s + 32c + 8v + (a, b) of token tok

so that the main kernel's chunk v of a warp is 512 contiguous bytes (8 tokens x 4 lanes x 16 bytes: 4 L1
wavefronts, not 16) and its words are the B registers as they are (no PRMT). The main kernel is `LinearW4A16`'s,
launched with programmatic dependent launch: its prologue overlaps the x pass, and it waits for the pass before its
K loop. The K order, the MMAs and every sum are the default kernel's: the output is bit-identical to it.

With `pdl` the x pass too is launched programmatically dependent on the grid before it (the last call's main kernel,
say, which still reads the workspace the pass writes): it waits (`griddepcontrol.wait`) before its load of x and its
store, and the main kernel signals after its K loop that the next grid may launch.

Tokens past M (the kernel repeats the last one) and the K past a last half step (lanes that load nothing there) are
never read, so the pass writes only the M x K elements.
"""

import cutlass.cute as cute
from cutlass import Int32, Uint32, const_expr

from cute_kernels.compile import launch, load_atom
from cute_kernels.linear_w4a16 import PAIRS, STEP_K, LinearW4A16, prmt, x_pair_selector

CHUNK_THREADS = 128  # threads of an x-pass CTA: the chunks of one (step, token group), 4 x 8 x 4


def fragment_words(m: int, k: int) -> int:
    """32-bit words of x in fragment order for M tokens of K: whole 128-K steps and groups of 8 tokens."""
    return -(-k // STEP_K) * -(-m // 8) * 512


class LinearW4A16Fragments(LinearW4A16):
    """`LinearW4A16` with `x_fragments`: call it with one more operand, the workspace of fragment_words(M, K) uint32
    that the call's x pass fills before the main kernel reads it."""

    @staticmethod
    def fake_operands(config):
        from cutlass.cute.runtime import make_fake_tensor

        operands = LinearW4A16.fake_operands(config)
        xf = make_fake_tensor(Uint32, (cute.sym_int(divisibility=512),), stride=(1,), assumed_align=16)
        return (*operands, xf)

    @cute.jit
    def __call__(self, mX: cute.Tensor, mW: cute.Tensor, mSF: cute.Tensor, mY: cute.Tensor, mGS: cute.Tensor,
                 mBias: cute.Tensor, mXF: cute.Tensor, stream=None):
        x_words, w_words, sf, m, n, k = self.views(mX, mW, mSF, mY)
        gm = (m + 7) // 8
        steps = (k + STEP_K - 1) // STEP_K
        xf = cute.make_tensor(mXF.iterator, cute.make_layout((steps, gm, 4, 8, 16), stride=(gm * 512, 512, 128, 16, 1)))
        prep = self.fragments_kernel(x_words, xf, m, k)
        main = self.kernel(xf, w_words, sf, mY, mGS, mBias, m, n, k)
        prep_shape = dict(grid=[steps, gm, 1], block=[CHUNK_THREADS, 1, 1])
        if const_expr(self.cfg.pdl):
            prep_shape["use_pdl"] = True
        launch(prep, prep_shape, stream)
        launch(main, dict(self.launch_shape(m, n), use_pdl=True), stream)

    @cute.kernel
    def fragments_kernel(self, x_words: cute.Tensor, xf: cute.Tensor, m: Int32, k: Int32):
        """CTA (s, g): the chunks (v, t, c) of step s, token group g; thread c + 4t + 32v loads x elements 128s + 32c
        + 8v.. of token 8g + t (16 bytes), pairs them and stores them at (s, g, v, t, c)."""
        cute.arch.griddepcontrol_launch_dependents()
        if const_expr(self.cfg.pdl):
            cute.arch.griddepcontrol_wait()  # x, or the workspace, may belong to the grid before
        tidx, _, _ = cute.arch.thread_idx()
        s, g, _ = cute.arch.block_idx()
        c = tidx & 3
        t = (tidx >> 2) & 7
        v = tidx >> 5
        tok = 8 * g + t
        if tok < m and s * STEP_K + 32 * c + 8 * v < k:
            u = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
            cute.copy(load_atom(Uint32, 128), cute.local_tile(x_words[tok, None], (4,), (16 * s + 4 * c + v,)), u)
            o = cute.make_rmem_tensor(cute.make_layout(4), Uint32)
            for i, (a, b) in enumerate(PAIRS[self.cfg.mma_dtype]):
                o[i] = prmt(u[a // 2], u[b // 2], x_pair_selector(a, b))
            store = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), Uint32, num_bits_per_copy=128)
            cute.copy(store, o, cute.local_tile(xf[s, g, v, t, None], (4,), (c,)))
