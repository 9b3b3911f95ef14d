"""Prototype: the CUDA-core GEMV loop with x as int16 (a shared power of two per 16-element block) and dp2a,
to measure whether a W4A16 M=1 path on CUDA cores reaches the read roofline. Scratch, not the library."""
import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32, Uint8, Uint32, const_expr
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from cute_kernels import decode
from cute_kernels import gemv_simt as G
from cute_kernels.ptx import asm_u32
from layouts.sf_cute import sf_layout_by_col


@dsl_user_op
def dp2a(a, b, c, hi: bool, *, loc=None, ip=None):
    mode = "hi" if hi else "lo"
    return Int32(asm_u32([a, b, c], f"dp2a.{mode}.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", loc, ip))


class GemvX16(G.GemvSimt):
    @staticmethod
    def fake_operands(config):
        from cutlass.cute.runtime import make_fake_tensor
        m = cute.sym_int()
        k = cute.sym_int(divisibility=64)
        fp4, e4m3 = cutlass.Float4E2M1FN, cutlass.Float8E4M3FN
        a = make_fake_tensor(fp4, (m, k, 1), stride=(k, 1, cute.sym_int(divisibility=64)), assumed_align=16)
        b = make_fake_tensor(cutlass.Int16, (1, k, 1), stride=(cute.sym_int(divisibility=64), 1, cute.sym_int(divisibility=64)), assumed_align=16)
        kc = cute.sym_int(divisibility=4)
        if config.sf_kind == "permuted":
            rm, rk = cute.sym_int(), cute.sym_int()
            sfa = make_fake_tensor(e4m3, (32, 4, rm, 4, rk, 1), stride=(16, 4, cute.sym_int(divisibility=512), 1, 512, cute.sym_int(divisibility=512)), assumed_align=16)
        else:
            sfa = make_fake_tensor(e4m3, (m, kc, 1), stride=(kc, 1, cute.sym_int(divisibility=4)), assumed_align=16)
        sfb = make_fake_tensor(Float32, (1, cute.sym_int(divisibility=4), 1), stride=(cute.sym_int(divisibility=4), 1, cute.sym_int(divisibility=4)), assumed_align=16)
        c = make_fake_tensor(cutlass.Float16, (m, 1, 1), stride=(1, 1, m), assumed_align=16)
        return a, b, sfa, sfb, c

    @cute.jit
    def views(self, mA, mB, mSFA, mSFB, mC):
        m, k, l = mA.shape
        a_words = cute.make_tensor(cute.recast_ptr(mA.iterator, dtype=Uint32),
                                   cute.make_layout((m, k // 8, l), stride=(mA.stride[0] // 8, 1, mA.stride[2] // 8)))
        b_words = cute.make_tensor(cute.recast_ptr(mB.iterator, dtype=Uint32),
                                   cute.make_layout((1, k // 2, l), stride=(mB.stride[0] // 2, 1, mB.stride[2] // 2)))
        sfa = cute.make_tensor(cute.recast_ptr(mSFA.iterator, dtype=Uint8), sf_layout_by_col(self.cfg.sf_kind, m, k, l))
        sfb = cute.make_tensor(mSFB.iterator, cute.make_layout((1, k // 16, l), stride=(mSFB.stride[0], 1, mSFB.stride[2])))
        c_ml = cute.make_tensor(mC.iterator, cute.make_layout((m, l), stride=(1, mC.stride[2])))
        return a_words, b_words, sfa, sfb, c_ml

    def make_buffers(self):
        return (
            cute.make_rmem_tensor(cute.make_layout((4, 4, self.rr)), Uint32),
            cute.make_rmem_tensor(cute.make_layout((4, 4, self.rr), stride=(4, 1, 16)), Uint8),
            cute.make_rmem_tensor(cute.make_layout(16), Uint32),
            cute.make_rmem_tensor(cute.make_layout(2), Float32),
        )

    @cute.jit
    def load_piece(self, bufs, a_words, b_words, sfa, sfb, piece, slab, r_first, m, bidl):
        cfg = self.cfg
        rA, rS, rB, rSB = bufs
        grp = piece // 2
        for i in cutlass.range_constexpr(self.rr):
            r = r_first + cfg.r_lanes * i
            for q in cutlass.range_constexpr(4):
                row = cutlass.min(slab * 128 + q * 32 + r, m - 1)
                self.load_once(cute.local_tile(a_words[row, None, bidl], (4,), (piece,)), rA[None, q, i])
            if const_expr(self.sf_padded):
                self.load_once(sfa[((r, None, slab), (None, grp), bidl)], rS[None, None, i])
            else:
                for q in cutlass.range_constexpr(4):
                    row = cutlass.min(slab * 128 + q * 32 + r, m - 1)
                    cute.autovec_copy(sfa[((row % 32, (row // 32) % 4, row // 128), (None, grp), bidl)], rS[q, None, i])
        cute.autovec_copy(cute.local_tile(b_words[0, None, bidl], (16,), (piece,)), rB)
        cute.autovec_copy(cute.local_tile(sfb[0, None, bidl], (2,), (piece,)), rSB)

    @cute.jit
    def compute_piece(self, bufs, acc, piece, luts):
        rA, rS, rB, rSB = bufs
        lo, hi = luts
        half = piece % 2
        for i in cutlass.range_constexpr(self.rr):
            sw = cute.recast_tensor(rS[None, None, i], Uint32)
            for q in cutlass.range_constexpr(4):
                sa0, sa1 = decode.e4m3x2_to_f32x2(Uint32(sw[q]) >> (half * 16))
                for j in cutlass.range_constexpr(2):
                    sc = (sa0 if j == 0 else sa1) * rSB[j]
                    pos = Int32(decode.MAGIC_BITS)
                    neg = Int32(0)
                    for w in cutlass.range_constexpr(2):
                        a = Uint32(rA[2 * j + w, q, i])
                        an = a ^ Uint32(decode.SIGN_BITS)
                        p_lo = decode.prmt(lo, hi, a)
                        n_lo = decode.prmt(lo, hi, an)
                        p_hi = decode.prmt(lo, hi, a >> 16)
                        n_hi = decode.prmt(lo, hi, an >> 16)
                        xw = [rB[8 * j + 4 * w + e] for e in range(4)]
                        pos = dp2a(xw[0], p_lo, pos, False)
                        neg = dp2a(xw[0], n_lo, neg, False)
                        pos = dp2a(xw[1], p_lo, pos, True)
                        neg = dp2a(xw[1], n_lo, neg, True)
                        pos = dp2a(xw[2], p_hi, pos, False)
                        neg = dp2a(xw[2], n_hi, neg, False)
                        pos = dp2a(xw[3], p_hi, pos, True)
                        neg = dp2a(xw[3], n_hi, neg, True)
                    s = Float32(llvm.bitcast(T.f32(), (pos - neg).ir_value())) - Float32(decode.MAGIC)
                    acc[i, q] = acc[i, q] + s * sc


def prep_x(x):
    """x (K,) float -> (X int16 (1, K, 1), factors float32 (1, K/16, 1)): X·2^e_b per 16-block, |X| <= 2^14;
    factor = 2^e_b / 2 (the lookup gives 2|v|)."""
    import torch
    k = x.numel()
    xb = x.float().view(k // 16, 16)
    amax = xb.abs().amax(1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax)) - 13, torch.zeros_like(amax))
    X = torch.round(xb / torch.exp2(e)[:, None]).to(torch.int16)
    f = (torch.exp2(e) / 2).float()
    return X.view(1, k, 1).contiguous(), f.view(1, k // 16, 1).contiguous()
