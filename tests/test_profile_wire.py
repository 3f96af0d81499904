"""The packed wire form of a time_evaluator result (TIME_EVALUATOR_PACKED): both paths against a
real server give the same ProfileResult, the binary conditions come back exactly as they went,
a bad packed body is a clear ProtocolError, and clients and servers of the earlier packed form
(op 18, retired) fall back to JSON."""
import json
import math
import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import kernelrpc
from kernelrpc import nd, rpc
from kernelrpc.wire import connection as connection_module
from kernelrpc.wire import profile as profile_codec
from kernelrpc.wire import protocol as P
from kernelrpc.rpc.remote import Function
from kernelrpc.wire.requests import Op
from kernelrpc.runtime import ProfileResult
from kernelrpc.runtime import conditions as conditions_module

TARGET = {"string": "llvm -mtriple=x86_64-linux-gnu -mcpu=skylake -mattr=+avx2", "kind": "llvm"}
CONDITIONS = {"wall_s": 0.002, "cpus": [0, 1], "own_cpu_s": 0.0019, "other_cpu_s": 0.0, "other_load": 0.0,
              "preempted": 1, "freq_mhz": None, "threads": [{"tid": 7, "cpu": 1, "cpu_s": 0.0019}],
              "clock_tick_s": 0.01}


def via_json(result: ProfileResult) -> ProfileResult:
    """What the JSON path makes of a result on the device (handler.py, then remote.py)."""
    return ProfileResult.from_dict(json.loads(json.dumps(result.to_dict())))


def packed(number=3, results=(1e-6, 2e-6), rest=b"") -> bytes:
    return struct.pack(f"<QI{len(results)}d", number, len(results), *results) + rest


def conditions_part(wall=0.002, own=0.0019, other=0.0, load=0.0, freq=(math.nan, math.nan), tick=0.01,
                    preempted=1, cpus=(0, 1), threads=((7, 1, 0.0019),), nthreads=None) -> bytes:
    """The conditions' binary form (docs/protocol.md section 5.3), written out by hand."""
    return (struct.pack("<7dqHH", wall, own, other, load, *freq, tick, preempted, len(cpus),
                        len(threads) if nthreads is None else nthreads)
            + struct.pack(f"<{len(cpus)}I", *cpus) + b"".join(struct.pack("<Iid", *t) for t in threads))


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
    assert Op.TIME_EVALUATOR_PACKED in session.channel.connection.ops
    timer, result, wire = time_addone(session, module)
    assert type(wire) is bytes and b"string" not in wire   # binary times, no target echoed
    check_result(result, module)
    decoded = profile_codec.decode_profile(wire, module.target, "addone")
    assert decoded == via_json(decoded) and decoded.conditions["threads"]


@pytest.mark.parametrize("served", [frozenset({Op.RELEASE, Op.ARRAY}),          # no packed form
                                    frozenset({Op.RELEASE, Op.ARRAY, 18})],     # the earlier one (op 18)
                         ids=["no-packed-form", "earlier-packed-form"])
def test_without_the_packed_form_the_result_comes_as_json(server, fixture_module, monkeypatch, served):
    monkeypatch.setattr(connection_module, "served_optional_ops", lambda info: served)
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
    monkeypatch.setattr(connection_module, "served_optional_ops", lambda info: frozenset())
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


def test_a_server_serves_no_earlier_packed_form_and_names_it_in_the_error(session, module):
    """A client of the earlier packed form (op 18) sends it only to a server that lists it; this
    one does not, and a stray one is refused by number."""
    assert 18 not in session.channel.connection.ops
    with pytest.raises(kernelrpc.RemoteError, match="18"):
        session.channel._exchange(P.encode_request(18, [module._handle, "addone"]))
    assert session.get_function("testing.echo")(5) == 5      # the session goes on


# ------------------------------------------------------------ the codec (sans-IO)

