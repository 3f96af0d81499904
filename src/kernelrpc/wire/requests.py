"""The requests of the session protocol: one small immutable type per operation, with named fields.

A REQUEST frame's body is ``u8 op`` and a value list (values.py). Each request type names its
fields and their wire types (with bounds where a field has them) in its annotations; the wire
values of a request are its fields in order, except for the requests whose last field collects
the remaining values (``CALL``'s arguments, ``FREE``'s and ``RELEASE``'s handles).
:func:`from_values` is the one place that checks what arrives: count, types and bounds. Its
errors are :class:`~kernelrpc.errors.ProtocolError`, which the server reports in an ERROR reply.

The types are NamedTuples (immutable, and cheap to build on the CALL path), not frozen
dataclasses with slots (Python 3.10+; the device side runs on 3.9). For the same reason the
server dispatches through a table keyed by :class:`Op` rather than a ``match`` statement.
"""
import enum
import math
import typing
from typing import Annotated, Any, NamedTuple, Tuple, get_type_hints

from ..errors import ProtocolError
from .values import DeviceValue, FunctionHandle, ModuleHandle, TensorHandle, check_layout


class Op(enum.IntEnum):
    """Request operations: the first byte of a REQUEST body (docs/protocol.md section 5)."""

    GET_GLOBAL = 1
    LOAD_MODULE = 2
    GET_FUNCTION = 3
    CALL = 4
    FREE = 5
    EMPTY = 6
    COPY_TO = 7
    COPY_FROM = 8
    UPLOAD = 9
    DOWNLOAD = 10
    REMOVE = 11
    LISTDIR = 12
    TIME_EVALUATOR = 13
    SHUTDOWN = 14
    LIST_GLOBALS = 15
    RELEASE = 16
    ARRAY = 17
    TIME_EVALUATOR_PACKED = 19    # 18 was its first form (conditions in JSON): retired, not reused
    ALLOCATE = 20
    GLOBAL_AT = 21


class Bounds(NamedTuple):
    """``low <= value <= high`` for an int or float field."""

    low: float
    high: float


class Rest(NamedTuple):
    """The last field takes every remaining wire value, each of one of ``kinds``."""

    kinds: Tuple[type, ...]


MAX_COUNT = (1 << 31) - 1          # number, repeat, ... (the runtime narrows them further)
MAX_BYTES = (1 << 63) - 1
MAX_INTERVAL_MS = 3_600_000.0
MAX_NAME_BYTES = 4096              # a file or function name
#: The handle ids a client may choose for ALLOCATE and GLOBAL_AT; the server assigns its own from 1 up to below
#: them. Below 2^61 - 1 an int is its own hash, so the two kinds never collide in the handle table.
CLIENT_IDS_FIRST = 1 << 48
CLIENT_IDS_LAST = (1 << 60) - 1

Count = Annotated[int, Bounds(0, MAX_COUNT)]
PositiveCount = Annotated[int, Bounds(1, MAX_COUNT)]
ByteCount = Annotated[int, Bounds(0, MAX_BYTES)]
Milliseconds = Annotated[float, Bounds(0.0, MAX_INTERVAL_MS)]
Name = Annotated[str, Bounds(0, MAX_NAME_BYTES)]        # bounds on the length
Shape = Annotated[list, "shape"]
DType = Annotated[str, "dtype"]
AnyHandle = (ModuleHandle, FunctionHandle, TensorHandle)
WIRE_VALUE = object   # CALL arguments: any value the value codec carries


class GetGlobal(NamedTuple):
    name: Name


class LoadModule(NamedTuple):
    name: Name


class GetFunction(NamedTuple):
    module: ModuleHandle
    name: Name


class Call(NamedTuple):
    """Call a function; on the wire its handle (tag 11) comes first, then the arguments.

    ``args`` is a list, or a tuple holding one int or float when protocol.decode_call took the
    one-unpack path (the server then skips converting it).
    """

    function_id: int
    args: Annotated[tuple, Rest((WIRE_VALUE,))]


class Free(NamedTuple):
    """Free handles and answer RETURN []; unknown ids are ignored."""

    handles: Annotated[tuple, Rest(AnyHandle)]


class Empty(NamedTuple):
    shape: Shape
    dtype: DType
    device: DeviceValue


class CopyTo(NamedTuple):
    """``nbytes`` raw bytes follow the frame."""

    tensor: TensorHandle
    offset: ByteCount
    nbytes: ByteCount


class CopyFrom(NamedTuple):
    tensor: TensorHandle
    offset: ByteCount
    nbytes: ByteCount


