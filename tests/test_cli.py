"""CPU tests of the `nvfp4-gemv` CLI: `check` without a GPU (notice, reference numbers against float64, compiles),
`compile --arch sm_90a` (PTX, cubin and instruction counts), `bench` without a GPU (floor table = bytes/bandwidth,
bench.csv, roofline PNG), `submission` wiring, the instruction counter and the plot data, and argument errors."""

import contextlib
import csv
import io
import math
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest
import torch

from layouts.constants import SF_KINDS
from nvfp4_gemv import artifacts, cli, plots, report
from submission.fp64_reference import fp64_gemv
from nvfp4_gemv import shapes as shapes_mod
from submission.reference import FP4_E2M1_LUT, generate_full_range, ref_kernel
from nvfp4_gemv.shapes import BENCH_SHAPES, TEST_SHAPES, bytes_moved

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the CLI's no-GPU path")


def run_main(argv):
    """(exit code, stdout) of cli.main(argv) in this process."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli.main(argv)
    return rc, buf.getvalue()


def table_rows(text, first_header):
    """Rows of the table whose header line starts with `first_header`, split on runs of 2+ spaces."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(first_header))
    n_cols = len(re.split(r"\s{2,}", lines[start].strip()))
    rows = []
    for ln in lines[start + 2:]:
        cells = re.split(r"\s{2,}", ln.strip())
        if len(cells) != n_cols:
            break
        rows.append(cells)
    return rows


# ---- check without a GPU ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def check_cpu():
    return run_main(["check", "--shapes", "contest", "--sf", "permuted"])


@cpu_only
def test_check_prints_one_notice_and_passes(check_cpu):
    rc, out = check_cpu
    assert rc == 0
    notices = [ln for ln in out.splitlines() if "No CUDA GPU" in ln]
    assert len(notices) == 1 and out.splitlines()[0] == notices[0]
    assert "CPU part only" in notices[0]


@cpu_only
def test_check_reference_table_numbers(check_cpu):
    _, out = check_cpu
    rows = table_rows(out, "shape (M,K,L)")
    assert len(rows) == len(TEST_SHAPES) * len(cli.DATA_KINDS)
    assert {r[0] for r in rows} == {str(s) for s in TEST_SHAPES}
    assert all(r[2] == "permuted" and r[4] == "pass" for r in rows)
    # Contest data: fp32 sums are exact, so the reference equals the float64 GEMV bit for bit.
    assert all(float(r[3]) == 0.0 for r in rows if r[1] == "contest")
    errs = {(r[0], r[1]): float(r[3]) for r in rows}
    # Full range: the error is the fp32-vs-float64 rounding, at most one fp16 ulp of the largest outputs.
    assert errs[(str((2432, 4608, 2)), "full")] > 0
    assert errs[(str((512, 4096, 2)), "full")] == errs[(str((512, 4096, 2)), "full+nan")]


@cpu_only
def test_check_full_range_error_matches_an_independent_recomputation(check_cpu):
    """The printed max abs err of one full-range row equals |ref - fp16(float64)| recomputed here with torch."""
    _, out = check_cpu
    rows = {(r[0], r[1]): r[3] for r in table_rows(out, "shape (M,K,L)")}
    n = TEST_SHAPES.index((512, 4096, 2))
    m, k, l = TEST_SHAPES[n]  # noqa: E741
    data = generate_full_range(m, k, l, seed=1000 + n)  # the seed the CLI uses for the n-th shape
    ref = ref_kernel(data).double()
    lut = torch.tensor(FP4_E2M1_LUT, dtype=torch.float64)
    au, bu = data[0].view(torch.uint8), data[1].view(torch.uint8)[0]
    a = torch.stack((lut[(au & 15).long()], lut[(au >> 4).long()]), 2).reshape(m, k, l)
    a = a * data[2].double().repeat_interleave(16, 1)
    b = torch.stack((lut[(bu & 15).long()], lut[(bu >> 4).long()]), 1).reshape(k, l)
    b = b * data[3][0].double().repeat_interleave(16, 0)
    exact = (a * b[None]).sum(1).to(torch.float16).double()
    err = float((ref[:, 0, :] - exact).abs().max())
    assert err > 0
    assert float(rows[(str((m, k, l)), "full")]) == pytest.approx(err, rel=1e-5)


