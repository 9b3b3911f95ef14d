"""What the compiler makes of a kernel, for tests: the registers a thread takes as ptxas allocates them for sm_90a
(tests that check a dispatch model's register table against the compiler), the spill loads and stores in the MMA
loops of an sm_90a build, and a kernel's PTX for any arch."""

import json
import os
import subprocess
import sys


def allocated_registers(module: str, cls: str, config_args: str, dump) -> int:
    """Registers a thread of `cute_kernels.<module>.<cls>(<cls>Config(<config_args>))` gets for sm_90a, rounded up
    to the allocation step of 8; compiled in a child process (CUTE_DSL_KEEP must be set before the DSL loads)."""
    return allocation(compiled_registers(module, cls, config_args, dump))


def allocation(registers: int) -> int:
    """Registers a thread holds as the SM allocates them: ptxas's count rounded up to the step of 8."""
    return -(-registers // 8) * 8


def _compile_in_child(module: str, cls: str, config: str, arch: str, keep: str, dump, config_module: str | None,
                      config_cls: str | None, tail: str = "", stream: str | None = None, prelude: str = "") -> str:
    """Compile `cute_kernels.<module>.<cls>` on `<config_cls>(<config>)` (by default the kernel module's
    `<cls>Config`) for `arch` in a child process with CUTE_DSL_KEEP=`keep` (set before the DSL loads); `prelude` is
    code run after the imports (it may rebind `<cls>`, e.g. to a subclass), `tail` more code run on the compiled
    object `c`. Returns the child's stdout."""
    code = (
        "import json, sys\n"
        "from cute_kernels.compile import compile_kernel\n"
        f"from cute_kernels.{module} import {cls}\n"
        f"from cute_kernels.{config_module or module} import {config_cls or cls + 'Config'}\n"
        + prelude
        + f"c = compile_kernel({cls}, {config_cls or cls + 'Config'}({config}), {arch!r}, stream={stream!r})\n"
        + tail
    )
    env = dict(os.environ, CUTE_DSL_KEEP=keep, CUTE_DSL_DUMP_DIR=str(dump))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def compiled_registers_all(module: str, cls: str, config_args: str, dump, config_module: str | None = None,
                           config_cls: str | None = None) -> list:
    """Registers ptxas gives each kernel the compiled call launches (sm_90a), as it reports them (not rounded). The
    config class is `<cls>Config` of the kernel's module unless `config_module` / `config_cls` name another."""
    dump.mkdir(parents=True)
    _compile_in_child(module, cls, config_args, "sm_90a", "cubin", dump, config_module, config_cls)
    (cubin,) = dump.glob("*.cubin")
    return _elf_register_counts(cubin.read_bytes())


def compiled_registers(module: str, cls: str, config_args: str, dump, config_cls: str | None = None) -> int:
    """Registers ptxas gives a thread of that one-kernel call for sm_90a, as it reports them (not rounded). The
    config class is `<cls>Config` unless `config_cls` names another."""
    (regs,) = compiled_registers_all(module, cls, config_args, dump, None, config_cls)
    return regs


def _elf_register_counts(data: bytes):
    """EIATTR_REGCOUNT (0x2f) values of a cubin's .nv.info sections."""
    import struct

    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = secs[shstrndx][4]
    counts = []
    for sec in secs:
        name = data[strtab + sec[0] : data.index(b"\0", strtab + sec[0])].decode()
        if not name.startswith(".nv.info"):
            continue
        p, end = sec[4], sec[4] + sec[5]
        while p + 4 <= end:
            fmt, attr = data[p], data[p + 1]
            size = struct.unpack_from("<H", data, p + 2)[0]
            if fmt == 4:
                if attr == 0x2F:
                    counts.append(struct.unpack_from("<II", data, p + 4)[1])
                p += 4 + size
            else:
                p += 4
    return counts


def compiled_ptx(module: str, cls: str, config_kwargs: dict, arch: str, dump, config_module: str | None = None,
                 config_cls: str | None = None, prelude: str = "") -> str:
    """The PTX of `cute_kernels.<module>.<cls>(<cls>Config(**config_kwargs))` for `arch` (every kernel the call
    launches), compiled as the library compiles it (TVM-FFI, torch's stream) in a child process; `prelude` as
    `_compile_in_child` takes it."""
    config = f"**json.loads({json.dumps(json.dumps(config_kwargs))})"
    tail = "p = c.__ptx__\nsys.stdout.write(open(p).read() if p and p.endswith('.ptx') else p)\n"
    return _compile_in_child(module, cls, config, arch, "ptx", dump, config_module, config_cls, tail, "torch", prelude)


def k_loop_spills(dump) -> list[int]:
    """Spill loads and stores (LDL, STL) in each MMA loop of the cubin a compiled_registers_all call left in `dump`:
    the SASS (nvdisasm, from the nvidia-cuda-nvdisasm wheel the test extras install) between a loop's label and the
    backward branch to it, for each loop with an HMMA in it (nvfp4_gemv.linear.loops.mma_loops)."""
    from nvfp4_gemv.artifacts import _nvdisasm
    from nvfp4_gemv.linear.loops import mma_loops

    nvdisasm = _nvdisasm()
    assert nvdisasm, "nvdisasm not found: install the test extras (nvidia-cuda-nvdisasm)"
    (cubin,) = dump.glob("*.cubin")
    sass = subprocess.run([nvdisasm, "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    return [sum(op in ("LDL", "STL") for op in ops) for ops in mma_loops(sass)]