class Upload(NamedTuple):
    """``nbytes`` raw bytes follow the frame."""

    name: Name
    nbytes: ByteCount


class Download(NamedTuple):
    name: Name


class Remove(NamedTuple):
    name: Name


class ListDir(NamedTuple):
    name: Name


class TimeEvaluator(NamedTuple):
    module: ModuleHandle
    name: Name
    device: DeviceValue
    number: PositiveCount
    repeat: PositiveCount
    min_repeat_ms: Milliseconds
    cooldown_interval_ms: Milliseconds
    repeats_to_cooldown: PositiveCount
    f_preproc: Name
    limit_zero_time_iterations: Count
    cache_flush_bytes: ByteCount


class TimeEvaluatorPacked(TimeEvaluator):
    """TIME_EVALUATOR whose function returns the packed result (wire/profile.py)
    rather than JSON: the repeat times and the device conditions in binary, without the
    target and the function name (the client has them)."""

    __slots__ = ()


class Shutdown(NamedTuple):
    """No reply: the server ends the session."""


class ListGlobals(NamedTuple):
    pass


class Release(NamedTuple):
    """Free handles by id without a reply (the client's deferred frees, sent ahead of its next
    request). Unknown ids are ignored; a malformed RELEASE is logged by the server."""

    ids: Annotated[tuple, Rest((int,))]


class Array(NamedTuple):
    """Allocate a tensor and fill it with the ``nbytes`` raw bytes that follow the frame (its whole
    size), or zero-fill it (``nbytes`` 0); answered RETURN ``[id]``: the client knows the layout."""

    shape: Shape
    dtype: DType
    device: DeviceValue
    nbytes: ByteCount


class Allocate(NamedTuple):
    """Allocate the zero-filled tensor that ``tensor`` describes, under its id, which the client
    chose (CLIENT_IDS_FIRST..CLIENT_IDS_LAST), without a reply: a pipelined ``empty()``. A failure
    to allocate is kept under the id and raised by the first request that uses it; an id outside
    the client's range, in use, or past the server's ``max_client_tensors`` ends the session.

    The handle's bytes are the ones the client's later requests send for the tensor (a copy, a
    kernel call), so the server's decoder meets them again as a handle it has seen."""

    tensor: TensorHandle


class GlobalAt(NamedTuple):
    """Look up the global function ``name`` under the id ``function``, which the client chose
    (CLIENT_IDS_FIRST..CLIENT_IDS_LAST), without a reply: a pipelined ``get_function``. The
    client sends it only for a name the server's hello listed (``globals``), so the lookup cannot
    fail; an unknown name, an id outside the client's range or in use, or past the server's
    ``max_client_tensors`` (which bounds every entry under a client's ids) ends the session."""

    name: Name
    function: FunctionHandle


REQUEST_TYPES = {
    Op.GET_GLOBAL: GetGlobal, Op.LOAD_MODULE: LoadModule, Op.GET_FUNCTION: GetFunction, Op.CALL: Call,
    Op.FREE: Free, Op.EMPTY: Empty, Op.COPY_TO: CopyTo, Op.COPY_FROM: CopyFrom, Op.UPLOAD: Upload,
    Op.DOWNLOAD: Download, Op.REMOVE: Remove, Op.LISTDIR: ListDir, Op.TIME_EVALUATOR: TimeEvaluator,
    Op.SHUTDOWN: Shutdown, Op.LIST_GLOBALS: ListGlobals, Op.RELEASE: Release, Op.ARRAY: Array,
    Op.TIME_EVALUATOR_PACKED: TimeEvaluatorPacked, Op.ALLOCATE: Allocate, Op.GLOBAL_AT: GlobalAt,
}
OP_OF = {kind: op for op, kind in REQUEST_TYPES.items()}
NO_REPLY = frozenset({Op.SHUTDOWN, Op.RELEASE, Op.ALLOCATE, Op.GLOBAL_AT})
WITH_RAW_INPUT = frozenset({Op.COPY_TO, Op.UPLOAD, Op.ARRAY})  # raw bytes follow these requests
#: Ops that a server of this protocol version may lack: it lists the ones it serves in its hello.
OPTIONAL_OPS = frozenset({Op.RELEASE, Op.ARRAY, Op.TIME_EVALUATOR_PACKED, Op.ALLOCATE, Op.GLOBAL_AT})


# ---------------------------------------------------------------- checking

class _Field(NamedTuple):
    name: str
    kind: Any             # a type, or a tuple of types
    bounds: Any           # Bounds, "shape", "dtype" or None
    rest: bool