@cpu_only
def test_check_compiles_kernels_for_both_targets(check_cpu):
    _, out = check_cpu
    rows = {r[0]: r for r in table_rows(out, "kernel")}
    assert set(rows) == {"gemv_simt_sm_90a_permuted", "gemv_tc_sm100a_permuted", "gemv_simt_sm_100a_permuted"}
    assert all(r[3] == "ok" for r in rows.values())
    assert {r[1] for r in rows.values()} == {"sm_90a", "sm_100a"}


@cpu_only
def test_check_fails_when_the_reference_is_off_by_one_ulp(monkeypatch):
    import submission.reference as reference

    real = reference.ref_kernel

    def off(data):
        c = real(data)
        c.view(torch.int16)[0, 0, 0] += 1  # one fp16 ulp: within tolerance, but not bit-exact on contest data
        return c

    monkeypatch.setattr(reference, "ref_kernel", off)
    monkeypatch.setattr(shapes_mod, "TEST_SHAPES", ((128, 256, 1),))
    monkeypatch.setattr(artifacts, "kernel_builders", lambda arch, sf_kinds=SF_KINDS: [])
    rc, out = run_main(["check", "--sf", "plain"])
    assert rc == 1
    rows = {r[1]: r for r in table_rows(out, "shape (M,K,L)")}
    assert rows["contest"][4].startswith("FAIL: not bit-exact")
    assert rows["full"][4] == "pass"  # one ulp passes the contest tolerance


def test_fp64_gemv_reads_the_permuted_buffer():
    """Both scale sources give the same float64 result; corrupting one permuted byte moves exactly its row."""
    data = generate_full_range(129, 320, 2, seed=7)
    plain, perm = fp64_gemv(data, "plain"), fp64_gemv(data, "permuted")
    np.testing.assert_array_equal(plain, perm)
    sfa_p = data[4].view(torch.uint8)
    # Index (r, q, mb, jj, g, l): row r + 32q + 128mb, scale column jj + 4g, batch l.
    sfa_p[5, 0, 1, 3, 4, 1] ^= 0x08  # row 133 >= M = 129: padding, no effect
    np.testing.assert_array_equal(fp64_gemv(data, "permuted"), plain)
    sfa_p[0, 0, 1, 3, 4, 1] ^= 0x08  # row 128, scale column 19, batch 1
    changed = np.argwhere(fp64_gemv(data, "permuted") != plain)
    assert changed.tolist() == [[128, 1]]


# ---- compile ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compiled_sm90(tmp_path_factory):
    out = tmp_path_factory.mktemp("sm90a")
    (out / "notes.txt").write_text("a file that was there before")
    rc, text = run_main(["compile", "--arch", "sm_90a", "--out", str(out)])
    return rc, text, out


def summary_counts(text):
    """{kernel: {instruction: count}} from the PTX table of a summary."""
    rows = table_rows(text, "instruction")
    header = re.split(r"\s{2,}", next(ln for ln in text.splitlines() if ln.startswith("instruction")).strip())
    return {k: {r[0]: int(r[i + 1]) for r in rows} for i, k in enumerate(header[1:])}


def test_compile_sm90a_writes_ptx_cubin_and_summary(compiled_sm90):
    rc, text, out = compiled_sm90
    assert rc == 0
    for sf in ("permuted", "plain"):
        ptx = (out / f"gemv_simt_sm_90a_{sf}.ptx").read_text()
        assert ".target sm_90a" in ptx
        assert (out / f"gemv_simt_sm_90a_{sf}.cubin").read_bytes()[:4] == b"\x7fELF"
    assert (out / "summary.txt").read_text() in text
    wrote = next(ln for ln in text.splitlines() if ln.startswith("wrote "))
    assert "notes.txt" not in wrote and "gemv_simt_sm_90a_plain.ptx" in wrote  # only what this command wrote


