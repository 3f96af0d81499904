"""Loading kernelrpc modules (docs/module-format.md) and calling their functions with ctypes."""
from __future__ import annotations

import ctypes
import functools
import itertools
import operator
import os
import shutil
import tempfile
import threading

from ..errors import KernelError, ModuleError
from .graph_executor import factory_for
from .compat import check_module_file
from .dtype import pack_scalar
from .metadata import ArgSpec, FunctionSpec, ModuleMetadata, parse_metadata
from .evaluator import TimeEvaluator
from .tensor import Tensor, _is_ndarray
from .threads import check_num_threads, process_config


_POINTER_BYTES = ctypes.sizeof(ctypes.c_void_p)
_BUFFER = operator.attrgetter("_buf")
#: How long ``__kernelrpc_time_repeats`` times batches before it returns to Python (at the end of
#: the batch that reaches it), so that a signal is taken.
REPEATS_BUDGET_NS = 100_000_000


class PackedArgs:
    """Validated arguments in the packed calling convention: ``pointer`` is the ``void **args``
    array. Holds the tensors' memory (even if a tensor is freed meanwhile) and the 8-byte
    scalar slots while it is in use."""

    __slots__ = ("words", "pointer", "_values", "_plan", "_memory")

    def __init__(self, spec: FunctionSpec, values, words_type=None, plan: tuple | None = None):
        plan = plan or _plan(spec)
        self.words, self.pointer, self._memory = _fill(spec, plan, values, words_type or _words_type(len(plan)))
        self._values, self._plan = values, plan

    @property
    def tensors(self) -> list[tuple[int, Tensor]]:
        """(argument position, tensor) of each tensor argument."""
        return [(i, self._values[i]) for i, (_, shape) in enumerate(self._plan) if shape is not None]


class PreparedCall:
    """A kernel's call with the same tensors again and again: checked and packed once
    (``Function.prepare``), then each ``run()`` is the native call alone.

    It holds the argument array (the tensors' addresses) and the tensors' buffers, but no view of
    their memory: once a tensor is freed, its memory is not kept, and ``run()`` refuses (returns
    False) instead of calling the kernel on it; a fresh call's checks then say what is wrong. While
    the kernel runs, ``run()`` holds the views, as a call does.
    """

    __slots__ = ("name", "tensors", "_buffers", "_array", "_native")

    def __init__(self, function: Function, tensors: tuple, array, pointer: int) -> None:
        self.name = function.spec.name
        self.tensors = tensors
        self._buffers = tuple(map(_BUFFER, tensors))
        self._array = array
        self._native = functools.partial(function._cfunc, ctypes.c_void_p(pointer))  # converted fastest

    def run(self) -> bool:
        """Call the kernel (KernelError if it fails); False, without calling it, if one of the
        tensors has been freed."""
        views = []  # held until the kernel returns
        for buf in self._buffers:
            view = buf._view
            if view is None:    # (``None in views`` costs ~0.3 us a memoryview)
                return False
            views.append(view)
        code = self._native()
        if code != 0:
            raise KernelError(self.name, code)
        return True


def _fill(spec: FunctionSpec, plan: tuple, values, words_type) -> tuple:
    """``(words, pointer, memory)``: the argument array of ``values`` checked against the
    function's ``plan``, its address, and the tensors' memory that it points into."""
    n = len(plan)
    shapes = _bind_shapes(spec, values) if spec.shape_vars else None
    # One array: n argument pointers, then n 8-byte scalar slots (8-byte aligned).
    words = array = words_type()
    pointer = ctypes.addressof(words)
    memory = []
    if _POINTER_BYTES != 8:
        words = (ctypes.c_uint32 * max(n, 1)).from_buffer(array)
    slots = pointer + 8 * _pointer_words(n)
    i = 0
    for dtype, shape in plan:
        value = values[i]
        if shape is not None:  # a tensor
            if shapes is not None:
                shape = shapes[i]
            # The common case in one test; _check_tensor explains anything else.
            # (A buffer's _view is None once freed: buffer.BufferView.)
            if type(value) is not Tensor or value._dtype is not dtype or value.shape != shape \
                    or value._buf._view is None:
                _check_tensor(spec.args[i], value, _where(spec, i), shape)
            buf = value._buf
            memory.append(buf._view)
            words[i] = buf._address
        else:
            try:
                raw = pack_scalar(dtype, value)
            except (TypeError, ValueError):
                pack_scalar(dtype, value, _where(spec, i))   # raises, naming the argument
                raise
            slot = slots + 8 * i
            ctypes.memmove(slot, raw, len(raw))
            words[i] = slot
        i += 1
    return array, pointer, memory


