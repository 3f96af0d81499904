"""The graph executor of a network module, on whichever device holds the module.

A module that ``relay.build`` wrote carries its executor plan in its metadata
(``"executor"``): inputs, outputs, the params and workspace sizes, one record per kernel
call. ``module["default"]`` is then a :class:`GraphExecutorFactory`; called with a device it
allocates the network's tensors there, copies the weights in (``default_load_params``, on the
device) and returns a :class:`GraphExecutor`. Running the network is one call of the module's
native ``default_run``: the executor itself only moves inputs and outputs. The same code drives
a local module and a remote one, through the methods both share.

Standard library only: the metadata is untrusted and checked here.
"""
from __future__ import annotations

import math
import time

from ..errors import GraphInputError, ModuleError, NetworkTooLarge, RemoteError
from . import calling_convention as convention
from .dtype import DTYPES, MAX_NDIM

MAX_ITEMS = 1 << 16
MAX_BYTES = 1 << 44


def executor_plan(metadata: dict | None) -> dict | None:
    """The checked executor plan of a module's metadata, or None for a kernel module."""
    plan = (metadata or {}).get("executor")
    if plan is None:
        return None
    _check_plan(plan)
    return plan


def factory_for(module, name: str):
    """``module[name]`` for a network module's ``"default"``, else None."""
    if name != "default" or "default" in module.function_names:
        return None
    plan = executor_plan(module.metadata)
    return None if plan is None else GraphExecutorFactory(module, plan)


class GraphExecutorFactory:
    """``lib["default"]``: call it with a device for a :class:`GraphExecutor` (TVM's name)."""

    def __init__(self, module, plan: dict):
        self.module = module
        self.plan = plan

    def __call__(self, dev=None) -> "GraphExecutor":
        return GraphExecutor(self.module, self.plan, dev)

    def __repr__(self) -> str:
        return f"<GraphExecutorFactory of {self.module!r}>"


def _empty(shape, dtype, dev):
    if dev is not None and dev.session is not None:
        return dev.session.empty(tuple(shape), dtype, dev)
    from .tensor import empty

    return empty(tuple(shape), dtype, dev)


