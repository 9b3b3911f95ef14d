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


def _readme_linear_example() -> str:
    """The README's linear example: the indented block that quantizes a weight and builds an FP4Linear."""
    from pathlib import Path

    lines = (Path(__file__).resolve().parent.parent / "README.md").read_text().splitlines()
    start = lines.index("    from nvfp4_gemv.linear import FP4Linear, fp4_linear, quantize_nvfp4") - 1
    block = []
    for line in lines[start:]:
        if line and not line.startswith("    "):
            break
        block.append(line[4:])
    return "\n".join(block).strip()


def test_readme_linear_example_on_the_cpu():
    code = _readme_linear_example().replace(".cuda()", "").replace('device="cuda"', 'device="cpu"')
    assert "FP4Linear.from_quantized" in code and "layer(x)" in code
    scope = {}
    exec(code, scope)
    assert scope["y"].shape == (2, 4096) and scope["layer"].path(2) == "reference (cpu)"
    assert scope["layer"].global_scale.shape == ()  # what the GPU test below runs through the kernel


@pytest.mark.gpu
def test_readme_linear_example_on_the_gpu():
    """The example as written (ModelOpt-style 0-dim global scale, `.cuda()` on the module), and its float-scale
    alternative in the comment, give the same numbers."""
    import torch

    scope = {}
    exec(_readme_linear_example(), scope)
    y, layer, x = scope["y"], scope["layer"], scope["x"]
    assert y.is_cuda and y.shape == (2, 4096) and layer.global_scale.shape == ()  # the 0-dim scale, on the kernel
    from nvfp4_gemv.linear import fp4_linear

    q, sf, gs = scope["q"], scope["sf"], scope["gs"]
    assert torch.equal(y, fp4_linear(x, q.cuda(), sf.cuda(), "nvfp4", gs.item()))
