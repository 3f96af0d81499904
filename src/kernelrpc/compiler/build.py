"""``build``: schedule -> loop IR -> LLVM -> a module that runs here or on a device.

A :class:`BuiltModule` holds the machine code of one target. ``export_library``
links it, the metadata and the C runtime compiled for the target into the one
shared library of docs/module-format.md, with the toolchain
``kernelrpc.deploy.toolchain.find_toolchain`` picks for the triple. Local calls go
through exactly that file too: the module is linked into a temporary directory
and loaded with :func:`kernelrpc.runtime.load_module`, so local and remote runs
share one code path (and one timing loop).
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import tempfile
import threading
import weakref
from pathlib import Path

from .. import __version__
from . import ir
from .codegen import CompileOptions, compile_ir, emit_primfunc, metadata_ir
from .codegen.runtime_ir import RUNTIME_SOURCE
from .codegen.emitter import CodegenError, ModuleBuilder
from .expr import Var, dtype_element
from .libc_floor import glibc_floor
from .target import Target
from .vector_isa import masked_load_bits
from ..deploy.toolchain import ToolchainError

__all__ = ["BuiltModule", "UndefinedSymbolError", "build", "build_library", "module_metadata"]

FORMAT_VERSION = 1


def build(s, args=None, target=None, name: str = "main",
          options: CompileOptions | None = None, sources=(), objects=()) -> "BuiltModule":
    """Compile a schedule (or lowered PrimFuncs) for ``target`` (default: this host).

    Args:
        s: a Schedule (lowered with ``args``), a ``PrimFunc``, or a list of PrimFuncs
            (one module with several functions; the first is the entry).
        args: the tensors (and scalar Vars) of the function, in call order.
        target: a target string such as ``"llvm -mcpu=znver4"`` or a :class:`Target`.
        name: the function name (a C identifier).
        options: LLVM pipeline options (opt level, SLP vectorizer); the target's
            ``-opt-level`` applies when they are not given.
        sources: C files that define the functions the kernels call with
            ``tir.call_extern``; every link of the module compiles them for the target with
            the module's toolchain and links them in.
        objects: object files (``.o``, compiled for the target with ``-fPIC``) linked in
            the same way. Functions of the target's libc, libm and libpthread need neither.

    Raises:
        CodegenError: the IR cannot be translated or LLVM rejects it.
        TargetError: the target string is malformed.
    """
    target = Target(target)
    funcs, text = _emit(s, args, target, name)
    compiled = compile_ir([text], target, _options(target, options))
    return BuiltModule(compiled, module_metadata(funcs, target), funcs,
                       LinkInputs.of(sources, objects, funcs))


def _emit(s, args, target: Target, name: str) -> tuple[list, str]:
    """The PrimFuncs of ``s`` and their LLVM IR text, before LLVM sees it."""
    funcs = _as_primfuncs(s, args, name)
    module = ModuleBuilder(size_type=f"i{target.pointer_bits}",
                           masked_loads=masked_load_bits(target))
    for func in funcs:
        emit_primfunc(module, func)
    return funcs, module.text()


def _options(target: Target, options: CompileOptions | None) -> CompileOptions:
    if options is not None:
        return options
    return CompileOptions() if target.opt_level is None else CompileOptions(opt_level=target.opt_level)


def build_library(s, args=None, target=None, name: str = "main", sources=(), objects=(),
                  reuse_dir=None) -> tuple[bytes, list, bool]:
    """``build(...)`` exported: the shared library's bytes, the entry function's argument
    records, and whether the library was linked before.

    ``reuse_dir``: a directory of libraries keyed by everything the library is made of (the
    LLVM IR text, the target, the compile options, the metadata, the bytes of ``sources`` and
    ``objects``); one linked there before from the same input is read back instead of
    compiled and linked again, and a new one is written there (whole files only, so build
    processes can share the directory). Its entries assume one toolchain: a directory lives
    for one run (a tuner's task, whose configurations often lower to the same kernel: a knob
    that changes nothing for its shape, as the kernel-width unroll of a 1x1 convolution).
    """
    target = Target(target)
    funcs, text = _emit(s, args, target, name)
    options = _options(target, None)
    metadata = module_metadata(funcs, target)
    inputs = LinkInputs.of(sources, objects, funcs)
    records = metadata["functions"][0]["args"]
    path = None
    if reuse_dir is not None:
        path = Path(reuse_dir) / f"{_library_key(text, target, options, metadata, inputs)}.so"
        try:
            return path.read_bytes(), records, True
        except FileNotFoundError:
            pass
    module = BuiltModule(compile_ir([text], target, options), metadata, funcs, inputs)
    with tempfile.TemporaryDirectory(prefix="kernelrpc-library-") as tmp:
        library = module.export_library(Path(tmp) / f"{name}.so").read_bytes()
    if path is not None:
        try:
            fd, partial = tempfile.mkstemp(dir=reuse_dir, suffix=".so.tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(library)
            os.replace(partial, path)
        except OSError as exc:   # the library is good; only its reuse is lost
            import logging
            logging.getLogger(__name__).warning(
                "build_library: cannot keep %s in %s (%s); later candidates with the same "
                "kernel build it again", name, reuse_dir, exc)
    return library, records, False


def _library_key(text: str, target: Target, options: CompileOptions, metadata: dict,
                 inputs: "LinkInputs") -> str:
    import hashlib

    digest = hashlib.sha256()
    parts = [text, json.dumps(target.to_dict(), sort_keys=True), repr(options),
             json.dumps(metadata, sort_keys=True)]
    for part in parts:
        data = part.encode()
        digest.update(len(data).to_bytes(8, "little") + data)
    for path in (*inputs.sources, *inputs.objects):
        data = path.read_bytes()
        digest.update(str(path).encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def _as_primfuncs(s, args, name: str) -> list:
    if isinstance(s, ir.PrimFunc):
        return [s]
    if isinstance(s, (list, tuple)) and s and all(isinstance(f, ir.PrimFunc) for f in s):
        names = [f.name for f in s]
        if len(set(names)) != len(names):
            raise CodegenError(f"function names must be unique, got {names}")
        return list(s)
    from .lower import lower  # the frontend; imported late to keep the dependency one-way

    if args is None:
        raise TypeError("build(schedule, args): args (the function's tensors) are required")
    return [lower(s, args, name=name)]


def _arg_record(param) -> dict:
    if isinstance(param, ir.Buffer):
        shape = []
        for dim in param.shape:
            value = getattr(dim, "value", dim)
            if isinstance(dim, Var):
                value = dim.name        # a shape variable: the runtime binds it per call
            elif not isinstance(value, int):
                raise CodegenError(f"tensor {param.name}: shape entry {dim} must be a constant "
                                   "or a te.var")
            shape.append(value)
        return {"name": param.name, "kind": "tensor", "dtype": param.dtype, "shape": shape}
    if isinstance(param, Var):
        return {"name": param.name, "kind": "scalar", "dtype": dtype_element(param.dtype)}
    raise CodegenError(f"cannot describe parameter {param!r}")


def module_metadata(funcs: list, target: Target) -> dict:
    """The ``__kernelrpc_metadata`` document (docs/module-format.md)."""
    return {
        "format": "kernelrpc.module",
        "version": FORMAT_VERSION,
        "producer": f"kernelrpc {__version__}",
        "target": target.to_dict(),
        "entry": funcs[0].name,
        "functions": [{"name": f.name, "symbol": f"__kernelrpc_fn_{f.name}",
                       "args": [_arg_record(p) for p in f.params]} for f in funcs],
    }


class UndefinedSymbolError(ToolchainError):
    """The link found no definition of functions the module calls (``tir.call_extern``)."""

    def __init__(self, message: str, symbols: list):
        super().__init__(message)
        self.symbols = symbols


_UNDEFINED = re.compile(r"undefined (?:reference to [`'\"]|symbol: )([A-Za-z_][A-Za-z0-9_.$]*)")


class LinkInputs:
    """What a module links besides its kernels: the user's C ``sources`` and ``objects``, and
    the names of the C functions the kernels call (``externs``), for the link's error."""

    def __init__(self, sources=(), objects=(), externs=()):
        self.sources = tuple(Path(p) for p in sources)
        self.objects = tuple(Path(p) for p in objects)
        self.externs = tuple(externs)
        for path in (*self.sources, *self.objects):
            if not path.is_file():
                raise FileNotFoundError(f"build: {path} (sources=/objects=) is not a file")

    @classmethod
    def of(cls, sources, objects, funcs) -> "LinkInputs":
        if isinstance(sources, (str, os.PathLike)) or isinstance(objects, (str, os.PathLike)):
            raise TypeError("build: sources= and objects= take lists of paths")
        externs: dict = {}
        for func in funcs:
            externs.update(dict.fromkeys(ir.extern_calls(func.body)))
        return cls(sources, objects, externs)

    def files(self, toolchain) -> list:
        """The objects to link: ``sources`` compiled by ``toolchain`` (cached while they and
        their headers are unchanged) or, without one, the C files themselves, for an
        ``fcompile`` that compiles; then ``objects``."""
        from ..deploy.toolchain import compiled_object

        if toolchain is None:
            return [*self.sources, *self.objects]
        return [*(compiled_object(toolchain, source) for source in self.sources), *self.objects]

    def explain(self, error: ToolchainError) -> ToolchainError:
        """The link's error, or an :class:`UndefinedSymbolError` naming the missing functions."""
        missing = list(dict.fromkeys(_UNDEFINED.findall(str(error))))
        if not missing:
            return error
        ours = [name for name in missing if name in self.externs]
        given = ", ".join(str(p) for p in (*self.sources, *self.objects)) or "none"
        if ours:
            message = (f"the module calls C function(s) {', '.join(ours)} (tir.call_extern), "
                       "which neither the module's sources=/objects= (" + given + ") nor the "
                       "target's C library (libc, libm, libpthread) define: pass the C file or "
                       "object that defines them to kernelrpc.build(..., sources=[...] or "
                       "objects=[...]), or check the name")
        else:
            message = (f"undefined symbol(s) {', '.join(missing)}, used by the module's "
                       f"sources=/objects= ({given}): link what defines them too")
        return UndefinedSymbolError(f"{message}\n{error}", missing)