def _plan(spec: FunctionSpec) -> tuple:
    """``(dtype, shape)`` of each argument, shape None for a scalar: what packing checks, read
    once per function instead of three metadata fields per argument and call."""
    return tuple((arg.dtype, arg.shape if arg.kind == "tensor" else None) for arg in spec.args)


def _pointer_words(n: int) -> int:
    return n if _POINTER_BYTES == 8 else (n * _POINTER_BYTES + 7) // 8


def _words_type(n: int):
    """The ctypes array type of a PackedArgs' words for ``n`` arguments (made once per function:
    ``c_uint64 * k`` costs ~0.3 us a call)."""
    return ctypes.c_uint64 * max(_pointer_words(n) + n, 1)


def _where(spec: FunctionSpec, i: int) -> str:
    return f"{spec.name}() argument {i} '{spec.args[i].name}'"


def _bind_shapes(spec: FunctionSpec, values: list) -> dict:
    """Bind the shape variables from the tensors (filling omitted scalar arguments in
    ``values``); return each tensor argument's concrete expected shape."""
    bound: dict = {}
    for i, arg in enumerate(spec.args):
        shape = getattr(values[i], "shape", None)
        if arg.kind != "tensor" or not isinstance(shape, tuple) or len(shape) != len(arg.shape):
            continue
        for d, (want, got) in enumerate(zip(arg.shape, shape)):
            if isinstance(want, str):
                first = bound.setdefault(want, (got, i))
                if first[0] != got:
                    raise ValueError(f"{_where(spec, i)}: dimension {d} is {got}, but "
                                     f"{want} = {first[0]} from argument {first[1]} "
                                     f"'{spec.args[first[1]].name}'")
    for i in spec.shape_vars:
        name = spec.args[i].name
        if name not in bound:
            continue
        if values[i] is None:
            values[i] = bound[name][0]
        elif values[i] != bound[name][0]:
            raise ValueError(f"{_where(spec, i)}: is {values[i]}, but the tensors' shapes "
                             f"say {bound[name][0]}")
    return {i: tuple(bound.get(d, (d,))[0] if isinstance(d, str) else d for d in arg.shape)
            for i, arg in enumerate(spec.args) if arg.kind == "tensor"}


def _check_tensor(arg: ArgSpec, value, where: str, shape: tuple | None = None) -> None:
    shape = arg.shape if shape is None else shape
    expected = f"{arg.dtype}{list(arg.shape)}"
    if not isinstance(value, Tensor):
        if _is_ndarray(value):
            hint = "; wrap it with kernelrpc.nd.array(...)"
        elif getattr(getattr(value, "device", None), "session", None) is not None:
            hint = "; it lives on a remote device, so call the remote module's function"
        else:
            hint = ""
        raise TypeError(f"{where}: expected a tensor {expected}, got {type(value).__name__}{hint}")
    if value.freed:
        raise ValueError(f"{where}: the tensor has been freed")
    if value.dtype != arg.dtype.name:
        raise TypeError(f"{where}: expected dtype {arg.dtype}, got {value.dtype}")
    if value.ndim != len(arg.shape):
        raise ValueError(f"{where}: expected {len(arg.shape)} dimensions {expected}, "
                         f"got {value.ndim} {list(value.shape)}")
    if value.shape != shape:
        raise ValueError(f"{where}: expected shape {expected}, got {list(value.shape)}")