times = st.lists(st.floats(min_value=0, max_value=1e3, allow_nan=False), min_size=1, max_size=50)
seconds = st.floats(min_value=0, allow_nan=False, allow_infinity=False)
maybe_seconds = st.none() | seconds | st.integers(0, 1 << 40)
cpu_numbers = st.integers(0, conditions_module.MAX_CPU_NUMBER - 1)
conditions_dicts = st.fixed_dictionaries({
    "wall_s": seconds, "cpus": st.lists(cpu_numbers, min_size=1, max_size=20),
    "own_cpu_s": maybe_seconds, "other_cpu_s": maybe_seconds, "other_load": maybe_seconds,
    "preempted": st.none() | st.integers(0, conditions_module.MAX_COUNT),
    "freq_mhz": st.none() | st.lists(seconds, min_size=2, max_size=2),
    "threads": st.none() | st.lists(st.fixed_dictionaries({
        "tid": st.integers(0, conditions_module.MAX_TID), "cpu": st.none() | cpu_numbers,
        "cpu_s": seconds | st.integers(0, 1 << 40)}), max_size=10),
    "clock_tick_s": maybe_seconds,
})


@given(times, st.integers(1, (1 << 63) - 1), st.text(max_size=40), st.none() | conditions_dicts)
def test_packed_round_trip_equals_the_json_round_trip(results, number, function, conditions):
    result = ProfileResult(results, number, TARGET, function, conditions_module.check_conditions(conditions))
    decoded = profile_codec.decode_profile(profile_codec.encode_profile(number, results, conditions), TARGET, function)
    assert decoded == via_json(result) == result
    assert decoded.results == tuple(results)  # bit for bit
    assert decoded.conditions == conditions_module.check_conditions(conditions)  # exactly, nulls included
    assert json.dumps(decoded.conditions) == json.dumps(via_json(result).conditions)


def test_a_measured_result_round_trips_exactly():
    from kernelrpc.runtime.conditions import default_probe

    measurement = default_probe().measurement()
    measurement.batch_started()
    conditions = measurement.report()
    assert conditions["threads"]
    decoded = profile_codec.decode_profile(profile_codec.encode_profile(4, [1e-6, 2e-6], conditions), TARGET, "f")
    assert decoded.conditions == conditions


def test_values_beyond_the_packed_form_are_refused_on_the_device():
    bad = {**CONDITIONS, "threads": [{"tid": 1 << 40, "cpu": 0, "cpu_s": 0.0}]}
    with pytest.raises(ValueError, match="out of the packed form's range"):
        profile_codec.encode_profile(1, [1e-6], bad)
    with pytest.raises(ValueError, match="thread number"):
        conditions_module.check_conditions(bad)


NAN = math.nan
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
    "conditions cut short": (packed(rest=conditions_part()[:40]), "cut short: 40 bytes"),
    "conditions lists cut short": (packed(rest=conditions_part()[:-1]), "take 92 bytes, got 91"),
    "a byte after the conditions": (packed(rest=conditions_part() + b"\0"), "take 92 bytes, got 93"),
    "no CPUs": (packed(rest=conditions_part(cpus=())), "0 CPUs"),
    "too many CPUs": (packed(rest=conditions_part(cpus=range(4097))), "4097 CPUs"),
    "too many threads": (packed(rest=conditions_part(nthreads=4097)), "4097 threads"),
    "CPU number too big": (packed(rest=conditions_part(cpus=(0, 1 << 20))), "CPU 1048576"),
    "NaN wall_s": (packed(rest=conditions_part(wall=NAN)), "'wall_s' must be a finite number"),
    "negative own_cpu_s": (packed(rest=conditions_part(own=-1.0)), "'own_cpu_s' must be"),
    "infinite other_load": (packed(rest=conditions_part(load=math.inf)), "'other_load' must be"),
    "half a frequency": (packed(rest=conditions_part(freq=(NAN, 2400.0))), "'freq_mhz' must be"),
    "negative frequency": (packed(rest=conditions_part(freq=(-1.0, 2400.0))), "'freq_mhz' must be"),
    "preempted below -1": (packed(rest=conditions_part(preempted=-2)), "'preempted' must be"),
    "thread CPU below -1": (packed(rest=conditions_part(threads=((7, -2, 0.0),))), "of thread 7"),
    "thread time NaN": (packed(rest=conditions_part(threads=((7, 0, NAN),))), "of thread 7"),
}