#: toolchain identity -> the glibc floor its last link needed (the next link's first guess)
_floors: dict = {}
#: a module must not leave symbols for the device's loader to find (or not) at run time
_NO_UNDEFINED = ("-Wl,-z,defs",)


def link_module(path, kernel_object: bytes, metadata: dict, target: Target,
                fcompile=None, relocatable: bool = False,
                inputs: "LinkInputs | None" = None) -> dict:
    """Link compiled kernels, their metadata and the runtime into the shared library ``path``.

    The toolchain (:func:`kernelrpc.deploy.toolchain.find_toolchain`) compiles the C
    runtime for the target and links; ``fcompile(output, objects)`` links instead when
    given. ``relocatable`` writes one relocatable object (``ld -r``) instead, which any
    C linker (TVM's ``cc.create_shared``) turns into the same shared library later.
    ``inputs`` are the user's C sources and objects (``build(..., sources=, objects=)``).
    A full link refuses undefined symbols (:class:`UndefinedSymbolError`), so a missing C
    function fails here, not when a device loads the module.
    Returns the metadata as written: the target record gains the toolchain and the C
    library floor: the one a pinned toolchain (zig) links against, else the newest glibc
    symbol version the linked file needs (:func:`~kernelrpc.compiler.libc_floor.glibc_floor`),
    so a device with an older glibc refuses the module before ``dlopen``.
    """
    from ..deploy.toolchain import ToolchainError, compiled_object, find_toolchain

    path = Path(path)
    try:
        toolchain = find_toolchain(target)
    except ToolchainError:
        if fcompile is None:
            raise
        toolchain = None
    metadata = copy.deepcopy(metadata)
    record = metadata.setdefault("target", target.to_dict())
    record.pop("libc", None)
    record["toolchain"] = "fcompile" if fcompile is not None else toolchain.name
    measured = fcompile is None and not relocatable and toolchain.libc == "glibc"
    if fcompile is None:
        # an unpinned toolchain's floor is what the link needs: guess the last one it needed,
        # measure the linked file and link again when the guess was wrong
        guess = _floors.get(toolchain.identity()) if measured else None
        record["libc"] = toolchain.libc if guess is None else f"glibc>={guess}"
    with tempfile.TemporaryDirectory(prefix="kernelrpc-export-") as tmp:
        kernels = Path(tmp) / "lib0.o"
        kernels.write_bytes(kernel_object)
        meta = Path(tmp) / "metadata.o"

        def write_metadata():
            meta.write_bytes(compile_ir([metadata_ir(json.dumps(metadata))], target).object_code)
        write_metadata()
        runtime = (compiled_object(toolchain, RUNTIME_SOURCE) if toolchain is not None
                   else RUNTIME_SOURCE)
        inputs = inputs or LinkInputs()
        objects = [kernels, meta, runtime, *inputs.files(toolchain)]
        if relocatable:
            tmp_out = Path(tmp) / path.name
            _partial_link(toolchain, tmp_out, objects)
            shutil.move(str(tmp_out), path)
        elif fcompile is not None:
            fcompile(str(path), [str(p) for p in objects])
        else:
            tmp_out = Path(tmp) / path.name
            try:
                toolchain.link_shared(tmp_out, objects, _NO_UNDEFINED)
                floor = glibc_floor(tmp_out) if measured else None
                if floor is not None and record["libc"] != f"glibc>={floor}":
                    _floors[toolchain.identity()] = floor
                    record["libc"] = f"glibc>={floor}"
                    write_metadata()
                    toolchain.link_shared(tmp_out, objects, _NO_UNDEFINED)
            except ToolchainError as exc:
                raise inputs.explain(exc) from None
            shutil.move(str(tmp_out), path)  # the file appears complete or not at all
    return metadata


