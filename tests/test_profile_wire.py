"""The packed wire form of a time_evaluator result (TIME_EVALUATOR_PACKED): both paths against a
real server give the same ProfileResult, and a bad packed body is a clear ProtocolError."""
import json
import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import kernelrpc
from kernelrpc import nd, rpc
from kernelrpc.rpc import channel as channel_module
from kernelrpc.rpc import protocol as P
from kernelrpc.rpc.remote import Function
from kernelrpc.rpc.requests import Op
from kernelrpc.runtime import ProfileResult

TARGET = {"string": "llvm -mtriple=x86_64-linux-gnu -mcpu=skylake -mattr=+avx2", "kind": "llvm"}
CONDITIONS = {"wall_s": 0.002, "cpus": [0, 1], "own_cpu_s": 0.0019, "other_cpu_s": 0.0, "other_load": 0.0,
              "preempted": 1, "freq_mhz": None, "threads": [{"tid": 7, "cpu": 1, "cpu_s": 0.0019}],
              "clock_tick_s": 0.01}


def via_json(result: ProfileResult) -> ProfileResult:
    """What the JSON path makes of a result on the device (handler.py, then remote.py)."""
    return ProfileResult.from_dict(json.loads(json.dumps(result.to_dict())))


def packed(number=3, results=(1e-6, 2e-6), rest=b'{"function":"f","conditions":null}') -> bytes:
    return struct.pack(f"<QI{len(results)}d", number, len(results), *results) + rest


# ------------------------------------------------------------ against a real server

@pytest.fixture
def module(session, fixture_module):
    session.upload(fixture_module, "kernels.so")
    return session.load_module("kernels.so")


def time_addone(sess, module):
    dev = sess.cpu(0)
    a = nd.array(np.arange(1024, dtype="float32"), dev)
    b = nd.empty((1024,), "float32", dev)
    timer = module.time_evaluator("addone", dev, number=4, repeat=5)
    return timer, timer(a, b), Function.__call__(timer, a, b)   # the ProfileResult, the wire value


def check_result(result, module):
    assert isinstance(result, ProfileResult)
    assert result.repeat == 5 and result.number == 4 and result.function == "addone"
    assert result.target == module.target and result.target.get("string")
    assert all(math.isfinite(r) and r >= 0 for r in result.results)
    assert set(result.conditions) >= {"wall_s", "cpus"}


def test_the_server_lists_the_packed_form_and_the_client_uses_it(session, module):
    assert Op.TIME_EVALUATOR_PACKED in session.channel.ops
    timer, result, wire = time_addone(session, module)
    assert type(wire) is bytes and b"string" not in wire   # binary times, no target echoed
    check_result(result, module)
    assert P.decode_profile(wire, module.target) == via_json(P.decode_profile(wire, module.target))


def test_without_the_packed_form_the_result_comes_as_json(server, fixture_module, monkeypatch):
    monkeypatch.setattr(channel_module, "served_optional_ops",
                        lambda info: frozenset({Op.RELEASE, Op.ARRAY}))
    with rpc.connect(server.host, server.port, key="dev") as sess:
        sess.upload(fixture_module, "kernels.so")
        module = sess.load_module("kernels.so")
        timer, result, wire = time_addone(sess, module)
        assert type(wire) is str
        check_result(result, module)
        assert result.target == json.loads(wire)["target"]  # the target the device echoes is the client's


def time_on_a_new_session(server, fixture_module):
    with rpc.connect(server.host, server.port, key="dev") as sess:   # the server serves one at a time
        sess.upload(fixture_module, "kernels.so")
        _, result, wire = time_addone(sess, sess.load_module("kernels.so"))
    return result, wire


def test_both_paths_give_the_same_profile_result(server, fixture_module, monkeypatch):
    new, wire = time_on_a_new_session(server, fixture_module)
    monkeypatch.setattr(channel_module, "served_optional_ops", lambda info: frozenset())
    old, old_wire = time_on_a_new_session(server, fixture_module)
    assert type(old_wire) is str and type(wire) is bytes
    # timings differ from run to run: everything else is the same, and the same values give equal results
    for name in ("number", "repeat", "target", "function"):
        assert getattr(new, name) == getattr(old, name)
    assert set(new.conditions) == set(old.conditions)
    assert type(new) is type(old) and new.to_dict().keys() == old.to_dict().keys()
    same_values = ProfileResult.from_dict({**json.loads(old_wire), "results": list(new.results),
                                           "conditions": new.conditions})
    assert same_values == new and str(same_values) == str(new) and repr(same_values) == repr(new)


# ------------------------------------------------------------ the codec (sans-IO)

times = st.lists(st.floats(min_value=0, max_value=1e3, allow_nan=False), min_size=1, max_size=50)


@given(times, st.integers(1, (1 << 63) - 1), st.text(max_size=40), st.sampled_from([None, CONDITIONS]))
def test_packed_round_trip_equals_the_json_round_trip(results, number, function, conditions):
    result = ProfileResult(results, number, TARGET, function, conditions)
    decoded = P.decode_profile(P.encode_profile(result), TARGET)
    assert decoded == via_json(result) == result
    assert decoded.results == tuple(results)  # bit for bit


BAD_BODIES = {
    "not bytes": ("text", "expected bytes, got str"),
    "shorter than the header": (b"\1\0\0", "shorter than its header"),
    "number 0": (packed(number=0), "number=0"),
    "number past 2^63": (packed(number=1 << 63), "number=9223372036854775808"),
    "no repeats": (packed(results=()), "repeat=0"),
    "too many repeats": (struct.pack("<QI", 1, 1 << 30), "repeat=1073741824"),
    "times cut short": (packed()[:20], "need 28 bytes, got 20"),
    "negative time": (packed(results=(1e-6, -1e-6)), "finite and non-negative"),
    "NaN time": (packed(results=(math.nan,)), "finite and non-negative"),
    "infinite time": (packed(results=(math.inf,)), "finite and non-negative"),
    "no JSON part": (packed(rest=b""), "packed time_evaluator result"),
    "JSON not an object": (packed(rest=b"[1]"), "object with a string 'function'"),
    "function not a string": (packed(rest=b'{"function":1}'), "object with a string 'function'"),
    "bad conditions": (packed(rest=b'{"function":"f","conditions":{"cpus":[0]}}'), "wall_s"),
    "not UTF-8": (packed(rest=b'{"function":"\xff"}'), "packed time_evaluator result"),
    "deeply nested": (packed(rest=b"[" * 100_000), "packed time_evaluator result"),
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_a_bad_packed_result_is_a_clear_protocol_error(name):
    body, message = BAD_BODIES[name]
    with pytest.raises(kernelrpc.ProtocolError, match=message):
        P.decode_profile(body, TARGET)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_give_a_protocol_error(data):
    try:
        result = P.decode_profile(data, TARGET)
    except kernelrpc.ProtocolError:
        return
    assert all(0 <= r < math.inf for r in result.results) and 1 <= result.number


@given(times, st.data())
def test_a_damaged_packed_result_decodes_or_gives_a_protocol_error(results, data):
    body = bytearray(P.encode_profile(ProfileResult(results, 2, TARGET, "f", CONDITIONS)))
    for _ in range(data.draw(st.integers(1, 4))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body)))
    try:
        P.decode_profile(bytes(body[:cut]), TARGET)
    except kernelrpc.ProtocolError:
        pass