class Function:
    """A kernel of a loaded module; calling it checks the arguments against the metadata."""

    def __init__(self, module: Module, spec: FunctionSpec, cfunc):
        self.module = module
        self.spec = spec
        self._cfunc = cfunc
        self.address: int = ctypes.cast(cfunc, ctypes.c_void_p).value
        self._words_type = _words_type(len(spec.args))
        self._plan = _plan(spec)
        self._tensors_only = not spec.shape_vars and all(shape is not None for _, shape in self._plan)

    @property
    def name(self) -> str:
        return self.spec.name

    def pack(self, args: tuple) -> PackedArgs:
        return PackedArgs(self.spec, self._complete(args), self._words_type, self._plan)

    def _complete(self, args):
        """``args`` with omitted shape variables filled in (None, bound by packing), counted."""
        spec = self.spec
        if spec.shape_vars and len(args) == len(spec.args) - len(spec.shape_vars):
            filled = iter(args)     # shape variables omitted: bound from the tensors' shapes
            args = [None if i in spec.shape_vars else next(filled) for i in range(len(spec.args))]
        elif spec.shape_vars:
            args = list(args)
        if len(args) != len(spec.args):
            raise TypeError(f"{spec.signature()} takes {len(spec.args)} arguments, got {len(args)}")
        return args

    def prepare(self, args) -> PreparedCall | None:
        """The call with ``args``, checked and packed as calling would check them (the same
        errors), to run again with the same tensors (``PreparedCall.run``); None, checking
        nothing, for a function that takes a scalar (shape variables included)."""
        if not self._tensors_only:
            return None
        if len(args) != len(self._plan):
            self._complete(args)    # raises, naming the count
        array, pointer, _ = _fill(self.spec, self._plan, args, self._words_type)
        return PreparedCall(self, tuple(args), array, pointer)

    def invoke(self, packed: PackedArgs) -> None:
        code = self._cfunc(packed.pointer)
        if code != 0:
            raise KernelError(self.spec.name, code)

    def __call__(self, *args) -> None:
        """Pack and call, as ``invoke(pack(args))`` without the PackedArgs object."""
        spec = self.spec
        if spec.shape_vars or len(args) != len(self._plan):
            args = self._complete(args)
        words, pointer, memory = _fill(spec, self._plan, args, self._words_type)  # held until it returns
        code = self._cfunc(pointer)
        if code != 0:
            raise KernelError(spec.name, code)

    def __repr__(self) -> str:
        return f"<Function {self.spec.signature()}>"


