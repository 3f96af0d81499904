"""The client's kept CALL frame (remote.Function): a kernel call with the same live remote tensors
again sends the frame of the call before, and every other call takes the general path, with the
errors it raised before. Against a real server and the fixture module's kernels."""
import gc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernelrpc
from kernelrpc import nd, rpc
from kernelrpc.rpc.remote import Tensor as RemoteTensor

N = 1024  # the fixture's addone and vadd take float32[1024]


@pytest.fixture
def kernels(session, fixture_module):
    session.upload(fixture_module, "kernels.so")
    return session.load_module("kernels.so")


def values(seed: float) -> np.ndarray:
    return np.arange(N, dtype="float32") * seed


def kept_frame(function):
    return None if function._kept is None else function._kept[0]


def test_the_same_tensors_again_compute_on_their_current_contents(session, kernels):
    addone, dev = kernels["addone"], session.cpu(0)
    a, b = nd.empty((N,), "float32", dev), nd.empty((N,), "float32", dev)
    addone(a, b)
    frame = kept_frame(addone)
    assert frame is not None
    for step in range(1, 6):
        a.copyfrom(values(step))
        addone(a, b)
        assert kept_frame(addone) is frame   # sent again, not encoded again
        np.testing.assert_array_equal(b.numpy(), values(step) + 1)
    addone(b, b)                             # in place: the same tensor twice
    np.testing.assert_array_equal(b.numpy(), values(5) + 2)


def test_calls_taking_turns_between_tensor_sets(session, kernels):
    addone, vadd, dev = kernels["addone"], kernels["vadd"], session.cpu(0)
    a, b, c = (nd.array(values(k), dev) for k in (1, 2, 3))
    for _ in range(3):
        addone(a, b)
        np.testing.assert_array_equal(b.numpy(), a.numpy() + 1)
        addone(b, c)
        np.testing.assert_array_equal(c.numpy(), b.numpy() + 1)
        vadd(a, b, c)
        np.testing.assert_array_equal(c.numpy(), a.numpy() + b.numpy())
        vadd(c, b, a)
        np.testing.assert_array_equal(a.numpy(), c.numpy() + b.numpy())
    for out in (b, c, b, c):                 # the first tensor the kept call's, the second not
        addone(a, out)
        np.testing.assert_array_equal(out.numpy(), a.numpy() + 1)
    expect = a.numpy()
    vadd(a, a, b)
    np.testing.assert_array_equal(b.numpy(), expect * 2)


def test_fewer_or_other_arguments_than_the_kept_call_take_the_general_path(session, kernels):
    vadd, dev = kernels["vadd"], session.cpu(0)
    a, b, c = (nd.array(values(k), dev) for k in (1, 2, 3))
    for wrong in ((a, b), (a, b, c, c), (a, b, 1.5), (a, b, "c")):
        vadd(a, b, c)                        # kept again
        assert kept_frame(vadd) is not None
        with pytest.raises(kernelrpc.RemoteError, match="argument|tensor") as info:
            vadd(*wrong)
        assert info.value.traceback_text
        vadd(a, b, c)
        vadd(a, b, values(9))                # an ndarray travels inline (nothing comes back)
    np.testing.assert_array_equal(c.numpy(), values(3))


def test_a_freed_tensor_is_refused_as_before(session, kernels):
    addone, dev = kernels["addone"], session.cpu(0)
    a, b = nd.empty((N,), "float32", dev), nd.empty((N,), "float32", dev)
    addone(a, b)
    addone(a, b)
    b.free()
    for _ in range(2):
        with pytest.raises(ValueError, match="belongs to another session"):
            addone(a, b)
    c = nd.empty((N,), "float32", dev)
    a.copyfrom(values(4))
    addone(a, c)
    np.testing.assert_array_equal(c.numpy(), values(4) + 1)


def test_a_tensor_freed_behind_the_objects_back_is_a_remote_error_every_time(session, kernels):
    """The frame is what the general path would send: the server refuses the freed handle."""
    addone, dev = kernels["addone"], session.cpu(0)
    a, b = nd.empty((N,), "float32", dev), nd.empty((N,), "float32", dev)
    addone(a, b)
    addone(a, b)
    session.channel.free(b._handle)
    for _ in range(2):
        with pytest.raises(kernelrpc.RemoteError, match="freed already") as info:
            addone(a, b)
        assert info.value.traceback_text
        assert addone._kept is None          # a failed call drops the frame
    assert session.get_function("testing.echo")("in step") == "in step"


def test_a_new_tensor_under_a_freed_tensors_handle_id(session, kernels):
    """A handle of the same id (and bytes) made anew is another object: encoded again, and
    the server's verdict on that id is what the call returns."""
    addone, dev = kernels["addone"], session.cpu(0)
    a, b = nd.array(values(1), dev), nd.empty((N,), "float32", dev)
    stale = RemoteTensor(session, b._handle, dev)   # the same handle object, a second Tensor
    addone(a, stale)
    addone(a, stale)
    np.testing.assert_array_equal(b.numpy(), values(1) + 1)
    handle = b._handle
    b.free()
    with pytest.raises(kernelrpc.RemoteError, match="freed already"):
        addone(a, stale)                     # its handle names a freed tensor: the server says so
    again = RemoteTensor(session, type(handle)(handle.id, handle.dtype, handle.shape, handle.device), dev)
    with pytest.raises(kernelrpc.RemoteError, match="freed already"):
        addone(a, again)
    c = nd.empty((N,), "float32", dev)
    addone(a, c)
    np.testing.assert_array_equal(c.numpy(), values(1) + 1)


