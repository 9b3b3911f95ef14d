"""Tests of the single-file submission generator: determinism, embedded sources equal to the project's through the
contest transform, imports limited to torch / the CuTe DSL / the standard library, the contest's word filter, import
and kernel compiles (sm_90a, sm_100a) from an empty folder with the project off the path, the self-test command,
and (on a GPU) the contest check on every test shape. test_runner_stacks.py runs the file under GPU MODE's DSLs."""

import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

from submission import generate
from submission.generate import BUNDLE_PACKAGE, GenerateError, collect_modules, contest_source, generate_submission

PROJECT = str(generate.PROJECT_ROOT)
ALLOWED_TOP = {"torch", "cutlass", "tvm_ffi", BUNDLE_PACKAGE} | set(sys.stdlib_module_names)


@pytest.fixture(scope="module")
def text():
    return generate_submission()


def _embedded(text):
    """The generated file's _SOURCES dict, read with ast (the file is not imported)."""
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "_SOURCES":
            return ast.literal_eval(node.value)
    raise AssertionError("no _SOURCES in the generated file")


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield node.module


# ---------------------------------------------------------------- the text


def test_generation_is_deterministic(text, tmp_path):
    assert generate_submission() == text
    path = generate.write_submission(tmp_path / "submission.py")
    assert path.read_bytes() == text.encode("utf-8")
    assert b"\r" not in path.read_bytes()
    assert " at 0x" not in text and "/work/" not in text  # no object reprs, no paths of this machine


def test_header_states_the_tested_dsl_releases_and_the_selftest(text):
    from cute_kernels.compile import TESTED_DSL

    head = "\n".join(text.splitlines()[:5])
    assert "nvidia-cutlass-dsl 4.3.5, 4.5.2, 4.8.1" in head and TESTED_DSL == ("4.3.5", "4.5.2", "4.8.1")
    assert "--selftest-compile sm_90a" in head
    assert f"TESTED_DSL = {TESTED_DSL!r}" in text
    assert "__version__" not in text  # 4.3 has no cutlass.__version__; the release comes from package metadata


def test_embeds_exactly_the_modules_kernel_needs_in_dependency_order(text):
    sources = _embedded(text)
    assert list(sources) == [n for n, _ in collect_modules()]
    assert set(sources) >= {
        "layouts.sf_cute", "cute_kernels.compile", "cute_kernels.decode", "cute_kernels.tile_scheduler",
        "cute_kernels.gemv_simt", "cute_kernels.gemv_tc_sm100", "cute_kernels.tc_workspace", "nvfp4_gemv.validate",
        "nvfp4_gemv.dispatch", "submission.contest",
    }  # fmt: skip
    # the library's host-side tools never ride along; the runtime is top-level code, not an embedded module
    assert "submission.reference" in sources  # the fp32 reference, for the first-contact check on Blackwell
    assert not set(sources) & {"nvfp4_gemv.bench", "nvfp4_gemv.cli", "submission.generate",
                               "nvfp4_gemv.op", "nvfp4_gemv.kernel", "submission.bundle_runtime",
                               "cute_kernels.gemv_tma", "cute_kernels.stream_read"}
    seen = set()
    for name, src in sources.items():
        needs = set()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.ImportFrom) and node.module.startswith(BUNDLE_PACKAGE + "."):
                mod = node.module[len(BUNDLE_PACKAGE) + 1 :]
                needs |= {f"{mod}.{a.name}" if f"{mod}.{a.name}" in sources else mod for a in node.names}
        assert needs - {name} <= seen, f"{name} needs {needs - seen} before it"
        if name == "nvfp4_gemv.dispatch":
            assert {"nvfp4_gemv.validate", "cute_kernels.gemv_simt", "cute_kernels.gemv_tc_sm100"} <= needs
        seen.add(name)


def test_embedded_sources_are_the_project_files_through_the_contest_transform(text):
    sources = _embedded(text)
    for name, src in sources.items():
        path = os.path.join(PROJECT, *name.split(".")) + ".py"
        with open(path, encoding="utf-8") as f:
            original = f.read()
        assert src == contest_source(original, name)
        # Same code: the transform only redirects imports, binds `stream` and drops docstrings and LIBRARY_ONLY.
        assert ast.dump(ast.parse(src)).count("FunctionDef") <= ast.dump(ast.parse(original)).count("FunctionDef")


def test_runtime_is_the_tested_module(text):
    runtime = generate.contest_source(generate._read(generate.RUNTIME_MODULE, generate.PROJECT_ROOT))
    assert runtime.replace("def compile_for_arch(", "def _compile_for_arch(", 1) in text


