"""A kernel's call kept prepared by the session handler (its tensors checked and its argument array
filled once, ``runtime.module.PreparedCall``) from its second call in a row with the same tensor
handles, driven without a network as the server's loop drives it: each later call with those
handles runs on the tensors' current memory; a freed, foreign, unknown or wrong-kind handle and a
wrong dtype or shape raise what they raised before; freeing a tensor or releasing the function
drops the prepared call, and nothing it keeps holds a freed tensor's memory."""
import gc
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelrpc import runtime
from kernelrpc.errors import KernelError
from kernelrpc.wire import protocol as P
from kernelrpc.wire import requests as R
from kernelrpc.wire.values import DeviceValue, FunctionHandle, TensorHandle, TensorValue
from kernelrpc.server.config import ServerConfig
from kernelrpc.server.handler import SessionHandler

CPU = DeviceValue("cpu", 0)
FIRST = R.CLIENT_IDS_FIRST
N = 1024  # the fixture's addone: B = A + 1 over float32[1024]


@pytest.fixture(scope="module")
def kernels(fixture_module):
    return runtime.load_module(str(fixture_module))


def session(kernels, name="addone", **config):
    """A handler with the kernel ``name`` in its table, as GET_FUNCTION puts it there; its id."""
    h = SessionHandler(None, None, ServerConfig(**config))
    return h, h.handles.put(kernels.get_function(name))


def allocate(h: SessionHandler, handle_id: int, dtype="float32", shape=(N,)) -> None:
    body = P.encode_request(P.ALLOCATE, [TensorHandle(handle_id, dtype, shape, CPU)])[P.HEADER_SIZE:]
    assert h._handlers[P.ALLOCATE](P.decode_request(body)) is None


def release(h: SessionHandler, *ids: int) -> None:
    body = P.encode_request(P.RELEASE, list(ids))[P.HEADER_SIZE:]
    assert h._handlers[P.RELEASE](P.decode_request(body)) is None


def handle(handle_id: int, dtype="float32", shape=(N,)) -> TensorHandle:
    return TensorHandle(handle_id, dtype, shape, CPU)


def call(h: SessionHandler, function_id: int, *args):
    """A CALL as the server's loop runs it: its frame decoded (the decoder's memos included), then
    handled; an int of the client's range stands for the handle of the tensor under that id."""
    args = [handle(a) if type(a) is int and a >= FIRST else a for a in args]
    request = h.connection.call_from_read(P.encode_call(function_id, args))
    assert P.decode_result(h._call(request)[P.HEADER_SIZE:]) is None


def prepared(h: SessionHandler, function_id: int):
    """The function's PreparedCall, or None."""
    kept = h.connection.kept.get(function_id)
    return None if kept is None else kept.prepared


def values(h: SessionHandler, handle_id: int) -> np.ndarray:
    return np.frombuffer(h.handles.tensor(handle(handle_id)).buffer, "float32")


def prepared_session(kernels, **options) -> tuple[SessionHandler, int]:
    """A session whose kernel ``f`` has been called twice on tensors FIRST and FIRST + 1: its call
    is prepared."""
    h, f = session(kernels, **options)
    allocate(h, FIRST)
    allocate(h, FIRST + 1)
    call(h, f, FIRST, FIRST + 1)
    call(h, f, FIRST, FIRST + 1)
    return h, f