def _partial_link(toolchain, output: Path, objects: list) -> None:
    """``cc -r``: the objects as one relocatable object, nothing of the C library added."""
    import subprocess

    from ..deploy.toolchain import ToolchainError

    cmd = [*toolchain.argv, "-r", "-nostdlib", "-o", str(output), *map(str, objects)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"writing {output.name} failed: {exc}") from None
    if done.returncode != 0:
        raise ToolchainError(f"writing {output.name} failed ({' '.join(cmd)}):\n"
                             f"{done.stderr.strip()}")


class RunsHere:
    """What an exportable module (``export_library``, ``target``) needs to run in this process:
    on first use it is linked into a directory of its own, removed with it, and loaded."""

    _loaded = None

    def _runtime_module(self):
        with self._load_lock:
            if self._loaded is None:
                if not self.target.is_host:
                    raise RuntimeError(f"cannot run code for {self.target.triple} on this host; "
                                       "export it and load it on a matching device")
                from .. import runtime

                workdir = tempfile.mkdtemp(prefix="kernelrpc-build-")
                weakref.finalize(self, shutil.rmtree, workdir, True)
                path = self.export_library(Path(workdir) / "module.so")
                self._loaded = runtime.load_module(str(path))
            return self._loaded

    @property
    def runtime_module(self):
        """The loaded ``kernelrpc.runtime.Module`` (linked and loaded on first use)."""
        return self._runtime_module()

    def get_function(self, name: str):
        return self._runtime_module().get_function(name)

    __getitem__ = get_function


