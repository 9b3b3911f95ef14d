"""The generated submission on GPU MODE's runner stacks: for each DSL release the runner has pinned (4.3.5 from
January 2026, 4.5.2 since June 2026), a fresh virtual environment with CPU torch and no apache-tvm-ffi (the runner
has none), the file imported with `python -I` from a folder where the project cannot be imported, and
`--selftest-compile` for both archs. Nothing is cached between runs: each run installs from the package index.

The runner has Python 3.13; this machine has only its own Python (3.11 here), so the venvs use that, and the file
keeps to syntax and modules that 3.13 still has (test_generate checks its imports). Set NVFP4_RUNNER_DSL to a
space-separated list to choose the releases (e.g. "4.5.2"), or to "none" to skip.
"""

import os
import subprocess
import sys
import time

import pytest

from nvfp4_gemv.dispatch import TC_CONFIGS, simt_configs
from submission.generate import generate_submission

pytestmark = pytest.mark.runner_stacks

RUNNER_DSL = ("4.3.5", "4.5.2")
# The runner image's cuda-python; torch there is 2.12.0 (CUDA), here the pinned CPU build.
RUNNER_PACKAGES = ("torch==2.13.0", "cuda-python==13.0.*")


def _releases():
    chosen = os.environ.get("NVFP4_RUNNER_DSL")
    if chosen is None:
        return RUNNER_DSL
    return () if chosen.strip() == "none" else tuple(chosen.split())


@pytest.fixture(scope="module")
def submission_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("upload")
    (folder / "submission.py").write_text(generate_submission(), encoding="utf-8")
    return folder


@pytest.mark.parametrize("dsl", _releases())
def test_generated_file_compiles_every_kernel_on_the_runner_stack(dsl, submission_file, tmp_path):
    venv = tmp_path / "venv"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-cache-dir"]
    install = subprocess.run(
        pip + [*RUNNER_PACKAGES, f"nvidia-cutlass-dsl=={dsl}"], capture_output=True, text=True, timeout=1800
    )
    assert install.returncode == 0, install.stderr[-3000:]
    installed = time.perf_counter() - t0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CUTE_DSL", "VIRTUAL_ENV"))}
    probe = "import importlib.util as u; print(u.find_spec('tvm_ffi') is None, u.find_spec('cute_kernels') is None)"
    out = subprocess.run([py, "-I", "-c", probe], cwd=submission_file, env=env, capture_output=True, text=True)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr  # no tvm-ffi, no project
    for arch in ("sm_90a", "sm_100a"):
        t1 = time.perf_counter()
        proc = subprocess.run(
            [py, "-I", "submission.py", "--selftest-compile", arch],
            cwd=submission_file, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
        lines = proc.stdout.splitlines()
        assert lines[0] == f"nvidia-cutlass-dsl {dsl}, target {arch}, call path pointers", lines[0]
        kernels = lines[1:]
        # every CUDA-core config dispatch can pick, and on sm_100a the tcgen05 variants
        expected = len(simt_configs()) + (len(TC_CONFIGS) if arch == "sm_100a" else 0)
        assert len(kernels) == expected and all(ln.startswith("ok ") for ln in kernels)
        print(f"DSL {dsl} {arch}: {len(kernels)} kernels in {time.perf_counter() - t1:.1f} s")
    print(f"DSL {dsl}: venv and install {installed:.0f} s, total {time.perf_counter() - t0:.0f} s")
