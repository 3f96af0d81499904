"""A network module's calling convention: its executor plan's format and version, its entry
points and the order of their arguments. ``relay.build`` writes modules to it, its C entry
source (``relay.executor_codegen``) implements it, and the graph executor calls it.

Every entry takes its arguments as one array of pointers (the module's packed calling
convention, docs/module-format.md). ``default_run(inputs..., outputs..., params,
workspace)`` runs the network; ``default_profile`` takes the same and then ``times`` (one
int64 of nanoseconds per kernel call) and ``number`` (how many runs to add up);
``default_load_params(params)`` copies the module's weights in; ``default_set_param(params,
value, n, offset)`` overwrites ``n`` bytes of them at ``offset``.

Standard library only: the device side reads it too.
"""
from __future__ import annotations

from dataclasses import dataclass

FORMAT = "kernelrpc.graph"
VERSION = 1
#: each entry's exported symbol is this prefix and its name (as every kernel's)
SYMBOL_PREFIX = "__kernelrpc_fn_"
RUN, PROFILE, LOAD_PARAMS, SET_PARAM = ("default_run", "default_profile", "default_load_params",
                                        "default_set_param")
#: default_set_param's status when the slice is outside the params buffer
ERR_RANGE = 4


@dataclass(frozen=True)
class KernelCall:
    """One call of a kernel by ``default_run``: its symbol and where each argument lives
    (a ``memory_plan`` location: an input, an output, the params or the workspace)."""

    symbol: str
    locations: tuple


def symbol(name: str) -> str:
    return SYMBOL_PREFIX + name


def run_arguments(inputs: int, outputs: int) -> dict:
    """Positions of ``default_run``'s arguments: ``params`` and ``workspace`` after the
    inputs and outputs, then ``default_profile``'s ``times`` and ``number``."""
    params = inputs + outputs
    return {"params": params, "workspace": params + 1, "times": params + 2, "number": params + 3}


def entry_functions(executor: dict) -> list[dict]:
    """The module metadata's records of the entry points (names, symbols, arguments)."""
    def tensor(name, shape, dtype):
        return {"name": name, "kind": "tensor", "dtype": dtype, "shape": shape}

    def scalar(name):
        return {"name": name, "kind": "scalar", "dtype": "int64"}
    params = tensor("params", [max(executor["params_bytes"], 1)], "uint8")
    common = [tensor(t["name"], t["shape"], t["dtype"]) for t in executor["inputs"]]
    common += [tensor(t["name"], t["shape"], t["dtype"]) for t in executor["outputs"]]
    common += [params, tensor("workspace", [max(executor["workspace_bytes"], 1)], "uint8")]
    calls = max(len(executor["kernels"]), 1)
    arguments = {RUN: common,
                 PROFILE: common + [tensor("times", [calls], "int64"), scalar("number")],
                 LOAD_PARAMS: [params],
                 SET_PARAM: [params, tensor("value", ["n"], "uint8"), scalar("n"),
                             scalar("offset")]}
    return [{"name": name, "symbol": symbol(name), "args": args}
            for name, args in arguments.items()]