def _fields_of(request_type) -> tuple:
    fields = []
    for name, hint in get_type_hints(request_type, include_extras=True).items():
        kind, extra = hint, None
        if typing.get_origin(hint) is Annotated:
            kind, extra = hint.__origin__, hint.__metadata__[0]
        if isinstance(extra, Rest):
            fields.append(_Field(name, extra.kinds, None, True))
        else:
            fields.append(_Field(name, kind, extra, False))
    return tuple(fields)


_FIELDS = {op: _fields_of(kind) for op, kind in REQUEST_TYPES.items() if op != Op.CALL}


def _type_error(op: Op, field: str, expected, value) -> ProtocolError:
    names = "/".join(k.__name__ for k in (expected if isinstance(expected, tuple) else (expected,)))
    return ProtocolError(f"{op.name}: {field} must be {names}, got {type(value).__name__}")


def _check(op: Op, field: _Field, value) -> None:
    kind, bounds = field.kind, field.bounds
    if type(value) is not kind:  # the decoder makes exact types: a subclass is rare, and never an int
        if kind is int or kind is float or not (kind is WIRE_VALUE or isinstance(value, kind)):
            raise _type_error(op, field.name, kind, value)
    if bounds is None or bounds.__class__ is str:  # "shape", "dtype": checked together below
        return
    if kind is str:
        if len(value.encode("utf-8", "surrogatepass")) > bounds.high:
            raise ProtocolError(f"{op.name}: {field.name} is longer than {int(bounds.high)} bytes")
        return
    low, high = bounds
    if not (low <= value <= high) or (kind is float and math.isnan(value)):
        raise ProtocolError(f"{op.name}: {field.name}={value!r} is outside [{low}, {high}]")


_OP_BY_VALUE = {int(op): op for op in Op}
_CALL = int(Op.CALL)
_LAYOUT_OPS = frozenset({int(Op.EMPTY), int(Op.ARRAY)})  # ints: reading Op.X costs ~0.3 us a time
_FIELDS_BY_VALUE = {int(op): fields for op, fields in _FIELDS.items()}
_TYPE_BY_VALUE = {int(op): kind for op, kind in REQUEST_TYPES.items()}
_tuple_new = tuple.__new__  # a NamedTuple from a checked list, without its Python-level __new__


def from_values(values_op: int, values: list):
    """The request of ``op`` made from its decoded wire values; ProtocolError names what is wrong."""
    op = _OP_BY_VALUE.get(values_op)
    if op is None:
        raise ProtocolError(f"unknown request operation {values_op}")
    if values_op == _CALL:
        if not values or type(values[0]) is not FunctionHandle:
            raise ProtocolError("CALL needs a function handle first")
        return Call(values[0].id, values[1:])
    fields = _FIELDS_BY_VALUE[values_op]
    if fields and fields[-1].rest:
        fixed = len(fields) - 1
        if len(values) < fixed:
            raise ProtocolError(f"{op.name}: expected at least {fixed} values, got {len(values)}")
        rest, kinds = tuple(values[fixed:]), fields[-1].kind
        for value in rest:
            if not isinstance(value, kinds) or isinstance(value, bool):
                raise _type_error(op, fields[-1].name + " entries", kinds, value)
        values = [*values[:fixed], rest]
    elif len(values) != len(fields):
        raise ProtocolError(f"{op.name}: expected {len(fields)} values "
                            f"({', '.join(f.name for f in fields) or 'none'}), got {len(values)}")
    for field, value in zip(fields, values):
        if not field.rest:
            _check(op, field, value)
    request = _tuple_new(_TYPE_BY_VALUE[values_op], values)
    if values_op in _LAYOUT_OPS:
        try:
            check_layout(request.dtype, request.shape)
        except ProtocolError as exc:
            raise ProtocolError(f"{op.name}: {exc}") from None
    return request


def to_values(request) -> list:
    """The wire values of a request (its fields in order, a collecting last field spread out)."""
    if type(request) is Call:
        return [FunctionHandle(request.function_id), *request.args]
    fields = _FIELDS[OP_OF[type(request)]]
    if fields and fields[-1].rest:
        return [*request[:-1], *request[-1]]
    return list(request)


__all__ = ["Op", "REQUEST_TYPES", "OP_OF", "NO_REPLY", "WITH_RAW_INPUT", "OPTIONAL_OPS", "CLIENT_IDS_FIRST",
           "CLIENT_IDS_LAST", "from_values", "to_values", *(t.__name__ for t in REQUEST_TYPES.values())]