class GraphExecutor:
    """A network ready to run on ``dev``: ``set_input``, ``run``, ``get_output``."""

    def __init__(self, module, plan: dict, dev=None):
        if dev is None:
            from .device import cpu

            dev = cpu(0)
        self.module, self.plan, self.device = module, plan, dev
        self.input_names = [t["name"] for t in plan["inputs"]]
        try:
            self._inputs = [_empty(t["shape"], t["dtype"], dev) for t in plan["inputs"]]
            self._outputs = [_empty(t["shape"], t["dtype"], dev) for t in plan["outputs"]]
            self._params = _empty([max(plan["params_bytes"], 1)], "uint8", dev)
            self._workspace = _empty([max(plan["workspace_bytes"], 1)], "uint8", dev)
            self._params_by_name = {p["name"]: p for p in plan["params"]}
            self._run = module.get_function(convention.RUN)
            module.get_function(convention.LOAD_PARAMS)(self._params)
        except (MemoryError, RemoteError) as exc:
            if isinstance(exc, RemoteError) and exc.type_name != "MemoryError":
                raise
            raise NetworkTooLarge(self._too_large(exc)) from exc

    # ---------------------------------------------------------------- TVM's GraphModule API
    @property
    def run_args(self) -> tuple:
        """The arguments of the native ``default_run`` (for ``time_evaluator``)."""
        return (*self._inputs, *self._outputs, self._params, self._workspace)

    def get_num_inputs(self) -> int:
        return len(self._inputs)

    def get_num_outputs(self) -> int:
        return len(self._outputs)

    def get_input_index(self, name: str) -> int:
        try:
            return self.input_names.index(name)
        except ValueError:
            return -1

    def get_input(self, index):
        return self._inputs[self._input_position(index)]

    def get_output(self, index: int, out=None):
        if not isinstance(index, int) or not 0 <= index < len(self._outputs):
            raise IndexError(f"output {index!r}: the network has {len(self._outputs)} output(s)")
        if out is None:
            return self._outputs[index]
        if hasattr(out, "copyfrom") and getattr(out, "shape", None) is not None:
            out.copyfrom(self._outputs[index].numpy())
        else:
            self._outputs[index].copyto(out)
        return out

    def set_input(self, key=None, value=None, **params) -> None:
        """Copy ``value`` (an ndarray, a buffer or a device tensor) into input ``key`` (its name
        or position), or weights by their names (``**lib.get_params()``)."""
        if key is not None:
            self._copy_into(self._input_position(key), value)
        for name, weight in params.items():
            if name in self.input_names:
                self._copy_into(self.input_names.index(name), weight)
            else:
                self._set_param(name, weight)

    def run(self, **inputs) -> None:
        for name, value in inputs.items():
            self.set_input(name, value)
        self._run(*self.run_args)

    def set_num_threads(self, n: int) -> int:
        return self.module.set_num_threads(n)

    def benchmark(self, device=None, func_name: str = "run", repeat: int = 5, number: int = 5,
                  min_repeat_ms: float = 0, end_to_end: bool = False, **kwargs):
        """A ProfileResult of the whole network: ``default_run`` timed on the device by its
        native loop, or with ``end_to_end`` each repeat timed here around copying the inputs in,
        running and copying the outputs out."""
        if func_name != "run":
            raise ValueError("benchmark times func_name='run' only")
        device = device or self.device
        if not end_to_end:
            timer = self.module.time_evaluator(convention.RUN, device, number=number,
                                               repeat=repeat, min_repeat_ms=min_repeat_ms,
                                               **kwargs)
            return timer(*self.run_args)
        from .profile import ProfileResult

        host_inputs = [t.numpy() for t in self._inputs]
        results = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                for tensor, value in zip(self._inputs, host_inputs):
                    tensor.copyfrom(value)
                self._run(*self.run_args)
                for tensor in self._outputs:
                    tensor.numpy()
            results.append((time.perf_counter() - start) / number)
        return ProfileResult(results, number, self.module.target, function="run (end to end)")

    def profile_times(self, number: int = 1) -> list:
        """Seconds per call of each kernel, ``number`` runs of the whole network on the device
        (``default_profile``: the clock read around every kernel call in native code)."""
        if not isinstance(number, int) or not 1 <= number <= 1 << 20:
            raise ValueError(f"number must be an integer in [1, {1 << 20}], got {number!r}")
        times = _empty([max(len(self.plan["kernels"]), 1)], "int64", self.device)
        self.module.get_function(convention.PROFILE)(*self.run_args, times, number)
        nanos = list(memoryview(_buffer_of(times)).cast("q"))
        return [ns / number / 1e9 for ns in nanos[:len(self.plan["kernels"])]]

    # ---------------------------------------------------------------- helpers
    def _too_large(self, exc) -> str:
        plan = self.plan
        io = sum(math.prod(t["shape"]) * DTYPES[t["dtype"]].itemsize
                 for t in plan["inputs"] + plan["outputs"])
        total = io + plan["params_bytes"] + plan["workspace_bytes"]
        reason = getattr(exc, "remote_message", None) or str(exc)
        return (f"the network needs {total / 1e6:.1f} MB on {self.device} ({io / 1e6:.1f} MB "
                f"inputs and outputs, {plan['params_bytes'] / 1e6:.1f} MB weights, "
                f"{plan['workspace_bytes'] / 1e6:.1f} MB activations) and the device refused: "
                f"{reason.splitlines()[0] if reason else exc!r} (raise the server's "
                "--max-session-bytes / --max-tensor-bytes, or build with a smaller batch)")


    def _input_position(self, key) -> int:
        if isinstance(key, str):
            if key not in self.input_names:
                raise GraphInputError(f"the network has no input {key!r}; its inputs are "
                                      f"{', '.join(map(repr, self.input_names))}")
            return self.input_names.index(key)
        if isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(self._inputs):
            return key
        raise GraphInputError(f"input {key!r}: give a name or a position below "
                              f"{len(self._inputs)}")

    def _copy_into(self, position: int, value) -> None:
        spec = self.plan["inputs"][position]
        _check_value(value, spec, f"input {spec['name']!r}")
        target = self._inputs[position]
        if _is_tensor(value) and getattr(value.device, "session", None) is not None:
            value = value.numpy()
        target.copyfrom(value)

    def _set_param(self, name: str, value) -> None:
        spec = self._params_by_name.get(name)
        if spec is None:
            raise GraphInputError(f"the network has no input or weight {name!r} (weights are "
                                  f"named as lib.get_params() names them: p0, p1...)")
        _check_value(value, spec, f"weight {name!r}")
        if _is_tensor(value):
            value = value.numpy()
        data = memoryview(value).cast("B") if not hasattr(value, "tobytes") else \
            memoryview(value.tobytes())
        staging = _empty([data.nbytes], "uint8", self.device)
        staging.copyfrom(data)
        self.module.get_function(convention.SET_PARAM)(self._params, staging, data.nbytes,
                                                      spec["offset"])