def test_compile_sm90a_instruction_counts(compiled_sm90):
    _, _, out = compiled_sm90
    counts = summary_counts((out / "summary.txt").read_text())
    assert set(counts) == {"gemv_simt_sm_90a_permuted", "gemv_simt_sm_90a_plain"}
    for name, c in counts.items():
        assert c["dp4a"] > 0 and c["prmt"] > 0, name  # the integer fp4 path
        assert c["ld.local"] == 0 and c["st.local"] == 0, name  # no spills, no local arrays
        assert c["ld.global.v4"] + c["cp.async.ca/cg"] > 0, name  # A in 16-byte accesses (to registers or shared)
        assert c["cvt.rn.f16x2.e2m1x2"] == 0 and c["tcgen05.mma"] == 0, name  # sm_100a-only instructions
        # The counter agrees with a plain text count of the PTX.
        ptx = (out / f"{name}.ptx").read_text()
        assert c["dp4a"] == len(re.findall(r"^\s*(?:@\S+\s+)?dp4a\.", ptx, re.M))


def test_instruction_counts_on_a_ptx_snippet():
    ptx = """
    .version 8.8
    // ld.local.u32 in a comment
    $L__BB0_1:
        ld.global.nc.L1::no_allocate.v4.u32 {%r1, %r2, %r3, %r4}, [%rd1];
        ld.global.v4.b32 {%r5, %r6, %r7, %r8}, [%rd2];
        ld.global.b32 %r9, [%rd3];
        @%p1 ld.local.u32 %r10, [%rd4];
        @!%p2 st.local.u32 [%rd4], %r10;
        dp4a.s32.s32 %r11, %r1, %r2, %r3;
        prmt.b32 %r12, %r1, %r2, %r3;
        tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16 [%r1], %rd1, %rd2, %r2, [%r3], [%r4], p;
        atom.global.acq_rel.add.u32 %r13, [%rd5], 1;
        cp.async.cg.shared.global [%r10+13568], [%rd22], 16, 16;
        cp.async.commit_group;
    """
    c = artifacts.instruction_counts(ptx)
    assert (c["ld.global.v4"], c["ld.global"], c["ld.local"], c["st.local"]) == (2, 3, 1, 1)
    assert (c["dp4a"], c["prmt"], c["tcgen05.mma"], c["atom/red"], c["fma.rn.f32"]) == (1, 1, 1, 1, 0)
    assert c["cp.async.ca/cg"] == 1


# ---- bench without a GPU ---------------------------------------------------------------------------------------