def test_imports_only_torch_dsl_and_stdlib(text):
    trees = [ast.parse(text)] + [ast.parse(s) for s in _embedded(text).values()]
    tops = {m.split(".")[0] for t in trees for m in _imports(t)}
    assert tops <= ALLOWED_TOP, tops - ALLOWED_TOP
    assert not tops & set(generate.PROJECT_PACKAGES)
    assert {"torch", "cutlass", BUNDLE_PACKAGE} <= tops


# ---------------------------------------------------------------- the contest transform


def test_transform_redirects_project_imports_only():
    src = textwrap.dedent(
        '''\
        """Docstring · with non-ASCII µ."""
        import os
        from layouts.closed_form import (
            atom_offset,
            plain_offset as po,
        )
        x = "from layouts import sf_cute"  # a string, not an import


        def f():
            σ = 1; from cute_kernels import decode as d  # noqa
            import cute_kernels.decode as dec
            return σ, d, dec
        '''
    )
    out = contest_source(src)
    assert f"from {BUNDLE_PACKAGE}.layouts.closed_form import atom_offset, plain_offset as po" in out
    assert f"from {BUNDLE_PACKAGE}.cute_kernels import decode as d" in out
    assert f"import {BUNDLE_PACKAGE}.cute_kernels.decode as dec" in out
    assert "import os" in out and "x = 'from layouts import sf_cute'" in out  # the string is left alone
    assert "Docstring" not in out and "noqa" not in out


def test_transform_binds_stream_to_the_default_one():
    src = textwrap.dedent(
        '''\
        def launch(call, shape, stream=None):
            """Launch on `stream`."""
            if stream is None:
                call.launch(**shape)
            else:
                call.launch(**shape, stream=stream)


        def after(a, stream=None, *, b=2):
            launch(a, {}, stream=stream)
            return (a, b, stream)


        def only_kw(x, *rest, stream=None):
            return after(x, stream=stream)


        def _torch_stream():
            return make_fake_stream()


        LIBRARY_ONLY = ("_torch_stream",)
        '''
    )
    out = contest_source(src)
    assert "stream" not in out.lower()
    ns = {}
    exec(out, ns)
    calls = []

    class Call:
        def launch(self, **kw):
            calls.append(kw)

    call = Call()
    ns["launch"](call, {"grid": 1})
    assert calls == [{"grid": 1}]
    assert ns["after"](call) == (call, 2, None) and ns["only_kw"](call) == (call, 2, None)
    assert calls == [{"grid": 1}, {}, {}]
    assert "LIBRARY_ONLY" not in ns


@pytest.mark.parametrize(
    "src,match",
    [
        ("from .decode import prmt\n", "relative import"),
        ("import os, layouts.sf_cute as s\n", "mixes project and other modules"),
        ("import layouts.sf_cute\n", "binds the top-level package"),
        ("def f(stream):\n    pass\n", "must default to None"),
        ("def f(stream=1):\n    pass\n", "must default to None"),
        ("stream = 3\n", "assigns"),
    ],
)
def test_transform_refuses_forms_it_cannot_keep(src, match):
    with pytest.raises(GenerateError, match=match):
        contest_source(src)


def _tree(root, files):
    for rel, src in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(src)
    return root


def test_collect_orders_dependencies_first_and_finds_function_level_imports(tmp_path):
    root = _tree(tmp_path, {
        "layouts/__init__.py": "",
        "layouts/z.py": "X = 1\n",
        "cute_kernels/__init__.py": "",
        "cute_kernels/k.py": "from layouts.z import X\n",
        "submission/__init__.py": "",
        "submission/v.py": "import os\n",
        "submission/kernel.py": "from submission.v import os\ndef f():\n    from cute_kernels import k\n",
    })  # fmt: skip
    order = [n for n, _ in collect_modules("submission.kernel", root)]
    assert order == ["layouts.z", "submission.v", "cute_kernels.k", "submission.kernel"]


def test_collect_refuses_a_cycle(tmp_path):
    root = _tree(tmp_path, {
        "submission/__init__.py": "",
        "submission/kernel.py": "from submission import v\n",
        "submission/v.py": "from submission import kernel\n",
    })  # fmt: skip
    with pytest.raises(GenerateError, match="import cycle"):
        collect_modules("submission.kernel", root)


@pytest.mark.parametrize("src", ["plain\n", "ends with a quote'", "has ''' inside", "ends with \\", "tab\t\\n µ"])
def test_source_literals_round_trip(src):
    assert ast.literal_eval(generate._literal(src)) == src


# ---------------------------------------------------------------- the file in a clean interpreter