def _buffer_of(tensor):
    if hasattr(tensor, "buffer") and getattr(tensor.device, "session", None) is None:
        return tensor.buffer
    data = bytearray(tensor.nbytes)
    tensor.copyto_buffer(memoryview(data))
    return data


def _is_tensor(value) -> bool:
    return hasattr(value, "numpy") and hasattr(value, "device") and hasattr(value, "shape")


def _check_value(value, spec: dict, what: str) -> None:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        raise GraphInputError(f"{what}: expected an array of {spec['dtype']}{spec['shape']}, got "
                              f"{type(value).__name__}")
    if tuple(shape) != tuple(spec["shape"]):
        raise GraphInputError(f"{what} has shape {list(shape)}; the network was built for "
                              f"{spec['shape']} (build again with that shape to change it)")
    if str(dtype) != spec["dtype"]:
        raise GraphInputError(f"{what} has dtype {dtype}; the network expects {spec['dtype']} "
                              f"(convert with .astype({spec['dtype']!r}))")


# ------------------------------------------------------------------ validating the plan

def _fail(message: str):
    raise ModuleError(f"module executor plan: {message}")


def _int(value, what, lo=0, hi=MAX_BYTES) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        _fail(f"{what} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


def _tensors(items, what, with_offset=False) -> None:
    if not isinstance(items, list) or len(items) > MAX_ITEMS:
        _fail(f"{what} must be a list of at most {MAX_ITEMS} tensors")
    for k, t in enumerate(items):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or len(t["name"]) > 256:
            _fail(f"{what}[{k}] must have a name")
        if t.get("dtype") not in DTYPES:
            _fail(f"{what}[{k}].dtype {t.get('dtype')!r} is not a dtype")
        shape = t.get("shape")
        if not isinstance(shape, list) or len(shape) > MAX_NDIM:
            _fail(f"{what}[{k}].shape must be a list")
        for d in shape:
            _int(d, f"{what}[{k}].shape entry", 0, MAX_BYTES)
        if math.prod(shape) * DTYPES[t["dtype"]].itemsize > MAX_BYTES:
            _fail(f"{what}[{k}] is implausibly large")
        if with_offset:
            _int(t.get("offset"), f"{what}[{k}].offset")


def _check_plan(plan) -> None:
    if not isinstance(plan, dict) or plan.get("format") != convention.FORMAT:
        _fail(f"'format' must be {convention.FORMAT!r}")
    if _int(plan.get("version"), "version", 1, 1 << 20) > convention.VERSION:
        _fail(f"version {plan['version']} is newer than this runtime's "
              f"({convention.VERSION}); update "
              "kernelrpc on the device")
    _tensors(plan.get("inputs"), "inputs")
    _tensors(plan.get("outputs"), "outputs")
    _tensors(plan.get("params"), "params", with_offset=True)
    params_bytes = _int(plan.get("params_bytes"), "params_bytes")
    _int(plan.get("workspace_bytes"), "workspace_bytes")
    for p in plan["params"]:
        if p["offset"] + math.prod(p["shape"]) * DTYPES[p["dtype"]].itemsize > params_bytes:
            _fail(f"param {p['name']!r} lies outside the params buffer")
    kernels = plan.get("kernels")
    if not isinstance(kernels, list) or len(kernels) > MAX_ITEMS:
        _fail("kernels must be a list")
    for k, rec in enumerate(kernels):
        if not isinstance(rec, dict) or not isinstance(rec.get("name"), str):
            _fail(f"kernels[{k}] must have a name")
