"""The session handler's table under client-chosen ids (ALLOCATE), driven without a network: any
sequence of allocations and frees keeps the counts the hello announced limits for, a failed
allocation is raised by every use of its id until freed, and a bad id is a ProtocolError (which
ends the session: the client hears nothing of an ALLOCATE and cannot go on in step)."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelrpc import runtime
from kernelrpc.errors import ProtocolError
from kernelrpc.wire import protocol as P
from kernelrpc.wire import requests as R
from kernelrpc.wire.values import DeviceValue, TensorHandle
from kernelrpc.server.config import ServerConfig
from kernelrpc.server.handler import AllocationFailed, SessionHandler

CPU = DeviceValue("cpu", 0)
FIRST = R.CLIENT_IDS_FIRST
LIMIT = 64           # the session's tensor bytes
MAX_TENSORS = 4      # tensors under client ids


def handler() -> SessionHandler:
    return SessionHandler(None, None, ServerConfig(max_session_bytes=LIMIT, max_client_tensors=MAX_TENSORS))


def allocate(h: SessionHandler, handle_id: int, elements: int, dtype="float32"):
    """ALLOCATE as the server's loop runs it: decoded from its bytes, then handled."""
    body = P.encode_request(P.ALLOCATE, [TensorHandle(handle_id, dtype, (elements,), CPU)])[P.HEADER_SIZE:]
    return h._handlers[P.ALLOCATE](P.decode_request(body))


def release(h: SessionHandler, *ids: int) -> None:
    body = P.encode_request(P.RELEASE, list(ids))[P.HEADER_SIZE:]
    assert h._handlers[P.RELEASE](P.decode_request(body)) is None


def use(h: SessionHandler, handle_id: int, elements: int):
    return h.handles.tensor(TensorHandle(handle_id, "float32", (elements,), CPU))


def test_an_allocation_under_a_client_id_is_a_zeroed_tensor_counted_like_arrays_and_freed_by_release():
    h = handler()
    assert allocate(h, FIRST, 4) is None            # no reply
    tensor = use(h, FIRST, 4)
    assert type(tensor) is runtime.Tensor and bytes(tensor.buffer) == bytes(16)
    assert h.account.tensor_bytes == 16 and h.account.client_tensors == 1
    release(h, FIRST)
    assert h.account.tensor_bytes == 0 and h.account.client_tensors == 0 and tensor.freed
    with pytest.raises(LookupError, match="no tensor with handle"):
        use(h, FIRST, 4)


def test_a_failed_allocation_is_raised_by_each_use_until_freed():
    h = handler()
    allocate(h, FIRST, 8)                           # 32 bytes
    allocate(h, FIRST + 1, 12)                      # 48 more: beyond the 64 the session may hold
    for _ in range(2):
        with pytest.raises(AllocationFailed, match=rf"tensor {FIRST + 1} \(float32\[12\]\).*--max-session-bytes") as info:
            use(h, FIRST + 1, 12)
        assert isinstance(info.value.__cause__, MemoryError)   # the allocation's own error, with its traceback
    assert h.account.tensor_bytes == 32 and h.account.client_tensors == 2
    release(h, FIRST + 1)
    assert h.account.client_tensors == 1
    with pytest.raises(LookupError, match="no tensor with handle"):
        use(h, FIRST + 1, 12)


@pytest.mark.parametrize("handle_id, message", [
    (1, "outside the ids a client may choose"), (FIRST - 1, "outside the ids a client may choose"),
    (2**64 - 1, "outside the ids a client may choose"),
])
def test_an_id_outside_the_client_range_is_refused(handle_id, message):
    h = handler()
    with pytest.raises(ProtocolError, match=message):
        allocate(h, handle_id, 1)
    assert h._objects == {} and h.account.client_tensors == 0


def test_an_id_in_use_and_one_past_the_count_are_refused_and_leave_the_table_alone():
    h = handler()
    allocate(h, FIRST, 1)
    kept = use(h, FIRST, 1)
    with pytest.raises(ProtocolError, match=f"id {FIRST} is in use"):
        allocate(h, FIRST, 2)
    assert use(h, FIRST, 1) is kept
    server_id = h.handles.put(object())             # an id the server assigned is in use too
    with pytest.raises(ProtocolError, match="outside the ids"):
        allocate(h, server_id, 1)
    for k in range(1, MAX_TENSORS):
        allocate(h, FIRST + k, 0)
    with pytest.raises(ProtocolError, match="max_client_tensors"):
        allocate(h, FIRST + MAX_TENSORS, 0)
    release(h, FIRST + 1)
    allocate(h, FIRST + MAX_TENSORS, 0)             # room again
    assert h.account.client_tensors == MAX_TENSORS


actions = st.lists(st.tuples(st.sampled_from(["allocate", "release"]),
                             st.sampled_from([FIRST + k for k in range(6)] + [0, 5, FIRST - 1]),
                             st.integers(0, 10)), max_size=40)


@settings(max_examples=200)
@given(actions)
def test_any_sequence_of_allocations_and_frees_keeps_the_counts(steps):
    """A model of what the table must hold: per client id, the bytes of its tensor or a failure."""
    h = handler()
    model: dict = {}   # id -> bytes (None: its allocation failed)
    for action, handle_id, elements in steps:
        if action == "release":
            release(h, handle_id)
            model.pop(handle_id, None)
        elif not FIRST <= handle_id or handle_id in model or len(model) >= MAX_TENSORS:
            with pytest.raises(ProtocolError):
                allocate(h, handle_id, elements)
        else:
            allocate(h, handle_id, elements)
            held = sum(n for n in model.values() if n is not None)
            model[handle_id] = 4 * elements if held + 4 * elements <= LIMIT else None
        assert h.account.client_tensors == len(model)
        assert h.account.tensor_bytes == sum(n for n in model.values() if n is not None) <= LIMIT
    for handle_id, nbytes in model.items():
        elements = (nbytes or 0) // 4
        if nbytes is None:
            with pytest.raises(AllocationFailed):
                h.handles.lookup(handle_id, runtime.Tensor, "tensor")
        else:
            assert use(h, handle_id, elements).nbytes == nbytes


def test_the_server_never_assigns_an_id_of_the_client_range():
    h = handler()
    h.handles._next_id = FIRST - 1
    assert h.handles.put(object()) == FIRST - 1
    with pytest.raises(MemoryError, match="used all"):
        h.handles.put(object())