BOOT = r"""
import importlib.util, inspect, json, os, sys
folder, out_dir, project = sys.argv[1:4]
# A clean interpreter: no editable-install finder, no project folder, nothing but the submission's folder.
sys.meta_path[:] = [
    f for f in sys.meta_path
    if not (f.__module__ if isinstance(f, type) else type(f).__module__).startswith("__editable__")
]
sys.path[:] = [folder] + [p for p in sys.path if p not in ("", project)]
res = {"project_findable": [n for n in ("layouts", "cute_kernels") if importlib.util.find_spec(n) is not None]}

import submission
res["file"] = submission.__file__
res["custom_kernel_params"] = list(inspect.signature(submission.custom_kernel).parameters)
res["call_path"] = submission.embedded(submission._PACKAGE, "submission.contest").DISPATCH.call
try:
    submission.compile_for_arch("sm_80a")
except ValueError as e:
    res["bad_arch"] = str(e)
for arch, variant in (("sm_90a", "simt"), ("sm_100a", "simt"), ("sm_100a", "tc")):
    ptx = submission.compile_for_arch(arch, variant).__ptx__ or ""
    if "\n" not in ptx and os.path.isfile(ptx):  # some DSL paths give the dumped file's name
        with open(ptx) as f:
            ptx = f.read()
    with open(f"{out_dir}/{arch}_{variant}.ptx", "w") as f:
        f.write(ptx)
res["project_modules"] = sorted(
    n for n, m in sys.modules.items() if (getattr(m, "__file__", None) or "").startswith(project + "/")
)
with open(f"{out_dir}/result.json", "w") as f:
    json.dump(res, f)
"""


