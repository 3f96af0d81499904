"""Parse and validate a module's ``__kernelrpc_metadata`` JSON (docs/module-format.md).

A module can arrive over the network, so the document is untrusted: every field is checked for
type and bounds before anything uses it, and every problem is a ModuleError saying what is wrong.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from ..errors import ModuleError
from .dtype import DTYPES, MAX_NDIM, DType

FORMAT_NAME = "kernelrpc.module"
FORMAT_VERSION = 1
MAX_METADATA_BYTES = 64 << 20
MAX_FUNCTIONS = 4096
MAX_ARGS = 256
MAX_NAME_LEN = 256
MAX_TENSOR_BYTES = 1 << 48

_FUNCTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
# Function symbols must carry the prefix: a bare name such as "abort" would resolve in libc.
_SYMBOL = re.compile(r"__kernelrpc_fn_[A-Za-z0-9_.$]+\Z")


@dataclass(frozen=True)
class ArgSpec:
    name: str
    kind: str                               # "tensor" or "scalar"
    dtype: DType
    shape: tuple[int | str, ...] | None = None    # None for scalars; str: a shape variable

    def describe(self) -> str:
        if self.kind == "scalar":
            return f"{self.name}: {self.dtype}"
        return f"{self.name}: {self.dtype}{list(self.shape)}"


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    symbol: str
    args: tuple[ArgSpec, ...]
    #: positions of the scalar arguments that tensor shapes name (symbolic dimensions)
    shape_vars: tuple[int, ...] = ()

    def signature(self) -> str:
        return f"{self.name}({', '.join(a.describe() for a in self.args)})"


@dataclass(frozen=True)
class ModuleMetadata:
    version: int
    producer: str
    target: dict
    entry: str | None
    functions: dict[str, FunctionSpec]
    document: dict                          # the parsed JSON, unknown keys included


def parse_metadata(text: bytes | str) -> ModuleMetadata:
    if len(text) > MAX_METADATA_BYTES:
        raise ModuleError(f"module metadata is {len(text)} bytes; at most {MAX_METADATA_BYTES}")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ModuleError(f"module metadata is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ModuleError(f"module metadata must be a JSON object, got {_json_type(doc)}")
    if doc.get("format") != FORMAT_NAME:
        raise ModuleError(f"not a kernelrpc module: metadata 'format' is {doc.get('format')!r}, "
                          f"expected {FORMAT_NAME!r}")
    version = doc.get("version")
    if not _is_int(version) or version < 1:
        raise ModuleError(f"module metadata 'version' must be a positive integer, got {version!r}")
    if version > FORMAT_VERSION:
        raise ModuleError(f"module format version {version} is newer than this runtime supports "
                          f"(version {FORMAT_VERSION}); update kernelrpc on the device")
    producer = doc.get("producer", "")
    if not isinstance(producer, str):
        raise ModuleError(f"module metadata 'producer' must be a string, got {_json_type(producer)}")
    target = doc.get("target", {})
    if not isinstance(target, dict):
        raise ModuleError(f"module metadata 'target' must be an object, got {_json_type(target)}")

    raw_functions = doc.get("functions")
    if not isinstance(raw_functions, list):
        raise ModuleError("module metadata 'functions' must be a list")
    if len(raw_functions) > MAX_FUNCTIONS:
        raise ModuleError(f"module declares {len(raw_functions)} functions; at most {MAX_FUNCTIONS}")
    functions: dict[str, FunctionSpec] = {}
    for index, raw in enumerate(raw_functions):
        spec = _parse_function(raw, f"functions[{index}]")
        if spec.name in functions:
            raise ModuleError(f"module declares function {spec.name!r} twice")
        functions[spec.name] = spec

    entry = doc.get("entry")
    if entry is not None and (not isinstance(entry, str) or entry not in functions):
        raise ModuleError(f"module metadata 'entry' {entry!r} does not name a declared function")
    return ModuleMetadata(version, producer, target, entry, functions, doc)


def _parse_function(raw, where: str) -> FunctionSpec:
    if not isinstance(raw, dict):
        raise ModuleError(f"{where} must be an object, got {_json_type(raw)}")
    name = _name(raw.get("name"), f"{where}.name", _FUNCTION_NAME)
    symbol = _name(raw.get("symbol"), f"{where}.symbol", _SYMBOL)
    raw_args = raw.get("args")
    if not isinstance(raw_args, list):
        raise ModuleError(f"{where}.args of {name!r} must be a list")
    if len(raw_args) > MAX_ARGS:
        raise ModuleError(f"function {name!r} declares {len(raw_args)} arguments; "
                          f"at most {MAX_ARGS}")
    args = tuple(_parse_arg(a, f"{name}: args[{i}]") for i, a in enumerate(raw_args))
    scalars = {a.name: i for i, a in enumerate(args)
               if a.kind == "scalar" and a.dtype.name.startswith(("int", "uint"))}
    named = {d for a in args if a.kind == "tensor" for d in a.shape if isinstance(d, str)}
    for dim in named:
        if dim not in scalars:
            raise ModuleError(f"function {name!r}: shape variable {dim!r} is not an integer "
                              "scalar argument")
    return FunctionSpec(name, symbol, args, tuple(sorted(scalars[d] for d in named)))


def _parse_arg(raw, where: str) -> ArgSpec:
    if not isinstance(raw, dict):
        raise ModuleError(f"{where} must be an object, got {_json_type(raw)}")
    name = raw.get("name", "")
    if not isinstance(name, str) or len(name) > MAX_NAME_LEN:
        raise ModuleError(f"{where}.name must be a string of at most {MAX_NAME_LEN} characters")
    dtype = DTYPES.get(raw.get("dtype")) if isinstance(raw.get("dtype"), str) else None
    if dtype is None:
        raise ModuleError(f"{where}.dtype {raw.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    kind = raw.get("kind")
    if kind == "scalar":
        return ArgSpec(name, kind, dtype)
    if kind != "tensor":
        raise ModuleError(f"{where}.kind must be 'tensor' or 'scalar', got {kind!r}")
    shape = raw.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise ModuleError(f"{where}.shape must be a list of at most {MAX_NDIM} integers")
    if not all((_is_int(d) and d >= 0) or (isinstance(d, str) and 0 < len(d) <= MAX_NAME_LEN)
               for d in shape):
        raise ModuleError(f"{where}.shape entries must be non-negative integers or names of "
                          f"shape variables, got {shape}")
    if math.prod(d for d in shape if _is_int(d)) * dtype.itemsize > MAX_TENSOR_BYTES:
        raise ModuleError(f"{where}.shape {shape} is implausibly large")
    return ArgSpec(name, kind, dtype, tuple(shape))


def _name(value, where: str, pattern: re.Pattern) -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME_LEN or not pattern.match(value):
        raise ModuleError(f"{where} must be an identifier of at most {MAX_NAME_LEN} characters, "
                          f"got {value!r}")
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _json_type(value) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean",
            type(None): "null"}.get(type(value), "number")
