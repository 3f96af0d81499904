"""Every request type: round trips through the codec, and bad types, out-of-range values and
truncated bodies each give a ProtocolError that names the problem."""
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_protocol import devices, dtypes, handles, values

from kernelrpc.errors import ProtocolError
from kernelrpc.wire import protocol as P
from kernelrpc.wire.hello import HelloReplyParser, encode_hello_accept
from kernelrpc.wire import requests as R
from kernelrpc.wire.values import FunctionHandle, ModuleHandle, TensorHandle, decode_values

module_handles = st.builds(ModuleHandle, handles)
tensor_handles = st.builds(TensorHandle, handles, dtypes, st.lists(st.integers(0, 2**20), max_size=3).map(tuple),
                           devices)
names = st.text(max_size=40)


def field_values(field):
    """Valid values for one field of a request type (from its declared kind and bounds)."""
    if field.rest:
        if field.kind == (int,):
            return st.lists(st.integers(0, 2**63 - 1), max_size=5).map(tuple)
        if field.kind is R.AnyHandle:
            return st.lists(module_handles | st.builds(FunctionHandle, handles) | tensor_handles,
                            max_size=4).map(tuple)
        return st.lists(values, max_size=4).map(tuple)
    if field.bounds == "shape":
        return st.lists(st.integers(0, 64), max_size=4)
    if field.bounds == "dtype":
        return dtypes
    if field.kind is int:
        low, high = field.bounds or (0, 2**63 - 1)
        return st.integers(int(low), int(high))
    if field.kind is float:
        low, high = field.bounds
        return st.floats(low, high, allow_nan=False)
    if field.kind is str:
        return names
    return {ModuleHandle: module_handles, FunctionHandle: st.builds(FunctionHandle, handles),
            TensorHandle: tensor_handles, R.DeviceValue: devices}[field.kind]


def requests_of(op):
    kind = R.REQUEST_TYPES[op]
    if op == R.Op.CALL:
        return st.builds(kind, handles, st.lists(values, max_size=4))
    return st.tuples(*(field_values(f) for f in R._FIELDS[op])).map(kind._make)


all_requests = st.one_of(*(requests_of(op) for op in R.Op))


def frame_body(request) -> bytes:
    return P.encode(request)[P.HEADER_SIZE:]


def test_every_op_has_a_request_type_and_the_server_a_handler():
    from kernelrpc.server.config import ServerConfig
    from kernelrpc.server.handler import SessionHandler

    assert set(R.REQUEST_TYPES) == set(R.Op)
    handler = SessionHandler(None, None, ServerConfig())
    assert set(handler._handlers) == set(R.Op) - {R.Op.SHUTDOWN}
    assert all(P.OPS[op] == op.name and getattr(P, op.name) == op for op in R.Op)


@settings(max_examples=400)
@given(all_requests)
def test_requests_round_trip(request):
    decoded = P.decode_request(frame_body(request))
    assert type(decoded) is type(request)
    assert repr(tuple(decoded)) == repr(tuple(request)) or decoded == request


@given(st.data())
def test_a_field_of_the_wrong_type_is_named(data):
    op = data.draw(st.sampled_from([op for op in R.Op if R._FIELDS.get(op) and not R._FIELDS[op][0].rest]))
    fields = R._FIELDS[op]
    wire = R.to_values(data.draw(requests_of(op)))
    i = data.draw(st.integers(0, len(fields) - 1))
    if fields[i].rest:
        return
    wrong = {int: "1", float: 1, str: 1, list: "shape"}.get(fields[i].kind, 1.5)
    wire[i] = data.draw(st.sampled_from([wrong, None, True]))
    with pytest.raises(ProtocolError, match=f"{op.name}: {fields[i].name}"):
        P.decode_request(P.encode_request(op, wire)[P.HEADER_SIZE:])


@pytest.mark.parametrize("field, value", [
    ("number", 0), ("number", 2**31), ("repeat", -1), ("min_repeat_ms", -0.5), ("min_repeat_ms", math.nan),
    ("cooldown_interval_ms", math.inf), ("cache_flush_bytes", -1), ("limit_zero_time_iterations", -3),
])
def test_time_evaluator_fields_out_of_range_are_named(field, value):
    good = R.TimeEvaluator(ModuleHandle(1), "f", R.DeviceValue("cpu", 0), 10, 1, 0.0, 0.0, 1, "", 100, 0)
    bad = good._replace(**{field: value})
    with pytest.raises(ProtocolError, match=f"TIME_EVALUATOR: {field}="):
        P.decode_request(frame_body(bad))


@pytest.mark.parametrize("wire, message", [
    ([[2, -1], "float32", R.DeviceValue("cpu", 0)], "shape"),
    ([[2, True], "float32", R.DeviceValue("cpu", 0)], "shape"),
    ([[2] * 33, "float32", R.DeviceValue("cpu", 0)], "dimensions"),
    ([[2], "complex64", R.DeviceValue("cpu", 0)], "dtype"),
    ([[2], "float32"], "expected 3 values"),
])
def test_empty_layouts_are_checked(wire, message):
    with pytest.raises(ProtocolError, match=message):
        P.decode_request(P.encode_request(P.EMPTY, wire)[P.HEADER_SIZE:])