class Module:
    """A loaded kernelrpc module. Modules stay loaded for the life of the process."""

    def __init__(self, path: str, lib: ctypes.CDLL, meta: ModuleMetadata):
        self.path = path
        self._lib = lib
        self._meta = meta
        self._functions: dict[str, Function] = {}
        for spec in meta.functions.values():
            cfunc = _symbol(lib, spec.symbol, ctypes.c_int32, (ctypes.c_void_p,))
            if cfunc is None:
                raise ModuleError(f"{path}: function {spec.name!r} is declared but its symbol "
                                  f"{spec.symbol} is not exported")
            self._functions[spec.name] = Function(self, spec, cfunc)
        # int64 __kernelrpc_time(void *fn, void **args, int64 number): called with arguments
        # already converted (batch_timer), without argtypes to convert them again every batch
        self._time = _symbol(lib, "__kernelrpc_time", ctypes.c_int64, None)
        if self._time is None:
            raise ModuleError(f"{path}: required symbol __kernelrpc_time is not exported")
        # int64 __kernelrpc_time_repeats(void *fn, void **args, int64 number, int64 repeat,
        # int64 *elapsed_ns, int64 budget_ns), optional (a module built by an older kernelrpc
        # lacks it): called with arguments already converted, as __kernelrpc_time is
        self._time_repeats = _symbol(lib, "__kernelrpc_time_repeats", ctypes.c_int64, None)
        self._cache_flush = _symbol(lib, "__kernelrpc_cache_flush", None,
                                    (ctypes.c_void_p, ctypes.c_int64))
        self._set_num_threads = _symbol(lib, "__kernelrpc_set_num_threads", ctypes.c_int32,
                                        (ctypes.c_int32,))

    @property
    def metadata(self) -> dict:
        return self._meta.document

    @property
    def entry_name(self) -> str | None:
        return self._meta.entry

    @property
    def target(self) -> dict:
        return self._meta.target

    @property
    def function_names(self) -> list[str]:
        return list(self._functions)

    @property
    def entry_func(self) -> Function:
        if self._meta.entry is None:
            raise AttributeError(f"module {self.path} has no entry function")
        return self._functions[self._meta.entry]

    def __call__(self, *args) -> None:
        """Call the entry function (TVM: ``mod(a, b, c)``)."""
        return self.entry_func(*args)

    def implements_function(self, name: str) -> bool:
        return name in self._functions

    __contains__ = implements_function

    def get_function(self, name: str) -> Function:
        function = self._functions.get(name) if isinstance(name, str) else None
        if function is None:
            factory = factory_for(self, name)
            if factory is not None:
                return factory
            raise AttributeError(f"module {os.path.basename(self.path)} has no function {name!r}; "
                                 f"it has: {', '.join(self._functions) or 'none'}")
        return function

    __getitem__ = get_function

    def time_evaluator(self, name: str, dev, number: int = 10, repeat: int = 1,
                       min_repeat_ms: float = 0, cooldown_interval_ms: float = 0,
                       repeats_to_cooldown: int = 1, f_preproc: str = "", *,
                       limit_zero_time_iterations: int = 100, cache_flush_bytes: int = 0):
        """A callable that runs ``name`` with TVM's time_evaluator semantics and returns a
        ProfileResult (see kernelrpc.runtime.evaluator.TimeEvaluator)."""
        return TimeEvaluator(self.get_function(name), dev, number=number, repeat=repeat,
                             min_repeat_ms=min_repeat_ms, cooldown_interval_ms=cooldown_interval_ms,
                             repeats_to_cooldown=repeats_to_cooldown, f_preproc=f_preproc,
                             limit_zero_time_iterations=limit_zero_time_iterations,
                             cache_flush_bytes=cache_flush_bytes)

    def batch_timer(self, function: Function, packed: PackedArgs):
        """A callable ``number -> nanoseconds`` for ``number`` calls of ``function`` with
        ``packed``, timed by the module's native ``__kernelrpc_time``; the pointers are
        converted for ctypes once, and ``number`` once per value (a timed batch costs ~0.5 µs
        instead of ~0.7 µs)."""
        time_native, name, c_int64 = self._time, function.name, ctypes.c_int64
        fn, args = ctypes.c_void_p(function.address), ctypes.c_void_p(packed.pointer)
        last = [0, c_int64(0), packed]     # packed stays alive as long as its pointer is used

        def time_batch(number: int) -> int:
            if number != last[0]:
                last[0], last[1] = number, c_int64(number)
            elapsed = time_native(fn, args, last[1])
            if elapsed < 0:
                raise KernelError(name, -elapsed)
            return elapsed

        return time_batch

    @property
    def has_repeats_timer(self) -> bool:
        """Whether the module exports ``__kernelrpc_time_repeats`` (see :meth:`repeats_timer`)."""
        return self._time_repeats is not None

    def repeats_timer(self, function: Function, repeat: int):
        """A callable ``(packed, number) -> [nanoseconds of each batch]``: ``repeat`` batches of
        ``number`` calls of ``function`` with ``packed``, back to back in the module's native
        ``__kernelrpc_time_repeats``, each batch timed as ``__kernelrpc_time`` times it; None
        for a module without it (:attr:`has_repeats_timer`). One native call runs them all,
        unless their time passes :data:`REPEATS_BUDGET_NS`: then it returns after that batch, so
        that a KeyboardInterrupt lands as soon as it would between single batches, and the next
        call runs the rest. The function's address is converted for ctypes once."""
        time_repeats, name, path = self._time_repeats, function.name, self.path
        if time_repeats is None:
            return None
        c_int64, c_void_p, byref = ctypes.c_int64, ctypes.c_void_p, ctypes.byref
        fn, budget, elapsed_type = c_void_p(function.address), c_int64(REPEATS_BUDGET_NS), c_int64 * repeat

        def time_batches(packed: PackedArgs, number: int) -> list[int]:
            elapsed = elapsed_type()
            args, c_number, done = c_void_p(packed.pointer), c_int64(number), 0
            while done < repeat:
                ran = time_repeats(fn, args, c_number, c_int64(repeat - done),
                                   byref(elapsed, 8 * done), budget)
                if ran < 0:
                    raise KernelError(name, -ran)
                if ran == 0:
                    raise ModuleError(f"{path}: __kernelrpc_time_repeats ran no batch")
                done += ran
            return elapsed[:]

        return time_batches

    @property
    def has_cache_flush(self) -> bool:
        return self._cache_flush is not None

    def cache_flush(self, tensor: Tensor) -> None:
        """Evict ``tensor`` from the CPU caches with the module's ``__kernelrpc_cache_flush``."""
        self._cache_flush(tensor.data, tensor.nbytes)

    def set_num_threads(self, n: int) -> int:
        """Threads for this module's parallel loops, caller included (0 = all usable cores, at
        most ``threads.MAX_NUM_THREADS``); returns the number the pool now has, which the pool
        may cap (1 for a module without a pool)."""
        n = check_num_threads(n)
        if self._set_num_threads is None:
            return 1
        return self._set_num_threads(n)

    def __repr__(self) -> str:
        return f"<Module {self.path} functions={self.function_names}>"


