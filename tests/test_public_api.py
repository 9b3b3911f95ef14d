"""The library's public API: `import nvfp4_gemv` names the entry points, loads them on first use (not the CuTe DSL
at import), and refuses unknown names."""

import subprocess
import sys

import pytest


def test_import_is_light_and_names_resolve():
    code = (
        "import sys, nvfp4_gemv\n"
        "assert 'cutlass' not in sys.modules and 'nvfp4_gemv.kernel' not in sys.modules\n"
        "from nvfp4_gemv.kernel import custom_kernel\n"
        "from nvfp4_gemv.op import nvfp4_gemv as op\n"
        "assert nvfp4_gemv.custom_kernel is custom_kernel and nvfp4_gemv.gemv is op\n"
        "print(sorted(nvfp4_gemv.__all__))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(["custom_kernel", "gemv", "select_kernel", "validate_inputs", "validate_operands"])


def test_unknown_names_are_refused():
    import nvfp4_gemv

    with pytest.raises(AttributeError, match="no attribute 'gemm'"):
        nvfp4_gemv.gemm  # noqa: B018