def reachable(root) -> dict:
    """Every object reachable from ``root`` by reference, by id (types, modules and functions,
    which lead to everything, not followed)."""
    seen, stack = {}, [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue
        seen[id(obj)] = obj
        stack.extend(gc.get_referents(obj))
    return seen


def test_a_call_with_the_same_handles_runs_prepared_on_their_current_memory(kernels):
    h, f = session(kernels)
    allocate(h, FIRST)
    allocate(h, FIRST + 1)
    for step in range(4):
        values(h, FIRST)[:] = np.arange(N) * step   # what a COPY_TO between the calls writes
        call(h, f, FIRST, FIRST + 1)
        np.testing.assert_array_equal(values(h, FIRST + 1), np.arange(N) * step + 1)
        assert (prepared(h, f) is None) == (step == 0)  # prepared from the second call in a row
    assert h.connection.kept[f].args == [handle(FIRST), handle(FIRST + 1)]
    for step in range(2):                           # other handles: kept, then prepared, anew
        call(h, f, FIRST + 1, FIRST + 1)
        np.testing.assert_array_equal(values(h, FIRST + 1), np.arange(N) * 3 + 2 + step)
        assert (prepared(h, f) is None) == (step == 0)
    assert h.connection.kept[f].args == [handle(FIRST + 1), handle(FIRST + 1)]


def test_calls_alternating_between_tensors_are_never_prepared(kernels):
    h, f = session(kernels)
    allocate(h, FIRST)
    allocate(h, FIRST + 1)
    for step in range(4):
        call(h, f, FIRST + step % 2, FIRST + 1 - step % 2)
        assert prepared(h, f) is None
    np.testing.assert_array_equal(values(h, FIRST), 4)


def test_a_freed_tensor_drops_the_prepared_call_keeps_none_of_its_memory_and_is_refused(kernels):
    h, f = prepared_session(kernels)
    raw = h.handles.tensor(handle(FIRST + 1))._buf._raw
    assert id(raw) in reachable(prepared(h, f))     # what the check below looks for is found
    release(h, FIRST + 1)
    assert f not in h.connection.kept and id(raw) not in reachable(h)
    del raw
    with pytest.raises(LookupError, match=f"no tensor with handle {FIRST + 1} .*freed already"):
        call(h, f, FIRST, FIRST + 1)                # the same handles again, as a stale client sends them
    allocate(h, FIRST + 1)                          # a new tensor under the same id
    values(h, FIRST)[:] = 41
    call(h, f, FIRST, FIRST + 1)
    np.testing.assert_array_equal(values(h, FIRST + 1), 42)


def test_a_tensor_freed_outside_the_table_is_refused_by_the_prepared_call(kernels):
    """A server-side function that frees its tensor argument leaves it in the table: the prepared
    call does not run the kernel on its memory, and the call says why, as before."""
    h, f = prepared_session(kernels)
    kept = prepared(h, f)
    raw = h.handles.tensor(handle(FIRST))._buf._raw
    h.handles.tensor(handle(FIRST)).free()
    assert id(raw) not in reachable(kept) and kept.run() is False
    with pytest.raises(ValueError, match="addone\\(\\) argument 0 'A': the tensor has been freed"):
        call(h, f, FIRST, FIRST + 1)


def test_wrong_handles_after_a_prepared_call_raise_as_before_and_it_goes_on(kernels):
    h, f = session(kernels)
    allocate(h, FIRST)
    allocate(h, FIRST + 1)
    allocate(h, FIRST + 2, "int32")
    allocate(h, FIRST + 3, shape=(N - 1,))
    call(h, f, FIRST, FIRST + 1)
    call(h, f, FIRST, FIRST + 1)
    assert prepared(h, f) is not None
    cases = [
        ((FIRST, handle(FIRST + 2, "int32")), TypeError, "expected dtype float32, got int32"),
        ((FIRST, handle(FIRST + 3, shape=(N - 1,))), ValueError,
         "expected shape float32\\[1024\\], got \\[1023\\]"),
        ((FIRST, FIRST + 7), LookupError, f"no tensor with handle {FIRST + 7}"),
        ((FIRST, handle(f)), LookupError, f"no tensor with handle {f}"),         # a function's id
        ((FIRST, FunctionHandle(f)), TypeError, "expected a tensor float32\\[1024\\], got Function"),
        ((FIRST,), TypeError, "takes 2 arguments, got 1"),
        ((FIRST, FIRST + 1, FIRST), TypeError, "takes 2 arguments, got 3"),
        ((FIRST, 5), TypeError, "expected a tensor float32\\[1024\\], got int"),
    ]
    for args, error, message in cases:
        for _ in range(2):                          # twice: a failed call is not kept
            with pytest.raises(error, match=message):
                call(h, f, *args)
    values(h, FIRST)[:] = 6
    call(h, f, FIRST, FIRST + 1)
    np.testing.assert_array_equal(values(h, FIRST + 1), 7)


def test_releasing_the_function_drops_its_prepared_call(kernels):
    h, f = prepared_session(kernels)
    release(h, f)
    assert h.connection.kept == {} and h.connection.kept_ids == set()
    with pytest.raises(LookupError, match=f"no function with handle {f}"):
        call(h, f, FIRST, FIRST + 1)


def test_inline_tensors_and_kernels_with_scalars_are_not_kept(kernels):
    h, f = session(kernels)
    allocate(h, FIRST)
    inline = TensorValue("float32", (N,), CPU, np.full(N, 2, "float32").tobytes())
    for _ in range(2):                              # an inline tensor lives for its call only
        call(h, f, inline, FIRST)
        np.testing.assert_array_equal(values(h, FIRST), 3)
    assert h.connection.kept == {}
    axpy = h.handles.put(kernels.get_function("axpy"))
    allocate(h, FIRST + 1)
    for step in range(2):
        call(h, axpy, 2.0, FIRST, FIRST + 1, N)     # Y = alpha * X + Y
        np.testing.assert_array_equal(values(h, FIRST + 1), 6 * (step + 1))
    assert h.connection.kept == {}


def test_checked_mode_checks_the_pads_after_every_prepared_call(kernels):
    h, f = prepared_session(kernels, checked_tensors=True)
    pad = h.handles.tensor(handle(FIRST + 1))._buf._after
    for _ in range(2):
        pad[0] ^= 0xFF                              # what a kernel writing past B would do
        with pytest.raises(MemoryError, match="wrote outside tensor argument 1"):
            call(h, f, FIRST, FIRST + 1)
    assert prepared(h, f) is not None


def test_prepare_checks_as_a_call_does_and_refuses_to_run_on_a_freed_tensor(kernels):
    addone = kernels.get_function("addone")
    a, b = runtime.Tensor((N,), "float32"), runtime.Tensor((N,), "float32")
    a.copyfrom(np.arange(N, dtype="float32"))
    prepared = addone.prepare([a, b])
    assert prepared.run() is True
    np.testing.assert_array_equal(b.numpy(), np.arange(N) + 1)
    with pytest.raises(TypeError, match="takes 2 arguments, got 1"):
        addone.prepare([a])
    with pytest.raises(TypeError, match="expected dtype float32, got int32"):
        addone.prepare([a, runtime.Tensor((N,), "int32")])
    assert kernels.get_function("axpy").prepare([1.0, a, b, N]) is None
    raw = b._buf._raw
    b.free()
    assert prepared.run() is False and id(raw) not in reachable(prepared)
    with pytest.raises(ValueError, match="has been freed"):
        addone.prepare([a, b])


def test_a_prepared_kernel_that_fails_raises_each_time(tmp_path):
    import json

    from fixtures.build import compile_module, module_source

    function = {"name": "fails", "symbol": "__kernelrpc_fn_fails",
                "args": [{"name": "A", "kind": "tensor", "dtype": "int32", "shape": [1]}]}
    metadata = json.dumps({"format": "kernelrpc.module", "version": 1, "target": {}, "entry": None,
                           "functions": [function]})
    body = "EXPORT int32_t __kernelrpc_fn_fails(void **args) { return ++*(int32_t *)args[0]; }"
    fails = runtime.load_module(compile_module(module_source(metadata, body), tmp_path)).get_function("fails")
    prepared = fails.prepare([runtime.Tensor((1,), "int32")])
    for code in (1, 2):
        with pytest.raises(KernelError, match=f"code {code}"):
            prepared.run()


IDS = [FIRST + k for k in range(3)]
steps = st.lists(st.one_of(
    st.tuples(st.just("allocate"), st.sampled_from(IDS)),
    st.tuples(st.just("release"), st.sampled_from(IDS)),
    st.tuples(st.just("write"), st.sampled_from(IDS), st.integers(-5, 5)),
    st.tuples(st.just("call"), st.sampled_from(IDS), st.sampled_from(IDS), st.integers(1, 3)),
    st.tuples(st.just("get_function"), st.none()),
), max_size=30)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_any_sequence_of_allocations_frees_and_calls_computes_what_unprepared_calls_would(kernels, steps):
    """A model of the tensors' contents: every call computes B = A + 1 on the tensors the ids name
    now, or raises the unprepared call's error; every kept call is the live function's, and a
    prepared one names live tensors only."""
    h, f = session(kernels)
    model: dict = {}   # id -> its tensor's values
    for step in steps:
        action, handle_id = step[:2]
        if action == "allocate":
            if handle_id in model:
                continue                            # an id in use ends the session: not this test's
            allocate(h, handle_id)
            model[handle_id] = np.zeros(N, "float32")
        elif action == "release":
            release(h, handle_id)
            model.pop(handle_id, None)
        elif action == "get_function":              # the client drops the function and looks it up again
            release(h, f)
            f = h.handles.put(kernels.get_function("addone"))
        elif action == "write" and handle_id in model:
            values(h, handle_id)[:] = model[handle_id][:] = step[2]
        elif action == "call":
            source, target, times = step[1:]
            for _ in range(times):                  # a call repeated is prepared
                if source in model and target in model:
                    call(h, f, source, target)
                    model[target] = model[source] + 1
                else:
                    with pytest.raises(LookupError, match="freed already"):
                        call(h, f, source, target)
        for function_id, kept_call in h.connection.kept.items():
            args, kept = kept_call.args, kept_call.prepared
            assert function_id == f and f in h.connection.kept_ids
            if kept is not None:
                assert {arg.id for arg in args} <= h.connection.kept_ids and all(arg.id in model for arg in args)
                assert not any(tensor.freed for tensor in kept.tensors)
        for held, expected in model.items():
            np.testing.assert_array_equal(values(h, held), expected)