def test_counts_names_and_unknown_ops():
    with pytest.raises(ProtocolError, match="unknown request operation 200"):
        P.decode_request(bytes([200]) + P.encode_values([]))
    with pytest.raises(ProtocolError, match="GET_GLOBAL: expected 1 values"):
        P.decode_request(P.encode_request(P.GET_GLOBAL, ["a", "b"])[P.HEADER_SIZE:])
    with pytest.raises(ProtocolError, match="longer than 4096"):
        P.decode_request(frame_body(R.GetGlobal("x" * 5000)))
    with pytest.raises(ProtocolError, match="RELEASE: ids entries must be int"):
        P.decode_request(P.encode_request(P.RELEASE, [1, "2"])[P.HEADER_SIZE:])
    with pytest.raises(ProtocolError, match="FREE: handles entries"):
        P.decode_request(P.encode_request(P.FREE, [3])[P.HEADER_SIZE:])
    with pytest.raises(ProtocolError, match="CALL needs a function handle"):
        P.decode_request(P.encode_request(P.CALL, [1])[P.HEADER_SIZE:])


@settings(max_examples=300)
@given(all_requests, st.data())
def test_truncated_and_extended_bodies_are_protocol_errors(request, data):
    body = frame_body(request)
    cut = data.draw(st.integers(1, len(body) - 1)) if len(body) > 1 else 1
    if cut < len(body):
        with pytest.raises(ProtocolError):
            P.decode_request(body[:cut])
    with pytest.raises(ProtocolError):
        P.decode_request(body + data.draw(st.binary(min_size=1, max_size=5)))


@settings(max_examples=300)
@given(st.integers(0, 255), st.binary(max_size=80))
def test_arbitrary_bodies_raise_only_protocol_error(op, rest):
    try:
        P.decode_request(bytes([op]) + rest)
    except ProtocolError:
        pass


def test_named_fields_replace_positions():
    request = R.TimeEvaluator(ModuleHandle(1), "f", R.DeviceValue("cpu", 0), 10, 1, 0.0, 0.0, 1, "", 100, 0)
    assert request.repeats_to_cooldown == 1 and request.cache_flush_bytes == 0
    assert decode_values(frame_body(request), 1)[3] == 10
    with pytest.raises(AttributeError):
        request.number = 3  # frozen


# ---------------------------------------------------------------- ALLOCATE (a pipelined empty())

CPU = R.DeviceValue("cpu", 0)
client_ids = st.integers(R.CLIENT_IDS_FIRST, R.CLIENT_IDS_LAST)
shapes = st.lists(st.integers(0, 2**20), max_size=4).map(tuple)


def test_allocate_carries_the_handle_that_later_requests_send():
    handle = TensorHandle(R.CLIENT_IDS_FIRST + 3, "float32", (2, 3), CPU)
    body = frame_body(R.Allocate(handle))
    assert body[0] == R.Op.ALLOCATE and R.Op.ALLOCATE in R.NO_REPLY and R.Op.ALLOCATE in R.OPTIONAL_OPS
    copy = frame_body(R.CopyTo(handle, 0, 24))
    assert handle.wire in body and handle.wire in copy  # encoded once, sent again by the copy
    decoded = P.decode_request(body)
    assert type(decoded) is R.Allocate and decoded.tensor == handle and decoded.tensor.wire == handle.wire
    assert P.decode_request(copy).tensor == handle


@given(client_ids, dtypes, shapes, devices, st.data())
def test_damaged_allocate_requests_decode_alike_or_raise_protocol_error(handle_id, dtype, shape, device, data):
    body = bytearray(frame_body(R.Allocate(TensorHandle(handle_id, dtype, shape, device))))
    for _ in range(data.draw(st.integers(1, 3))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    try:
        decoded = P.decode_request(bytes(body))
    except ProtocolError:
        return
    if type(decoded) is R.Allocate:  # what decoded is exactly what its encoding says
        assert frame_body(R.Allocate(TensorHandle(*decoded.tensor._key()))) == bytes(body)


def test_allocate_needs_one_tensor_handle():
    with pytest.raises(ProtocolError, match="ALLOCATE: tensor must be TensorHandle"):
        P.decode_request(P.encode_request(P.ALLOCATE, [R.CLIENT_IDS_FIRST])[P.HEADER_SIZE:])
    with pytest.raises(ProtocolError, match="ALLOCATE: expected 1 values"):
        P.decode_request(P.encode_request(P.ALLOCATE, [])[P.HEADER_SIZE:])


def test_the_hello_announces_what_a_pipelined_empty_needs_within_bounds():
    info = HelloReplyParser().feed(encode_hello_accept({})).info
    assert info["max_session_bytes"] == 0 and info["max_client_tensors"] == 0  # an older server
    for field in ("max_session_bytes", "max_client_tensors"):
        with pytest.raises(ProtocolError, match=field):
            HelloReplyParser().feed(encode_hello_accept({field: -1}))
