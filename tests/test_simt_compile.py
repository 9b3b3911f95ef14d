"""The CUDA-core kernels compiled on the CPU: PTX properties for sm_90a (the H200 build), the sm_100a variant, and
the TMA-fed alternative (cute_kernels.gemv_tma), and the streaming-read roofline kernel (cute_kernels.stream_read).

The DSL assembles the PTX with its own ptxas for the target, so a successful sm_90a compile also proves that the
kernel uses no instruction sm_90 lacks; the asserts below pin what the design depends on."""

import re

import pytest

pytestmark = pytest.mark.slow

PTX_ENV = {"CUTE_DSL_KEEP": "ptx"}


@pytest.fixture(scope="module")
def ptx_of(tmp_path_factory):
    """PTX text of a compiled config, compiled in a child process (CUTE_DSL_KEEP must be set before import)."""
    import json
    import os
    import subprocess
    import sys

    dump = tmp_path_factory.mktemp("dump")
    cache = {}

    def get(gpu_arch, sf_kind="permuted", kernel="simt", call="tvm_ffi", **kw):
        key = (gpu_arch, sf_kind, kernel, call, tuple(sorted(kw.items())))
        if key not in cache:
            module, cls, config = {
                "simt": ("gemv_simt", "GemvSimt", f"g.GemvSimtConfig(sf_kind={sf_kind!r}, "),
                "tma": ("gemv_tma", "GemvTma", "g.GemvTmaConfig("),
                "stream_read": ("stream_read", "StreamRead", "g.StreamReadConfig("),
                "balanced": ("gemv_simt", "GemvSimtBalanced", f"g.GemvSimtConfig(sf_kind={sf_kind!r}, "),
            }[kernel]
            code = (
                "import json, sys\n"
                "from cute_kernels.compile import compile_kernel\n"
                f"from cute_kernels import {module} as g\n"
                f"cfg = {config}**json.loads({json.dumps(json.dumps(kw))}))\n"
                f"sys.stdout.write(compile_kernel(g.{cls}, cfg, {gpu_arch!r}, call={call!r}).__ptx__)\n"
            )
            env = dict(os.environ, CUTE_DSL_DUMP_DIR=str(dump), **PTX_ENV)
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
            assert out.returncode == 0, out.stderr[-3000:]
            cache[key] = out.stdout
        return cache[key]

    return get


def _count(ptx, pattern):
    return len(re.findall(pattern, ptx))


@pytest.mark.parametrize("sf_kind", ["permuted", "plain"])
def test_sm90a_ptx(ptx_of, sf_kind):
    ptx = ptx_of("sm_90a", sf_kind)
    assert ".target sm_90a" in ptx
    # A arrives in 16-byte vector loads that skip L1 allocation; no scalar or narrower loads of A.
    assert _count(ptx, r"ld\.global\.L1::no_allocate\.v4\.b32") >= 4
    assert _count(ptx, r"ld\.local|st\.local") == 0
    assert _count(ptx, r"dp4a\.s32\.s32") > 0 and _count(ptx, r"prmt\.b32") > 0
    assert _count(ptx, r"cvt\.rn\.f16x2\.e4m3x2") > 0  # sm_89+ scale decode
    assert _count(ptx, r"cvt\.rn\.f32\.s32") == 0  # block sums become fp32 by the exact 1.5·2²³ trick, not I2F
    for sm100_only in (r"e2m1x2", r"tcgen05", r"cp\.async\.bulk", r"\.f16x2\.e2m1"):
        assert _count(ptx, sm100_only) == 0, sm100_only
    # No float atomics: the reduction order is fixed.
    assert _count(ptx, r"\b(atom|red)\.") == 0
    if sf_kind == "permuted":
        # The (q, jj) scale run of one r is one 16-byte load too.
        assert _count(ptx, r"ld\.global\.L1::no_allocate\.v4\.b32") >= 5