#: Checked when the reply arrives: everything but the conditions' values, which are checked when
#: ``ProfileResult.conditions`` is first read (their lengths and counts are checked on arrival).
CHECKED_ON_ARRIVAL = {name for name in BAD_BODIES if not name.startswith((
    "CPU number", "NaN wall_s", "negative own", "infinite other", "half a", "negative freq",
    "preempted", "thread CPU", "thread time"))}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
def test_a_bad_packed_result_is_a_clear_protocol_error(name):
    body, message = BAD_BODIES[name]
    if name in CHECKED_ON_ARRIVAL:
        with pytest.raises(kernelrpc.ProtocolError, match=message):
            profile_codec.decode_profile(body, TARGET, "f")
        return
    result = profile_codec.decode_profile(body, TARGET, "f")
    assert result.results == (1e-6, 2e-6) and result.number == 3
    for _ in range(2):   # at the first read of the conditions, and at every read after
        with pytest.raises(kernelrpc.ProtocolError, match=message):
            result.conditions
    for read in (repr, str, ProfileResult.to_dict, ProfileResult.disturbance, ProfileResult.conditions_text):
        with pytest.raises(kernelrpc.ProtocolError, match=message):
            read(result)


def test_the_conditions_are_decoded_at_their_first_read():
    body = packed(rest=conditions_part())
    result = profile_codec.decode_profile(body, TARGET, "f")
    assert result._conditions is None and result._decode is not None
    assert result.conditions == CONDITIONS
    assert result._decode is None and result.conditions is result.conditions
    result.conditions = None    # set by hand: the pending decode is dropped
    assert result.conditions is None


def test_a_pickled_packed_result_carries_its_conditions():
    import pickle

    result = profile_codec.decode_profile(packed(rest=conditions_part()), TARGET, "f")
    again = pickle.loads(pickle.dumps(result))
    assert again == result and again.conditions == result.conditions


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_decode_or_give_a_protocol_error(data):
    try:
        result = profile_codec.decode_profile(data, TARGET, "f")
        conditions = result.conditions
    except kernelrpc.ProtocolError:
        return
    assert all(0 <= r < math.inf for r in result.results) and 1 <= result.number
    assert conditions_module.check_conditions(conditions) == conditions  # as JSON would judge


@given(times, st.data())
def test_a_damaged_packed_result_decodes_or_gives_a_protocol_error(results, data):
    body = bytearray(profile_codec.encode_profile(2, results, CONDITIONS))
    for _ in range(data.draw(st.integers(1, 4))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body)))
    try:
        result = profile_codec.decode_profile(bytes(body[:cut]), TARGET, "f")
    except kernelrpc.ProtocolError:
        return
    try:
        conditions = result.conditions
    except kernelrpc.ProtocolError as exc:   # a value, never a length or a count, is found bad later
        assert not str(exc).startswith("packed time_evaluator result: conditions cut short")
        assert " take " not in str(exc) and " threads; at most " not in str(exc)
        return
    assert conditions_module.check_conditions(conditions) == conditions


def test_the_packers_kept_per_shape_are_bounded_and_pack_what_the_format_does():
    profile_codec._PROFILE_SHAPES.clear()
    for repeat in range(1, profile_codec._MAX_PROFILE_SHAPES + 10):
        results = [i * 1e-7 for i in range(repeat)]
        body = profile_codec.encode_profile(3, results, CONDITIONS)
        assert len(profile_codec._PROFILE_SHAPES) <= profile_codec._MAX_PROFILE_SHAPES
        assert body == packed(3, results, conditions_part(other=0.0, load=0.0))
        assert profile_codec.decode_profile(body, TARGET, "f").conditions == CONDITIONS