class BuiltModule(RunsHere):
    """Compiled functions of one target, exportable as a shared library and runnable here.

    Runtime Module API (host targets): ``mod(*args)`` calls the entry function,
    ``mod[name]`` / ``mod.get_function(name)``, ``mod.time_evaluator(...)``,
    ``mod.entry_name``; arguments are ``kernelrpc.nd`` tensors.
    """

    def __init__(self, compiled, metadata: dict, funcs: list, inputs: "LinkInputs | None" = None):
        self._compiled = compiled
        self.link_inputs = inputs or LinkInputs()
        self.metadata = metadata
        self.target = compiled.target
        self.funcs = funcs
        self._load_lock = threading.Lock()

    @property
    def entry_name(self) -> str:
        return self.metadata["entry"]

    def get_source(self, fmt: str = "ll") -> str:
        """``"ll"``: LLVM IR as generated; ``"ll-opt"``: after O3; ``"asm"``: assembly;
        ``"lowered"``: the loop IR."""
        if fmt in ("ll", "llvm"):
            return self._compiled.llvm_ir
        if fmt == "ll-opt":
            return self._compiled.optimized_ir
        if fmt in ("asm", "s"):
            return self._compiled.assembly()
        if fmt == "lowered":
            return "\n\n".join(str(f) for f in self.funcs)
        raise ValueError(f"unknown source format {fmt!r}; use 'll', 'll-opt', 'asm' or 'lowered'")

    def save_object(self, path: str | os.PathLike) -> Path:
        """Write the relocatable object (``.o``)."""
        path = Path(path)
        path.write_bytes(self._compiled.object_code)
        return path

    def save(self, path: str | os.PathLike, fmt: str = "") -> Path:
        """TVM's ``Module.save``: by ``fmt`` or the file's extension, ``"o"`` writes one
        relocatable object holding the kernels, the metadata and the runtime (link it
        with ``kernelrpc.contrib.cc.create_shared`` into a loadable module), ``"ll"``
        the LLVM IR and ``"s"`` the assembly."""
        path = Path(path)
        fmt = fmt or path.suffix.lstrip(".")
        if fmt == "o":
            self.metadata = link_module(path, self._compiled.object_code, self.metadata,
                                        self.target, relocatable=True, inputs=self.link_inputs)
        elif fmt in ("ll", "s"):
            path.write_text(self.get_source(fmt))
        else:
            raise ValueError(f"cannot save a module as {fmt!r}: use 'o', 'll' or 's' "
                             "(export_library writes the shared library)")
        return path

    def export_library(self, path: str | os.PathLike, fcompile=None) -> Path:
        """Write the module as one shared library (docs/module-format.md).

        Args:
            path: the ``.so`` to write.
            fcompile: optional TVM-style ``fcompile(output, objects)`` linker. It gets the
                kernel and metadata objects and the runtime: an object when kernelrpc has a
                toolchain for the target, else the C source ``module_runtime.c`` (which
                TVM's ``cc.create_shared`` / ``cc.cross_compiler`` compile).

        Raises:
            ToolchainError: no toolchain for the target (the message says what to install),
                or compiling or linking failed.
        """
        self.metadata = link_module(path, self._compiled.object_code, self.metadata,
                                    self.target, fcompile, inputs=self.link_inputs)
        return Path(path)

    # ------------------------------------------------------------------ local execution

    def __call__(self, *args):
        return self._runtime_module().get_function(self.entry_name)(*args)

    def time_evaluator(self, name: str, dev=None, *args, **kwargs):
        """``Module.time_evaluator`` of the runtime (TVM semantics; native timing loop)."""
        from .. import runtime

        return self._runtime_module().time_evaluator(name, dev or runtime.cpu(0), *args, **kwargs)

    def set_num_threads(self, n: int) -> int:
        """``Module.set_num_threads`` of the runtime: the size of this module's thread pool."""
        return self._runtime_module().set_num_threads(n)

    def __repr__(self):
        names = ", ".join(f["name"] for f in self.metadata["functions"])
        return f"<BuiltModule [{names}] for {self.target.triple} ({self.target.cpu})>"