@pytest.mark.parametrize("gpu_arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("splits", [1, 4])
def test_k_split_meets_in_cluster_shared_memory(ptx_of, gpu_arch, splits):
    """K split over a cluster's CTAs: rank 0 reads the other ranks' row sums from their shared memory (mapa +
    ld.shared::cluster, one read per other rank, in rank order), between two cluster barriers; no atomics, and no
    global workspace. Without a split, none of it."""
    for call in ("tvm_ffi", "pointers"):
        ptx = ptx_of(gpu_arch, "permuted", call=call, warps=4, r_lanes=2, k_splits=splits)
        assert _count(ptx, r"mapa\.shared::cluster") == _count(ptx, r"ld\.shared::cluster\.f32") == splits - 1
        assert _count(ptx, r"barrier\.cluster\.arrive\.release") == (2 if splits > 1 else 0)
        assert _count(ptx, r"barrier\.cluster\.wait\.acquire") == (2 if splits > 1 else 0)
        assert _count(ptx, r"\b(atom|red)\.") == 0
        assert _count(ptx, r"ld\.local|st\.local") == 0


def test_sm100a_cuda_core_variant_uses_the_hardware_fp4_decode(ptx_of):
    ptx = ptx_of("sm_100a")
    assert ".target sm_100a" in ptx
    assert _count(ptx, r"cvt\.rn\.f16x2\.e2m1x2") > 0
    assert _count(ptx, r"fma\.rn\.f16x2") > 0
    assert _count(ptx, r"dp4a|prmt") == 0
    assert _count(ptx, r"ld\.local|st\.local") == 0


@pytest.mark.parametrize("gpu_arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("sf_kind", ["permuted", "plain"])
def test_pointer_call_path_builds_the_same_kernel(ptx_of, gpu_arch, sf_kind):
    """The raw-pointer entry (GPU MODE's runner has no TVM-FFI) builds the same views: the kernel's memory
    instructions and math are the TVM-FFI build's, count for count."""
    tvm, ptr = ptx_of(gpu_arch, sf_kind), ptx_of(gpu_arch, sf_kind, call="pointers")
    for pattern in (r"ld\.global\S*\.v4\.b32", r"ld\.global", r"st\.global", r"dp4a", r"prmt", r"e2m1x2",
                    r"fma\.rn\.f16x2", r"ld\.local|st\.local", r"shfl"):
        assert _count(ptr, pattern) == _count(tvm, pattern), pattern


def test_one_compile_serves_every_shape():
    from cute_kernels import gemv_simt as g
    from nvfp4_gemv.dispatch import simt_config_for, simt_configs
    from nvfp4_gemv.shapes import BENCH_SHAPES, DECODE_SUITE, ODD_SHAPES, TEST_SHAPES

    shapes = list(TEST_SHAPES) + [s.mkl for s in BENCH_SHAPES + DECODE_SUITE] + list(ODD_SHAPES)
    # The config depends on the shape only through the dispatch model's finite set; M and L stay dynamic in every
    # compiled kernel, so a handful of compiles serves every shape.
    assert {simt_config_for(*s) for s in shapes} <= set(simt_configs()) and len(simt_configs()) == 11
    assert all(g.GemvSimt.can_implement(*s) for s in shapes)
    assert not g.GemvSimt.can_implement(128, 96, 1) and not g.GemvSimt.can_implement(0, 256, 1)


def test_one_launch_method_takes_an_optional_stream():
    """Every kernel launches through one `__call__(..., stream=None)`; the library passes torch's current stream
    (TVM-FFI's environment stream), the contest nothing (the default stream)."""
    import inspect

    from cute_kernels import gemv_simt, gemv_tc_sm100, gemv_tma, stream_read

    for cls in (gemv_simt.GemvSimt, gemv_tma.GemvTma, gemv_tc_sm100.GemvTcSm100, stream_read.StreamRead):
        last = list(inspect.signature(cls.__call__).parameters.values())[-1]
        assert last.name == "stream" and last.default is None, cls


@pytest.mark.parametrize("call,stream", [("tvm_ffi", None), ("tvm_ffi", "torch"), ("pointers", None)])
def test_compile_surface_caches_per_call_path_and_stream(call, stream):
    from cute_kernels import gemv_simt
    from cute_kernels.compile import compile_kernel
    from nvfp4_gemv.dispatch import simt_config_for

    cfg = simt_config_for(7168, 2048, 4)
    compiled = compile_kernel(gemv_simt.GemvSimt, cfg, "sm_90a", call=call, stream=stream)
    assert compiled is compile_kernel(gemv_simt.GemvSimt, cfg, "sm_90a", call=call, stream=stream)  # cached
    other = compile_kernel(gemv_simt.GemvSimt, cfg, "sm_100a", call=call, stream=stream)
    assert other is not compiled  # the target is part of the key
    # TVM-FFI keeps an unpassed `stream=None` as a parameter; raw_function supplies it so callers pass 5 operands.
    from cute_kernels import compile as surface

    expected = 1 if (call, stream) == ("tvm_ffi", None) else 0
    assert surface._TRAILING_NONE.get(id(compiled), 0) == expected


def test_tensor_core_kernel_compiles_for_sm100a_on_each_path():
    """The library's Blackwell path (torch's current stream) and the pointer path build on the CPU."""
    from cute_kernels import gemv_tc_sm100 as tc
    from cute_kernels.compile import compile_kernel

    for kw in ({"stream": "torch"}, {"call": "pointers"}):
        compiled = compile_kernel(tc.GemvTcSm100, tc.GemvTcSm100Config(), "sm_100a", **kw)
        assert compiled is compile_kernel(tc.GemvTcSm100, tc.GemvTcSm100Config(), "sm_100a", **kw)


@pytest.mark.parametrize("kw", [{}, {"pieces": 2, "stages": 2, "ctas": 0}, {"decode": False}], ids=str)
def test_tma_kernel_sm90a_ptx(ptx_of, kw):
    ptx = ptx_of("sm_90a", kernel="tma", **kw)
    assert ".target sm_90a" in ptx
    # Seven TMA copies a stage, completed on mbarriers; A and its scales carry the evict-first L2 policy.
    assert _count(ptx, r"cp\.async\.bulk\.tensor\.\dd\.shared::cta\.global\.tile\.mbarrier::complete_tx::bytes") >= 7
    assert _count(ptx, r"createpolicy\.fractional\.L2::evict_first") >= 1
    assert _count(ptx, r"mbarrier\.try_wait\.parity") >= 2 and _count(ptx, r"mbarrier\.arrive") >= 2
    assert _count(ptx, r"ld\.local|st\.local") == 0
    assert _count(ptx, r"ld\.global") == 0  # every operand arrives by TMA
    if kw.get("decode", True):
        assert _count(ptx, r"ld\.shared\.v4\.b32") >= 11  # 8 rows of A, 2 scale quads, b: 128-bit shared reads
        assert _count(ptx, r"dp4a\.s32\.s32") > 0 and _count(ptx, r"prmt\.b32") > 0
    else:
        assert _count(ptx, r"dp4a") == 0
    for sm100_only in (r"e2m1x2", r"tcgen05"):
        assert _count(ptx, sm100_only) == 0, sm100_only
    assert _count(ptx, r"\b(atom|red)\.") == 0


@pytest.mark.parametrize("kw", [{}, {"unroll": 4, "load": "cs"}, {"row_chunks": 512}, {"row_chunks": 224, "unroll": 2},
                                {"pdl": True}, {"row_chunks": 512, "pdl": True}], ids=str)
def test_stream_read_sm90a_ptx(ptx_of, kw):
    """The roofline kernel: unrolled 128-bit loads with the chosen qualifiers, nothing else touching memory but
    one guarded store. Read a warp a row, the row's trip count is known, so exactly `unroll` loads and no tail.
    Launched programmatically dependent (`pdl`), it waits once before its first load and signals once after its
    last, before the store."""
    ptx = ptx_of("sm_90a", kernel="stream_read", **kw)
    unroll = kw.get("unroll", 8)
    qualifier = {"cs": r"\.cs", "no_allocate": r"\.L1::no_allocate"}[kw.get("load", "no_allocate")]
    loads = _count(ptx, rf"ld\.global{qualifier}\.v4\.b32")
    if kw.get("row_chunks"):
        assert loads == unroll
    else:
        assert loads >= unroll + 1  # the unrolled body and the tail
    assert _count(ptx, r"ld\.global") == _count(ptx, r"ld\.global\S*\.v4\.b32")
    assert _count(ptx, r"st\.global") == 1
    assert _count(ptx, r"ld\.local|st\.local|ld\.shared|st\.shared") == 0
    pdl = kw.get("pdl", False)
    assert _count(ptx, r"griddepcontrol\.wait") == pdl and _count(ptx, r"griddepcontrol\.launch_dependents") == pdl
    if pdl:
        first_load, last_load = ptx.index("ld.global"), ptx.rindex("ld.global")
        assert ptx.index("griddepcontrol.wait") < first_load
        assert last_load < ptx.index("griddepcontrol.launch_dependents") < ptx.index("st.global")


# Registers ptxas (nvidia-cutlass-dsl 4.8.1) gives each config simt_configs() can dispatch, sm_90a: the builds whose
# H200 numbers BENCHMARKS.md reports. (warps, r_lanes, unroll, k_splits) -> registers, per scale layout.
MEASURED_REGISTERS = {
    "permuted": {(1, 2, 2, 1): 72, (2, 2, 2, 1): 63, (3, 2, 2, 1): 65, (4, 2, 2, 1): 63, (8, 2, 4, 1): 64,
                 (16, 2, 2, 1): 102, (16, 2, 1, 1): 53, (8, 2, 2, 1): 80, (8, 2, 2, 2): 74, (8, 2, 2, 4): 64,
                 (8, 2, 2, 8): 64},
    "plain": {(1, 2, 2, 1): 72, (2, 2, 2, 1): 71, (3, 2, 2, 1): 70, (4, 2, 2, 1): 71, (8, 2, 4, 1): 80,
              (16, 2, 2, 1): 110, (16, 2, 1, 1): 64, (8, 2, 2, 1): 73, (8, 2, 2, 2): 106, (8, 2, 2, 4): 78,
              (8, 2, 2, 8): 106},
}


def test_dispatched_configs_keep_the_measured_registers(tmp_path):
    """Every config dispatch can pick still compiles to the register count of the build that was measured. The count
    fingerprints ptxas's schedule: a change that looked free (a third word in each lane's LUT slot) moved the 2- and
    4-warp configs from 63 to 55 registers, issued their loads later, and cost 4 % over the decode suite on the H200
    (BENCHMARKS.md, "The decode on the FMA pipe, and how much the schedule matters"). If this fails, time the suite on
    the H200 before updating the table."""
    from concurrent.futures import ThreadPoolExecutor

    from nvfp4_gemv.dispatch import simt_configs
    from registers import compiled_registers

    jobs = [(kind, (c.warps, c.r_lanes, c.unroll, c.k_splits)) for kind in MEASURED_REGISTERS
            for c in simt_configs(kind)]
    assert set(jobs) == {(kind, key) for kind, t in MEASURED_REGISTERS.items() for key in t}

    def compile_one(job):
        kind, (w, r, u, s) = job
        args = f"sf_kind={kind!r}, warps={w}, r_lanes={r}, unroll={u}, k_splits={s}"
        return job, compiled_registers("gemv_simt", "GemvSimt", args, tmp_path / f"{kind}-{w}-{r}-{u}-{s}")

    with ThreadPoolExecutor(2) as pool:
        got = dict(pool.map(compile_one, jobs))
    changed = {job: (MEASURED_REGISTERS[job[0]][job[1]], regs) for job, regs in got.items()
               if regs != MEASURED_REGISTERS[job[0]][job[1]]}
    assert not changed, f"(layout, config): (measured build, now) registers: {changed}"


def test_register_table_of_the_split_configs_matches_ptxas():
    """nvfp4_gemv.dispatch.SPLIT_REGISTERS (which decides how large a split fits one wave) is what ptxas gives each
    8-warp split config the dispatch model may pick (sm_90a, rounded up to the allocation step of 8): the counts
    that test_dispatched_configs_keep_the_measured_registers checks against ptxas."""
    from nvfp4_gemv.dispatch import SPLIT_REGISTERS
    from registers import allocation

    for (sf_kind, splits), table in SPLIT_REGISTERS.items():
        assert allocation(MEASURED_REGISTERS[sf_kind][(8, 2, 2, splits)]) == table, (sf_kind, splits)


def test_register_tables_of_the_one_wave_configs_match_ptxas():
    """nvfp4_gemv.dispatch's WAVE_REGISTERS (what one resident wave of each many-rows config is) and U1_REGISTERS
    (whether two 16-warp CTAs without unroll share an SM) are what ptxas gives those configs (sm_90a, rounded up to
    the allocation step of 8), as pinned in MEASURED_REGISTERS."""
    from nvfp4_gemv import dispatch
    from registers import allocation

    for sf_kind, table in dispatch.WAVE_REGISTERS.items():
        for (w, r, u), regs in table.items():
            assert allocation(MEASURED_REGISTERS[sf_kind][(w, r, u, 1)]) == regs, (sf_kind, w, r, u)
    for sf_kind, regs in dispatch.U1_REGISTERS.items():
        assert allocation(MEASURED_REGISTERS[sf_kind][(16, 2, 1, 1)]) == regs, sf_kind


@pytest.mark.parametrize("gpu_arch", ["sm_90a", "sm_100a"])
@pytest.mark.parametrize("call", ["tvm_ffi", "pointers"])
def test_balanced_kernel_shares_tiles_without_atomics_or_fences(ptx_of, gpu_arch, call):
    """GemvSimtBalanced (not dispatched; the K-balanced schedule) compiles for both archs and call paths. A shared
    tile's partials travel as relaxed 32-bit stores and loads of the workspace, with no atomics, fences or float
    reductions anywhere, and A still arrives in 16-byte loads that skip L1."""
    ptx = ptx_of(gpu_arch, kernel="balanced", call=call, warps=2, r_lanes=2, unroll=2, max_registers=64)
    assert f".target {gpu_arch}" in ptx
    assert _count(ptx, r"st\.relaxed\.gpu\.global\.b32") >= 2  # the partial, and PARTIAL_EMPTY put back
    assert _count(ptx, r"ld\.relaxed\.gpu\.global\.b32") >= 1
    assert _count(ptx, r"\b(atom|red)\.") == 0 and _count(ptx, r"\b(membar|fence)\.") == 0
    assert _count(ptx, r"ld\.global\.L1::no_allocate\.v4\.b32") >= 4
    assert ".maxntid" in ptx or ".minnctapersm" in ptx


def test_balanced_register_caps_hold(tmp_path):
    """ptxas keeps every GemvSimtBalanced config of dispatch.BALANCED_CONFIGS at its register cap (the cap is what
    balanced_num_ctas counts resident CTAs by)."""
    from nvfp4_gemv.dispatch import BALANCED_CONFIGS
    from registers import compiled_registers

    for w, u, cap in BALANCED_CONFIGS:
        args = f"sf_kind='permuted', warps={w}, r_lanes=2, unroll={u}, max_registers={cap}"
        regs = compiled_registers("gemv_simt", "GemvSimtBalanced", args, tmp_path / f"{w}-{u}-{cap}", "GemvSimtConfig")
        assert regs <= cap, (w, u, cap, regs)


def test_stream_read_row_order_checks():
    """The warp-a-row read takes whole rows of whole 512-byte pieces, and says so."""
    from cute_kernels.stream_read import StreamRead, StreamReadConfig

    for bad in (-32, 16, 48):
        with pytest.raises(ValueError, match="row_chunks"):
            StreamReadConfig(row_chunks=bad)
    assert StreamRead.can_implement(7 * 224 * 16, 224)
    assert not StreamRead.can_implement(7 * 224 * 16 + 16 * 32, 224)
    assert StreamRead.can_implement(16) and not StreamRead.can_implement(16, 32)