def test_a_tensor_of_another_session_is_refused_even_with_the_same_handle(start_service, session, kernels):
    addone, dev = kernels["addone"], session.cpu(0)
    a, b = nd.array(values(1), dev), nd.empty((N,), "float32", dev)
    addone(a, b)
    addone(a, b)
    second = start_service("kernelrpc.server", ["--port", "0", "--key", "dev"])  # one session a server
    with rpc.connect(second.host, second.port, key="dev") as other:
        theirs = nd.empty((N,), "float32", other.cpu(0))
        twin = RemoteTensor(other, b._handle, other.cpu(0))   # another session's, holding our handle
        for tensor in (theirs, twin):
            with pytest.raises(ValueError, match="belongs to another session"):
                addone(a, tensor)
        twin._session = None                  # not the other session's tensor to free
    np.testing.assert_array_equal(b.numpy(), values(1) + 1)


def test_a_failing_kernel_call_raises_each_time_and_the_session_goes_on(session, kernels):
    addone, dev = kernels["addone"], session.cpu(0)
    a, b = nd.array(values(1), dev), nd.empty((N,), "float32", dev)
    small = nd.empty((10,), "float32", dev)
    addone(a, b)
    for _ in range(3):
        with pytest.raises(kernelrpc.RemoteError) as info:
            addone(a, small)
        assert str(N) in str(info.value) and info.value.traceback_text
        assert addone._kept is None
    addone(a, b)
    addone(a, b)
    np.testing.assert_array_equal(b.numpy(), values(1) + 1)


def test_a_call_on_a_closed_session_is_connection_lost(server, fixture_module):
    sess = rpc.connect(server.host, server.port, key="dev")
    sess.upload(fixture_module, "kernels.so")
    addone = sess.load_module("kernels.so")["addone"]
    a, b = nd.empty((N,), "float32", sess.cpu(0)), nd.empty((N,), "float32", sess.cpu(0))
    addone(a, b)
    addone(a, b)
    sess.close()
    for _ in range(2):
        with pytest.raises(kernelrpc.ConnectionLost, match="closed"):
            addone(a, b)


def test_the_kept_frame_holds_no_tensor(session, kernels):
    addone, dev = kernels["addone"], session.cpu(0)
    live = session.get_function("session.live_handles")
    a, b = nd.empty((N,), "float32", dev), nd.empty((N,), "float32", dev)
    addone(a, b)
    addone(a, b)
    before = live()
    del b
    gc.collect()
    assert live() == before - 1              # collected, and freed with this request
    c = nd.empty((N,), "float32", dev)
    a.copyfrom(values(2))
    addone(a, c)
    np.testing.assert_array_equal(c.numpy(), values(2) + 1)


def test_a_time_evaluator_keeps_its_frame_too(session, kernels):
    dev = session.cpu(0)
    a, b = nd.array(values(1), dev), nd.empty((N,), "float32", dev)
    timer = kernels.time_evaluator("addone", dev, number=2, repeat=2)
    for step in (2, 3):
        a.copyfrom(values(step))
        assert len(timer(a, b).results) == 2
        np.testing.assert_array_equal(b.numpy(), values(step) + 1)
    assert timer._kept is not None


_OPS = st.lists(st.one_of(
    st.tuples(st.just("alloc"), st.integers(0, 3), st.integers(-4, 4)),
    st.tuples(st.just("free"), st.integers(0, 3)),
    st.tuples(st.just("write"), st.integers(0, 3), st.integers(-4, 4)),
    st.tuples(st.just("addone"), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("vadd"), st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)),
), max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
def test_any_sequence_of_allocations_frees_writes_and_calls(session, kernels, ops):
    """Four slots of tensors and a local model of their contents: every call computes what the
    model says, and a call on a freed tensor is refused as before."""
    dev = session.cpu(0)
    functions = {"addone": kernels["addone"], "vadd": kernels["vadd"]}
    model = [values(seed) for seed in range(4)]
    tensors = [nd.array(array, dev) for array in model]
    freed: list = [None] * 4
    for op, *slots in ops:
        if op == "alloc":
            slot, seed = slots
            tensors[slot], model[slot] = nd.array(values(seed), dev), values(seed)
        elif op == "free":
            if tensors[slot := slots[0]] is not None:
                tensors[slot].free()
                freed[slot], tensors[slot] = tensors[slot], None
        elif op == "write":
            slot, seed = slots
            if tensors[slot] is not None:
                tensors[slot].copyfrom(values(seed))
                model[slot] = values(seed)
        else:
            args = [tensors[s] if tensors[s] is not None else freed[s] for s in slots]
            if any(arg is None for arg in args):
                continue
            if any(arg.freed for arg in args):
                with pytest.raises(ValueError, match="belongs to another session"):
                    functions[op](*args)
                continue
            functions[op](*args)
            out = slots[-1]
            model[out] = model[slots[0]] + 1 if op == "addone" else model[slots[0]] + model[slots[1]]
            np.testing.assert_array_equal(tensors[out].numpy(), model[out])
    for tensor in tensors:
        if tensor is not None:
            tensor.free()