@pytest.fixture(scope="module")
def clean_run(text, tmp_path_factory):
    """Run BOOT once: import the file from an empty folder and compile three kernels (about 20 s)."""
    folder = tmp_path_factory.mktemp("empty")
    out = tmp_path_factory.mktemp("out")
    (folder / "submission.py").write_text(text, encoding="utf-8")
    (out / "dump").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CUTE_DSL"))}
    env.update(CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(out / "dump"))
    proc = subprocess.run(
        [sys.executable, "-I", "-c", BOOT, str(folder), str(out), PROJECT],
        cwd=folder, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads((out / "result.json").read_text())
    res["ptx"] = {p.stem: p.read_text() for p in out.glob("*.ptx")}
    res["folder"] = str(folder)
    return res


@pytest.mark.slow
def test_imports_from_an_empty_folder_without_the_project(clean_run):
    assert clean_run["project_findable"] == []
    assert clean_run["file"] == os.path.join(clean_run["folder"], "submission.py")
    assert clean_run["custom_kernel_params"][0] == "data"
    assert clean_run["project_modules"] == []


@pytest.mark.slow
def test_calls_through_tvm_ffi_where_it_imports_and_checks_the_arch(clean_run):
    assert clean_run["call_path"] == "tvm_ffi"  # this environment has apache-tvm-ffi; test_runner_stacks has none
    assert "sm_90a" in clean_run["bad_arch"] and "sm_80a" in clean_run["bad_arch"]


@pytest.mark.slow
def test_selftest_compile_command(text, tmp_path):
    (tmp_path / "submission.py").write_text(text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CUTE_DSL"))}
    run = [sys.executable, "-I", "submission.py", "--selftest-compile"]
    proc = subprocess.run(run + ["sm_90a"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("nvidia-cutlass-dsl 4.8.1, target sm_90a, call path tvm_ffi")
    from nvfp4_gemv.dispatch import simt_configs

    assert len(lines) == 1 + len(simt_configs()) and all(ln.startswith("ok ") and "gemv_simt" in ln for ln in lines[1:])
    bad = subprocess.run(run + ["sm_89"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "usage:" in bad.stderr


@pytest.mark.slow
def test_sm90a_kernel_is_the_cuda_core_decode(clean_run):
    ptx = clean_run["ptx"]["sm_90a_simt"]
    assert ".target sm_90a" in ptx
    assert "dp4a.s32.s32" in ptx and "prmt.b32" in ptx
    assert "ld.local" not in ptx  # no spills
    assert "tcgen05" not in ptx and "e2m1x2" not in ptx


@pytest.mark.slow
def test_sm100a_tensor_core_kernel(clean_run):
    ptx = clean_run["ptx"]["sm_100a_tc"]
    assert ".target sm_100a" in ptx
    mma = [ln for ln in ptx.splitlines() if "tcgen05.mma" in ln]
    assert mma and all("kind::mxf4nvf4" in ln and "block_scale.block16" in ln for ln in mma)


@pytest.mark.slow
def test_sm100a_cuda_core_kernel_uses_hardware_fp4_decode(clean_run):
    ptx = clean_run["ptx"]["sm_100a_simt"]
    assert ".target sm_100a" in ptx
    assert "cvt.rn.f16x2.e2m1x2" in ptx and "fma.rn.f16x2" in ptx
    assert "dp4a" not in ptx and "tcgen05" not in ptx and "ld.local" not in ptx


# ---------------------------------------------------------------- on a GPU: the contest's check


@pytest.mark.gpu
def test_generated_submission_passes_the_contest_check(text, tmp_path):
    import torch

    from submission.reference import check, generate_input, ref_kernel
    from nvfp4_gemv.shapes import TEST_SHAPES

    path = generate.write_submission(tmp_path / "submission.py")
    spec = importlib.util.spec_from_file_location("nvfp4_gemv_generated_submission", path)
    sub = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sub)
    for m, k, l in TEST_SHAPES:
        data = generate_input(m, k, l, seed=m + k + l, device="cuda")
        data[-1].fill_(float("nan"))
        out = sub.custom_kernel(data)
        torch.cuda.synchronize()
        assert out.data_ptr() == data[-1].data_ptr()
        ref_data = list(data)
        ref_data[-1] = torch.empty_like(data[-1])
        ref = ref_kernel(tuple(ref_data))
        ok, msg = check(out, ref)
        assert ok, f"{(m, k, l)}: {msg}"
        assert torch.equal(out, ref), (m, k, l)  # exact on contest data


def test_policy_findings_locate_the_forbidden_word():
    text = "a = 1\n# Stream-K here\nb = 2\nx.upstream()\n"
    assert generate.contest_policy_findings(text) == [(2, "# Stream-K here"), (4, "x.upstream()")]


def test_generated_file_passes_the_contest_word_filter(text):
    assert generate.contest_policy_findings(text) == []


# Modules Python 3.13 no longer has (PEP 594's dead batteries, and imp and distutils, gone in 3.12): GPU MODE's
# runner has 3.13, this machine only 3.11, so the file is checked for them here.
REMOVED_BY_313 = {
    "aifc", "audioop", "cgi", "cgitb", "chunk", "crypt", "imghdr", "mailcap", "msilib", "nis", "nntplib",
    "ossaudiodev", "pipes", "sndhdr", "spwd", "sunau", "telnetlib", "uu", "xdrlib", "lib2to3", "imp", "distutils",
}  # fmt: skip


def test_generated_file_imports_nothing_python_313_removed(text):
    trees = [ast.parse(text)] + [ast.parse(s) for s in _embedded(text).values()]
    tops = {m.split(".")[0] for t in trees for m in _imports(t)}
    assert not tops & REMOVED_BY_313
    assert "importlib.abc" in {m for t in trees for m in _imports(t)}  # still in 3.13 (MetaPathFinder, InspectLoader)


def test_selftest_reports_a_failing_kernel_and_exits_nonzero(monkeypatch):
    """`--selftest-compile` prints one line per kernel and returns 1 if any fails (here a kernel class whose
    compile raises), 0 otherwise; the runtime is exercised on the project's own modules."""
    import importlib

    from nvfp4_gemv.dispatch import simt_configs
    from submission import bundle_runtime

    class Broken:
        def __init__(self, config, target):
            raise RuntimeError("no such instruction")

    monkeypatch.setattr(bundle_runtime, "embedded", lambda prefix, name: importlib.import_module(name))
    real = bundle_runtime.dispatched_kernels
    monkeypatch.setattr(bundle_runtime, "dispatched_kernels", lambda p, a: real(p, a)[:1] + [("broken", Broken, None)])
    lines = []
    assert bundle_runtime.selftest_compile("", "sm_90a", out=lines.append) == 1
    assert lines[0].startswith("nvidia-cutlass-dsl 4.8.1, target sm_90a, call path ")
    assert lines[1].startswith("ok ") and lines[2].startswith("FAIL") and "no such instruction" in lines[2]
    assert len(real("", "sm_90a")) == len(simt_configs())
    with pytest.raises(ValueError, match="gpu arch must be one of"):
        real("", "sm_89")


def test_a_missing_dsl_feature_is_a_one_line_import_error_naming_it():
    from cute_kernels import compile as surface

    with pytest.raises(ImportError, match=r"^nvidia-cutlass-dsl \S+ has no cutlass.nope.Thing or cutlass.Nope, "
                                          r"which nvfp4-gemv needs$"):
        surface._first(("cutlass.nope", "Thing"), ("cutlass", "Nope"))
    assert surface._first(("cutlass.nope", "Thing"), ("cutlass", "Int32")) is surface.cutlass.Int32


def test_no_file_points_outside_the_project():
    """The contract is the project's own page (docs/contract.md); nothing refers to files beside the checkout."""
    root = generate.PROJECT_ROOT
    for path in list(root.glob("*.md")) + list(root.glob("*/*.py")) + list(root.glob("notebooks/*.ipynb")):
        if path.name != "test_generate.py":  # this test names the string it looks for
            assert "../shared" not in path.read_text(encoding="utf-8"), path
