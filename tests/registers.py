"""What the compiler makes of a kernel, for tests: the registers a thread takes as ptxas allocates them for sm_90a
(tests that check a dispatch model's register table against the compiler), and a kernel's PTX for any arch."""

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


def compiled_registers(module: str, cls: str, config_args: str, dump, config_cls: str | None = None) -> int:
    """Registers ptxas gives a thread of that kernel for sm_90a, as it reports them (not rounded). The config class
    is `<cls>Config` unless `config_cls` names another."""
    dump.mkdir(parents=True)
    config_cls = config_cls or f"{cls}Config"
    code = (
        "from cute_kernels.compile import compile_kernel\n"
        f"from cute_kernels.{module} import {cls}, {config_cls}\n"
        f"compile_kernel({cls}, {config_cls}({config_args}), 'sm_90a')\n"
    )
    env = dict(os.environ, CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=str(dump))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (cubin,) = dump.glob("*.cubin")
    (regs,) = _elf_register_counts(cubin.read_bytes())
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


def compiled_registers_all(module: str, cls: str, config_args: str, dump, config_module: str,
                           config_cls: str) -> list:
    """Registers ptxas gives each kernel the compiled call launches (sm_90a), with the config class taken from
    another module."""
    dump.mkdir(parents=True)
    code = (
        "from cute_kernels.compile import compile_kernel\n"
        f"from cute_kernels.{module} import {cls}\n"
        f"from cute_kernels.{config_module} import {config_cls}\n"
        f"compile_kernel({cls}, {config_cls}({config_args}), 'sm_90a')\n"
    )
    env = dict(os.environ, CUTE_DSL_KEEP="cubin", CUTE_DSL_DUMP_DIR=str(dump))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (cubin,) = dump.glob("*.cubin")
    return _elf_register_counts(cubin.read_bytes())


def compiled_ptx(module: str, cls: str, config_kwargs: dict, arch: str, dump) -> str:
    """The PTX of `cute_kernels.<module>.<cls>(<cls>Config(**config_kwargs))` for `arch`, compiled as the library
    compiles it (TVM-FFI, torch's stream) in a child process (CUTE_DSL_KEEP must be set before the DSL loads)."""
    import json

    code = (
        "import json, sys\n"
        "from cute_kernels.compile import compile_kernel\n"
        f"from cute_kernels.{module} import {cls}, {cls}Config\n"
        f"cfg = {cls}Config(**json.loads({json.dumps(json.dumps(config_kwargs))}))\n"
        f"p = compile_kernel({cls}, cfg, {arch!r}, stream='torch').__ptx__\n"
        "sys.stdout.write(open(p).read() if p and p.endswith('.ptx') else p)\n"
    )
    env = dict(os.environ, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(dump))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def compiled_ptx_of(module: str, cls: str, config_module: str, config_cls: str, config_kwargs: dict, arch: str,
                    dump) -> str:
    """compiled_ptx for a kernel class whose config class lives in another module (the PTX of every kernel the
    compiled call launches)."""
    import json

    code = (
        "import json, sys\n"
        "from cute_kernels.compile import compile_kernel\n"
        f"from cute_kernels.{module} import {cls}\n"
        f"from cute_kernels.{config_module} import {config_cls}\n"
        f"cfg = {config_cls}(**json.loads({json.dumps(json.dumps(config_kwargs))}))\n"
        f"p = compile_kernel({cls}, cfg, {arch!r}, stream='torch').__ptx__\n"
        "sys.stdout.write(open(p).read() if p and p.endswith('.ptx') else p)\n"
    )
    env = dict(os.environ, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(dump))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout
