"""The runtime of the single-file submission: serves its embedded modules from memory, and checks a new image.

`submission.generate` embeds this module's source in the generated file after the embedded project sources, and
ends the file with `install(...)` and the entry point. It is importable and tested here as ordinary code.

- `EmbeddedModules` is a meta-path finder and loader for the private package the project's modules are embedded
  under, each its own module object, with a PEP 302 `get_source` so that `inspect.getsource` (which the CuTe DSL's
  preprocessor needs) and tracebacks see the embedded text.
- `selftest_compile(arch)` compiles, without a GPU, every kernel the file would dispatch on that arch, on the call
  path the file would use (TVM-FFI where it imports, else raw pointers): `python submission.py --selftest-compile
  sm_90a`.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import time


class EmbeddedModules(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    """Finds and loads `prefix` and its modules from `sources` (name -> text), with their text for `inspect`."""

    def __init__(self, prefix, sources, subpackages, origin_dir):
        self.prefix = prefix
        self.sources = sources
        self.subpackages = subpackages
        self.origin_dir = origin_dir

    def _name(self, fullname):
        if fullname == self.prefix:
            return ""
        if fullname.startswith(self.prefix + "."):
            name = fullname[len(self.prefix) + 1 :]
            if name in self.sources or name in self.subpackages:
                return name
        return None

    def is_package(self, fullname):
        name = self._name(fullname)
        return name == "" or name in self.subpackages

    def get_source(self, fullname):
        name = self._name(fullname)
        if name is None:
            raise ImportError(f"no embedded module {fullname}", name=fullname)
        return self.sources.get(name, "")

    def find_spec(self, fullname, path=None, target=None):
        name = self._name(fullname)
        if name is None:
            return None
        is_pkg = self.is_package(fullname)
        # A path inside the file: it never exists on disk, so linecache asks get_source (never a stale file).
        rel = (name.replace(".", "/") + "/__init__.py") if is_pkg else name.replace(".", "/") + ".py"
        origin = f"{self.origin_dir}/{rel.lstrip('/')}"
        spec = importlib.util.spec_from_loader(fullname, self, origin=origin, is_package=is_pkg)
        spec.has_location = True
        return spec

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        code = compile(self.get_source(module.__name__), module.__file__, "exec", dont_inherit=True)
        exec(code, module.__dict__)


def selftest_environment(argv, environ, cuda_available):
    """Before the DSL is imported: for `--selftest-compile ARCH` on a machine without a GPU, name an arch other
    than ARCH as this machine's (CUTE_DSL_ARCH, unless set). The DSL then only compiles; where the two agree, DSL
    4.3 also builds a JIT engine, which needs the CUDA driver."""
    if len(argv) >= 2 and argv[0] == "--selftest-compile" and not cuda_available:
        environ.setdefault("CUTE_DSL_ARCH", "sm_90a" if argv[1] == "sm_100a" else "sm_100a")


def install(prefix, sources, subpackages, origin_dir):
    """Put an EmbeddedModules for `prefix` first on sys.meta_path (replacing an earlier one for it)."""
    for finder in list(sys.meta_path):
        if isinstance(finder, EmbeddedModules) or getattr(finder, "prefix", None) == prefix:
            sys.meta_path.remove(finder)
    finder = EmbeddedModules(prefix, sources, subpackages, origin_dir)
    sys.meta_path.insert(0, finder)
    return finder


def embedded(prefix, name):
    """An embedded module by its project name, e.g. embedded(prefix, "cute_kernels.gemv_simt")."""
    return importlib.import_module(f"{prefix}.{name}")


def dispatched_kernels(prefix, gpu_arch):
    """(name, kernel class, config) of every kernel the contest entry can dispatch on `gpu_arch`."""
    compile_mod = embedded(prefix, "cute_kernels.compile")
    if gpu_arch not in compile_mod.GPU_ARCHS:
        raise ValueError(f"gpu arch must be one of {compile_mod.GPU_ARCHS}, got {gpu_arch!r}")
    dispatch = embedded(prefix, "nvfp4_gemv.dispatch")
    simt = embedded(prefix, "cute_kernels.gemv_simt")
    out = []
    for config in dispatch.simt_configs():
        out.append((f"gemv_simt {config}", simt.GemvSimt, config))
    if compile_mod.target(gpu_arch).family == "sm_100":
        tc = embedded(prefix, "cute_kernels.gemv_tc_sm100")
        for variant, config in dispatch.TC_CONFIGS.items():
            out.append((f"gemv_tc_sm100 ({variant}) {config}", tc.GemvTcSm100, config))
    return out


def compile_for_arch(prefix, gpu_arch, variant="simt", m=7168, k=16384, l=1):  # noqa: E741
    """Compile one dispatched kernel for `gpu_arch` without a GPU, on the contest entry's call path, and return
    the compiled object. sm_90a has variant "simt"; sm_100a has "simt" (hardware fp4 decode) and "tc" (tcgen05)."""
    compile_mod = embedded(prefix, "cute_kernels.compile")
    dispatch = embedded(prefix, "nvfp4_gemv.dispatch")
    contest = embedded(prefix, "submission.contest")
    tgt = compile_mod.target(gpu_arch)
    if variant == "simt":
        simt = embedded(prefix, "cute_kernels.gemv_simt")
        kernel_cls, config = simt.GemvSimt, dispatch.simt_config_for(m, k, l)
    elif variant in dispatch.TC_CONFIGS and tgt.family == "sm_100":
        tc = embedded(prefix, "cute_kernels.gemv_tc_sm100")
        kernel_cls, config = tc.GemvTcSm100, dispatch.TC_CONFIGS[variant]
    else:
        raise ValueError(f"no {variant!r} kernel for {gpu_arch}: sm_90a has 'simt', sm_100a has 'simt', "
                         f"{', '.join(repr(v) for v in dispatch.TC_CONFIGS)}")
    return compile_mod.compile_kernel(kernel_cls, config, tgt, call=contest.DISPATCH.call)


def selftest_compile(prefix, gpu_arch, out=print):
    """Compile every kernel dispatched on `gpu_arch`; print the DSL release and one line per kernel; 0 if all
    compiled, else 1."""
    compile_mod = embedded(prefix, "cute_kernels.compile")
    call = embedded(prefix, "submission.contest").DISPATCH.call
    out(f"nvidia-cutlass-dsl {compile_mod.dsl_version()}, target {gpu_arch}, call path {call}")
    failed = 0
    for name, kernel_cls, config in dispatched_kernels(prefix, gpu_arch):
        t0 = time.perf_counter()
        try:
            compile_mod.compile_kernel(kernel_cls, config, gpu_arch, call=call)
            out(f"ok    {time.perf_counter() - t0:6.1f} s  {name}")
        except Exception as e:  # each failure is reported, and the exit status says so
            failed += 1
            first = (str(e).strip().splitlines() or [""])[0][:300]
            out(f"FAIL  {time.perf_counter() - t0:6.1f} s  {name}: {type(e).__name__}: {first}")
    return 1 if failed else 0


USAGE = "usage: python submission.py --selftest-compile {sm_90a,sm_100a}"


def main(prefix, argv):
    """The file's command line: `--selftest-compile ARCH`."""
    archs = embedded(prefix, "cute_kernels.compile").GPU_ARCHS
    if len(argv) != 2 or argv[0] != "--selftest-compile" or argv[1] not in archs:
        print(USAGE, file=sys.stderr)
        return 2
    return selftest_compile(prefix, argv[1])