def _symbol(lib, symbol, restype, argtypes):
    """A fresh ctypes function for ``symbol``, or None when the library does not export it."""
    try:
        fn = lib[symbol]
    except AttributeError:
        return None
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


def load_module(path) -> Module:
    """Load a kernelrpc module (a shared library exported by kernelrpc, docs/module-format.md).

    Loading a path again after the file changed loads the new file (the dynamic loader alone
    would hand back the library already loaded under that name).

    Raises:
        IncompatibleModuleError: (from ``kernelrpc.runtime.compat``) the file was built for
            another architecture, float ABI, CPU features or a newer glibc than this device's;
            checked on the file before it is loaded.
        ModuleError: the file is not a kernelrpc module.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"module file not found: {path}")
    check_module_file(path)
    lib = _dlopen(path)
    get_metadata = _symbol(lib, "__kernelrpc_metadata", ctypes.c_char_p, ())
    if get_metadata is None:
        raise ModuleError(f"{path} is not a kernelrpc module: it does not export "
                          f"__kernelrpc_metadata")
    text = get_metadata()
    if text is None:
        raise ModuleError(f"{path}: __kernelrpc_metadata returned NULL")
    try:
        meta = parse_metadata(text)
    except ModuleError as exc:
        raise ModuleError(f"{path}: {exc}") from None
    module = Module(path, lib, meta)
    process_config.track(module)  # config_threadpool applies to modules loaded later too
    return module


_loaded_versions: dict[str, tuple] = {}     # real path -> identity of the file loaded from it
_alias_lock = threading.Lock()
_alias_count = itertools.count()


def _dlopen(path: str) -> ctypes.CDLL:
    real = os.path.realpath(path)
    st = os.stat(real)
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    with _alias_lock:
        previous = _loaded_versions.setdefault(real, identity)
        alias = None if previous == identity else _private_copy(real)
        _loaded_versions[real] = identity
    try:
        return ctypes.CDLL(alias or real, mode=os.RTLD_LOCAL | os.RTLD_NOW)
    except OSError as exc:
        raise ModuleError(f"cannot load {path}: {exc}") from None
    finally:
        if alias is not None:
            os.unlink(alias)        # the mapping stays; the name is never used again


def _private_copy(real: str) -> str:
    """A copy under a name never loaded before, next to the file if possible."""
    name = f".{os.path.basename(real)}.{os.getpid()}.{next(_alias_count)}.so"
    for directory in (os.path.dirname(real), tempfile.gettempdir()):
        alias = os.path.join(directory, name)
        try:
            shutil.copyfile(real, alias)
            return alias
        except OSError:
            continue
    raise ModuleError(f"cannot reload the changed module {real}: no writable directory for a copy")