@cpu_only
def test_bench_without_gpu_prints_floor_table(tmp_path):
    rc, out = run_main(["bench", "--out", str(tmp_path)])
    assert rc == 0
    assert len([ln for ln in out.splitlines() if "No CUDA GPU" in ln]) == 1
    assert "nominal" in out and "4.8 TB/s" in out
    rows = table_rows(out, "shape (M,K,L)")
    assert [r[0] for r in rows] == [str(s.mkl) for s in BENCH_SHAPES]
    for r, s in zip(rows, BENCH_SHAPES):
        nb = bytes_moved(*s.mkl)
        assert int(r[1]) == nb
        assert float(r[3]) == pytest.approx(nb / 4.8e12 * 1e6, abs=0.0005)
        assert float(r[4]) == s.b200_sol_us
    with open(tmp_path / "bench.csv") as f:
        recs = list(csv.DictReader(f))
    assert [(int(x["m"]), int(x["k"]), int(x["l"])) for x in recs] == [s.mkl for s in BENCH_SHAPES]
    for x in recs:
        assert float(x["floor_us"]) == pytest.approx(int(x["bytes"]) / 4.8e12 * 1e6, rel=1e-12)
        assert math.isnan(float(x["contest_us"]))
    png = (tmp_path / "roofline.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@cpu_only
def test_bench_given_bandwidth_and_shapes(tmp_path):
    rc, out = run_main(["bench", "--shapes", "128,256,1", "512,4096,2", "--bandwidth", "2", "--out", str(tmp_path)])
    assert rc == 0
    assert "given" in out and "nominal" not in out
    rows = table_rows(out, "shape (M,K,L)")
    assert [float(r[3]) for r in rows] == [round(bytes_moved(*s) / 2e12 * 1e6, 3) for s in ((128, 256, 1),
                                                                                           (512, 4096, 2))]


def test_plot_data_is_the_floor_and_the_timed_points():
    rows = report.floor_rows([(7168, 2048, 4), (4096, 7168, 8)], 4e12, "given")
    rows.append({**rows[0], "variant": "x", "contest_us": 9.0, "graph_us": float("nan")})
    xs, ys = plots.floor_line(rows, 4e12, points=5)
    assert xs[0] == bytes_moved(7168, 2048, 4) / 2 and xs[-1] == pytest.approx(bytes_moved(4096, 7168, 8) * 2)
    assert ys == pytest.approx([x / 4e12 * 1e6 for x in xs])
    assert plots.series(rows) == {("x", "contest timing"): [(bytes_moved(7168, 2048, 4), 9.0)]}


# ---- submission and argument errors -----------------------------------------------------------------------------


def test_submission_writes_submission_py_into_its_own_folder(monkeypatch, tmp_path):
    calls = []

    def write_submission(path):
        calls.append(path)
        path.write_text("# generated\n")

    monkeypatch.setitem(sys.modules, "submission.generate", types.SimpleNamespace(write_submission=write_submission))
    rc, out = run_main(["submission", "--out", str(tmp_path / "upload")])
    assert rc == 0 and calls == [tmp_path / "upload" / "submission.py"]
    assert "12 bytes" in out
    # The default is a folder, so the file never lands where it would hide the project's `submission` package.
    monkeypatch.chdir(tmp_path)
    calls.clear()
    assert run_main(["submission"])[0] == 0
    assert calls == [cli.Path(cli.SUBMISSION_OUT) / "submission.py"] and not (tmp_path / "submission.py").exists()


def test_default_outputs_are_git_ignored():
    ignored = (cli.Path(__file__).resolve().parent.parent / ".gitignore").read_text().split()
    assert f"/{cli.SUBMISSION_OUT}/" in ignored and "/bench-out/" in ignored


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "required"),
        (["bench", "--shapes", "128,100,1"], "K must be a multiple of 64"),
        (["bench", "--shapes", "128,256"], "M,K,L"),
        (["bench", "--iters", "0"], "--iters: must be >= 1"),
        (["bench", "--iters", "x"], "--iters: expected a whole number"),
        (["bench", "--bandwidth", "-1"], "--bandwidth: must be a positive finite"),
        (["bench", "--bandwidth", "0"], "--bandwidth: must be a positive finite"),
        (["bench", "--bandwidth", "nan"], "--bandwidth: must be a positive finite"),
        (["bench", "--bandwidth", "inf"], "--bandwidth: must be a positive finite"),
        (["compile", "--arch", "sm_80", "--out", "x"], "invalid choice"),
        (["compile", "--arch", "sm_90a"], "--out"),
        (["check", "--sf", "blocked"], "invalid choice"),
        (["sweep", "--timing", "wall"], "invalid choice"),
        (["sweep", "--iters", "0"], "--iters: must be >= 1"),
        (["ab", "no_such_run"], "invalid choice"),
        (["ab"], "the following arguments are required"),
        (["ab", "token_tiles", "--rounds", "0"], "--rounds: must be >= 1"),
        (["probes", "--shapes", "4096,100"], "K a positive multiple of 64"),
        (["probes", "--shapes", "0,4096"], "N >= 1"),
        (["probes", "--shapes", "4096"], "N,K (two integers)"),
        (["probes", "--formats", "int4"], "invalid choice"),
        (["probes", "--tokens", "0"], "--tokens: must be >= 1"),
        (["loops", "--read-tbs", "0"], "--read-tbs: must be a positive finite"),
        (["loops", "--clock-ghz", "nan"], "--clock-ghz: must be a positive finite"),
        (["loops", "--sms", "0"], "--sms: must be >= 1"),
        (["loops", "--shapes", "4096,100"], "K a positive multiple of 64"),
        (["loops", "--x-dtype", "fp32"], "invalid choice"),
    ],
)
def test_argument_errors_exit_nonzero(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    if argv and argv[0] == "bench":
        assert err.startswith("usage: nvfp4-gemv bench")  # bench's own usage, not the top-level one


def test_ab_without_gpu_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: `ab` would time kernels")
    assert cli.main(["ab", "token_tiles", "chunk_bytes"]) == 1
    assert "an A/B run times kernels" in capsys.readouterr().err


def test_probes_without_gpu_says_so(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: `probes` would time kernels")
    assert cli.main(["probes", "--shapes", "4096,4096"]) == 1
    assert "load probes time kernels" in capsys.readouterr().err


def test_ab_runs_name_their_points(monkeypatch, tmp_path):
    """Every run `nvfp4-gemv ab` offers, with the timer stubbed: each writes its CSV of the points it would time
    (the counts are the launcher's rules at this commit on the bench's shapes; a changed rule changes them)."""
    from nvfp4_gemv.linear import bench

    monkeypatch.setattr(bench, "_time", lambda factory: 1.0)
    counts = {}
    for name, (_, run) in bench.AB_RUNS.items():
        rows = run(rounds=1, csv_path=tmp_path / f"{name}.csv", log=lambda *a: None)
        assert (tmp_path / f"{name}.csv").exists()
        counts[name] = len(rows)
    assert counts == dict(k_warps=18, x_fragments=168, x_fragments_few=48, fragments_fp16=24, mx_fold=104, one_group=20,
                          fragments_capped_64=45, fragments_capped_96=6, token_tiles=60, chunk_bytes=210,
                          register_partitions=6, held_out=82, k_parts_many=300, w_l2_prefetch=96, shifts_on_fma=144,
                          pdl=76, pdl_fragments=44, pdl_variants=10,
                          mx_fold_bf16=108, mx_fold_designs=52, columns_or_fold=26,
                          one_group_fold=18, mx_fold_min_cap=22,
                          mx_fold_uncapped=22, zero_blocks=60, zero_blocks_fp16=40)


def test_ab_runs_build_their_configs(monkeypatch):
    """The A/B runs that override the scale fold or the kernel (the fold's runs, x in fragment order against block
    columns): every config they would time is a valid one, the launcher's own check run on the CPU (the call that
    would time it builds its config instead)."""
    from nvfp4_gemv.linear import bench, kernels

    built = []

    def config_only(n, k, m, fmt, dtype=torch.bfloat16, **override):
        x_dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]
        built.append(kernels.config_for(m, n, k, fmt, "plain", x_dtype, False, fmt == "nvfp4", **override))
        return 1.0

    monkeypatch.setattr(bench, "ours", config_only)
    monkeypatch.setattr(bench, "_time", lambda factory: factory() if "ours" in factory.__code__.co_names else 1.0)
    for name in ("mx_fold", "mx_fold_bf16", "mx_fold_designs", "x_fragments", "columns_or_fold", "zero_blocks"):
        bench.AB_RUNS[name][1](rounds=1, csv_path=None, log=lambda *a: None)
    assert any(c.mx_fold_redo for c in built) and any(c.mx_fold and not c.mx_fold_redo for c in built)
    assert any(c.mx_fold_redo and not c.mx_fold_zero_blocks for c in built)
    assert any(c.block_columns for c in built) and any(not c.mx_fold and c.fmt == "mxfp4" for c in built)


def _ncu_csv(launches: list[tuple[str, str, str]]) -> str:
    """ncu's `--csv` details output: its log lines, then one quoted row a (launch, metric)."""
    import csv
    import io

    out = io.StringIO()
    out.write("==PROF== Connected to process 1\n==PROF== Profiling \"kernel\": 0%....100% - 9 passes\n")
    w = csv.writer(out, quoting=csv.QUOTE_ALL)
    w.writerow(["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
                "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"])
    for i, (time_ns, regs, issue) in enumerate(launches):
        for name, unit, value in (("gpu__time_duration.sum", "nsecond", time_ns),
                                  ("launch__registers_per_thread", "register/thread", regs),
                                  ("smsp__issue_active.avg.pct_of_peak_sustained_active", "%", issue)):
            w.writerow([str(i), "1", "python3", "127.0.0.1", "kernel_cutlass_kernel_x", "1", "7", "(256, 1, 1)",
                        "(132, 1, 1)", "0", "9.0", "Command line profiler metrics", name, unit, value])
    return out.getvalue()


@pytest.mark.slow
def test_loops_prints_the_k_loop_table_and_writes_its_csv(tmp_path, capsys):
    """`loops` compiles the dispatched configs here (no GPU) and prints each K loop's counts and needed shares; the
    shares follow from the counts by the model (loops.needed_shares), at the rate, SMs and clock given."""
    assert cli.main(["loops", "--shapes", "4096,4096", "--tokens", "1", "--formats", "nvfp4", "--read-tbs", "3.0",
                     "--sms", "132", "--clock-ghz", "1.98", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "g1 kw16 ks1 r0 t1" in out and "3.0 TB/s on 132 SMs at 1.98 GHz" in out
    with open(tmp_path / "linear_loops_bf16.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert (row["n"], row["k"], row["m"], row["fmt"], row["x"], row["loops"]) == ("4096", "4096", "1", "nvfp4", "bf16",
                                                                                  "1")
    from nvfp4_gemv.linear import loops

    issue, alu = loops.needed_shares(int(row["instructions"]), int(row["alu"]), 1152, 3.0, 132, 1.98)
    assert 150 <= int(row["instructions"]) <= 250
    assert float(row["issue_needed"]) == pytest.approx(issue, abs=1e-3)
    assert float(row["alu_needed"]) == pytest.approx(alu, abs=1e-3)


def test_ncu_table_keeps_each_points_last_launch():
    """The linear's ncu table: one row a point from the last of its launches, ncu's thousands separators read, the
    duration in µs, short names; a profile with a launch missing is an error, not a shifted table."""
    from nvfp4_gemv.linear import bench

    launches = [("45,000", "62", "60.5"), ("43,168", "62", "61.25"), ("9,000", "72", "40"), ("6,900", "72", "49")]
    rows = bench.ncu_table(_ncu_csv(launches), ["a", "b"], log=lambda *a: None)
    assert rows == [dict(point="a", us=pytest.approx(43.168), regs=62.0, **{"issue %": 61.25}),
                    dict(point="b", us=pytest.approx(6.9), regs=72.0, **{"issue %": 49.0})]
    with pytest.raises(ValueError, match="profiled 3 launches; 2 points make 2 each"):
        bench.ncu_table(_ncu_csv(launches[:3]), ["a", "b"])


def test_sweep_columns_name_their_timer():
    from nvfp4_gemv import bench

    assert bench.sweep_fields("graph")[-3:] == ("graph_us", "read_graph_us", "x_read")
    assert bench.sweep_fields("contest")[-3:] == ("contest_us", "read_contest_us", "x_read")
    assert bench._timer("graph", 50) is bench.graph_time_us
    with pytest.raises(ValueError, match="timing must be one of"):
        bench._timer("wall", 50)


@pytest.mark.parametrize("command", [["submission"], ["bench"], ["compile", "--arch", "sm_90a"]], ids=str)
@pytest.mark.parametrize(
    "make_out, message",
    [
        (lambda d: "", "empty string"),
        (lambda d: str(d / "missing" / "out"), "parent folder of"),
        (lambda d: str(d / "afile"), "is a file"),
        (lambda d: str(d / "afile" / "out"), "under a file"),
        (lambda d: str(d / "locked" / "out"), "no permission"),
    ],
    ids=["empty", "missing parent", "a file", "under a file", "no permission"],
)
def test_bad_out_paths_give_one_line_and_exit_2(command, make_out, message, tmp_path, monkeypatch, capsys):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "locked").mkdir()
    real_access = os.access
    # Permission bits do not bind root, which CI may run as: the check's own input, os.access, says "no" instead.
    monkeypatch.setattr(cli.os, "access", lambda p, mode: "locked" not in str(p) and real_access(p, mode))
    with pytest.raises(SystemExit) as e:
        cli.main([*command, "--out", make_out(tmp_path)])
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert message in lines[-1] and lines[-1].startswith(f"nvfp4-gemv {command[0]}: error: argument --out:")


def test_bad_out_path_from_the_console_has_no_traceback(tmp_path):
    (tmp_path / "afile").write_text("x")
    r = subprocess.run([sys.executable, "-m", "nvfp4_gemv.cli", "submission", "--out", str(tmp_path / "afile")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "is a file" in r.stderr and "Traceback" not in r.stderr


# ---- the Blackwell bring-up -------------------------------------------------------------------------------------


def test_bringup_verdict_keeps_only_variants_that_pass_every_probe(tmp_path, monkeypatch):
    """Stub variants on the CPU: the reference passes every probe; one that drops b's scales from column 0, one
    that reads b's row 1 instead of row 0, and one that crashes all fail; the verdict file records the survivors
    and dispatch then starts from the first of them."""
    from nvfp4_gemv import bringup, dispatch
    from submission.reference import ref_kernel

    def right(a, b, sa, sb, c):
        sfa, sfb = bringup.plain_scales(a, sa, sb)
        c.copy_(ref_kernel((a, b, sfa, sfb, sa, sb, c.clone())))

    def row1(a, b, sa, sb, c):  # an N = 8 MMA reading the wrong column of its accumulator
        sfa, sfb = bringup.plain_scales(a, sa, sb)
        c.copy_(ref_kernel((a, b.roll(-1, 0), sfa, sfb.roll(-1, 0), sa, sb, c.clone())))

    def unscaled_b(a, b, sa, sb, c):
        sfa, sfb = bringup.plain_scales(a, sa, sb)
        ones = torch.ones_like(sfb.float()).to(sfb.dtype)
        c.copy_(ref_kernel((a, b, sfa, ones, sa, sb, c.clone())))

    def crash(a, b, sa, sb, c):
        raise RuntimeError("illegal instruction")

    stubs = {"tc": row1, "tc128": unscaled_b, "simt": right, "x": crash}
    rows = bringup.run_bringup(lambda v, m, k, l: stubs[v], tuple(stubs), "cpu", log=lambda s: None)
    by = {(v, p): r for v, p, r in rows}
    assert all(by[("simt", p)] == "pass" for _, p, _ in rows)
    assert by[("tc", "NaN/huge in b rows 1..127")].startswith("FAIL")
    assert any(r.startswith("FAIL") for (v, _), r in by.items() if v == "tc128")
    assert all(r.startswith("FAIL: RuntimeError") for (v, _), r in by.items() if v == "x")
    passed = bringup.verdict(rows, tuple(stubs))
    assert passed == ["simt"]
    monkeypatch.setenv(bringup.VERDICT_ENV, str(tmp_path / "verdict.json"))
    monkeypatch.delenv("NVFP4_GEMV_SM100", raising=False)
    assert dispatch.default_sm100_variant() == "tc"  # nothing recorded yet: the design's default
    bringup.write_verdict(passed, "stub B200")
    assert bringup.read_verdict() == ["simt"] and dispatch.default_sm100_variant() == "simt"
    monkeypatch.setenv("NVFP4_GEMV_SM100", "tc128")
    assert dispatch.default_sm100_variant() == "tc128"  # the environment wins


@cpu_only
def test_bringup_command_without_a_gpu_checks_the_probes():
    rc, out = run_main(["check", "--bringup"])
    assert rc == 0 and "No CUDA GPU" in out.splitlines()[0]
    rows = table_rows(out, "variant")
    assert len(rows) == 15 and all(r[-1] == "pass" for r in rows)
    assert "passed every probe: reference" in out
