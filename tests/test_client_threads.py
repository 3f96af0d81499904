"""Thread control of a device's kernels from the client, over a real server process:
``remote_module.set_num_threads(n)`` and TVM's ``runtime.config_threadpool``. What the pool
really did is read back from the thread probe (tests/fixtures/thread_probe.py): how many
tasks ran and on how many distinct threads."""
import os

import numpy as np
import pytest
from fixtures.thread_probe import SLOTS, observed

from kernelrpc import nd, rpc
from kernelrpc.errors import RemoteError
from kernelrpc.runtime.threads import MAX_NUM_THREADS, default_num_threads

POOL_CAP = SLOTS  # the generated pool's largest size


def load_probe(session, path, name="probe.so"):
    session.upload(path, name)
    return session.load_module(name)


def run_probe(module) -> tuple[int, int]:
    """(tasks, distinct threads) of one parallel launch of the probe on the device."""
    dev = module._session.cpu(0)
    ntasks, threads = nd.empty((SLOTS,), "int32", dev), nd.empty((SLOTS,), "int64", dev)
    module["record_tasks"](ntasks, threads)
    return observed(ntasks.numpy(), threads.numpy())


def other_than_default() -> int:
    """A thread count that differs from the pool's default size on this machine."""
    return 3 if min(default_num_threads(), POOL_CAP) != 3 else 2


def test_set_num_threads_sizes_the_pool_on_the_device(session, thread_probe_module):
    module = load_probe(session, thread_probe_module)
    for n in (1, 2, 3, 1):
        assert module.set_num_threads(n) == n
        assert run_probe(module) == (n, n)
    assert module.set_num_threads(0) == min(len(os.sched_getaffinity(0)), POOL_CAP)
    assert module.set_num_threads(MAX_NUM_THREADS) == POOL_CAP  # the pool caps, and says so
    assert run_probe(module) == (POOL_CAP, POOL_CAP)


def test_time_evaluator_runs_at_the_size_set(session, thread_probe_module):
    module = load_probe(session, thread_probe_module)
    dev = session.cpu(0)
    for n in (1, 3):
        module.set_num_threads(n)
        ntasks, threads = nd.empty((SLOTS,), "int32", dev), nd.empty((SLOTS,), "int64", dev)
        result = module.time_evaluator("record_tasks", dev, number=20, repeat=2)(ntasks, threads)
        assert len(result.results) == 2
        assert observed(ntasks.numpy(), threads.numpy()) == (n, n)


def test_bad_thread_counts_are_refused_before_sending(session, thread_probe_module):
    module = load_probe(session, thread_probe_module)
    module.set_num_threads(2)
    for bad in (-1, MAX_NUM_THREADS + 1, 1 << 40):
        with pytest.raises(ValueError, match="out of range"):
            module.set_num_threads(bad)
    for bad in (2.0, "2", True, None):
        with pytest.raises(TypeError, match="integer"):
            module.set_num_threads(bad)
    assert run_probe(module) == (2, 2)  # unchanged


def test_the_server_validates_what_arrives(session, thread_probe_module):
    """A peer that skips the client's checks gets a RemoteError with the remote traceback,
    and the session goes on."""
    module = load_probe(session, thread_probe_module)
    module.set_num_threads(2)
    raw = session.get_function("runtime.module_set_num_threads")
    for bad, kind in ((-1, "ValueError"), (MAX_NUM_THREADS + 1, "ValueError"), (2.5, "TypeError"),
                      ("2", "TypeError"), (True, "TypeError"), ([2], "TypeError")):
        with pytest.raises(RemoteError) as info:
            raw(module, bad)
        assert info.value.type_name == kind
        assert "Traceback" in info.value.traceback_text
    tensor = nd.empty((4,), "int32", session.cpu(0))
    for not_a_module, words in ((tensor, "tensor handle"), (raw, "function handle"), (7, "int"),
                                (session.cpu(0), "Device")):
        with pytest.raises(RemoteError, match=f"must be a module handle, got .*{words}") as info:
            raw(not_a_module, 2)
        assert info.value.type_name == "TypeError"
    with pytest.raises(RemoteError, match="missing 1 required positional argument: 'nthreads'"):
        raw(module)
    assert run_probe(module) == (2, 2)
    assert raw(module, 1) == 1
    assert run_probe(module) == (1, 1)


def test_config_threadpool_applies_to_modules_loaded_before_and_after(session, thread_probe_module):
    config = session.get_function("runtime.config_threadpool")
    n = other_than_default()
    before = load_probe(session, thread_probe_module, "before.so")
    assert config(0, n) is None   # as TVM's, it returns nothing
    after = load_probe(session, thread_probe_module, "after.so")
    assert run_probe(before) == (n, n)
    assert run_probe(after) == (n, n)
    # Separate libraries with separate pools: a per-module setting still overrides.
    assert after.set_num_threads(1) == 1
    assert run_probe(after) == (1, 1) and run_probe(before) == (n, n)
    config(0, 1)
    assert run_probe(before) == (1, 1) and run_probe(after) == (1, 1)
    assert run_probe(load_probe(session, thread_probe_module, "later.so")) == (1, 1)


def test_config_threadpool_zero_restores_the_default(session, thread_probe_module):
    config = session.get_function("runtime.config_threadpool")
    module = load_probe(session, thread_probe_module)
    default = min(default_num_threads(), POOL_CAP)
    assert run_probe(module) == (default, default)
    config(0, other_than_default())
    config(0, 0)
    assert run_probe(module) == (default, default)
    assert run_probe(load_probe(session, thread_probe_module, "fresh.so")) == (default, default)


def test_config_threadpool_default_follows_the_servers_environment(start_service,
                                                                    thread_probe_module):
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "dev"],
                           env={"KERNELRPC_NUM_THREADS": "3"})
    with rpc.connect(server.host, server.port, key="dev") as session:
        module = load_probe(session, thread_probe_module)
        assert run_probe(module) == (3, 3)
        module.set_num_threads(1)
        session.get_function("runtime.config_threadpool")(0, 0)
        assert run_probe(module) == (3, 3)


def test_config_threadpool_is_per_session(server, thread_probe_module):
    n = other_than_default()
    with rpc.connect(server.host, server.port, key="dev") as first:
        first.get_function("runtime.config_threadpool")(0, n)
        assert run_probe(load_probe(first, thread_probe_module)) == (n, n)
    default = min(default_num_threads(), POOL_CAP)
    with rpc.connect(server.host, server.port, key="dev") as second:
        assert run_probe(load_probe(second, thread_probe_module)) == (default, default)


def test_config_threadpool_validates_its_arguments(session, thread_probe_module):
    config = session.get_function("runtime.config_threadpool")
    module = load_probe(session, thread_probe_module)
    config(0, 2)
    cases = [((2, 1), "ValueError", "affinity_mode must be 1 .*, 0 .* or -1"),
             ((-2, 1), "ValueError", "explicit CPU list"),
             ((0, -1), "ValueError", "out of range"),
             ((0, MAX_NUM_THREADS + 1), "ValueError", "out of range"),
             ((0.0, 1), "TypeError", "affinity_mode must be an integer"),
             ((0, "4"), "TypeError", "must be an integer"),
             ((0, 1, ["0", "1"]), "ValueError", "CPU list"),
             ((0,), "TypeError", "nthreads")]
    for args, kind, message in cases:
        with pytest.raises(RemoteError, match=message) as info:
            config(*args)
        assert info.value.type_name == kind, args
    assert run_probe(module) == (2, 2)  # nothing changed
    for mode in (1, -1):  # accepted (threads are not pinned; see docs/protocol.md)
        config(mode, 1)
        assert run_probe(module) == (1, 1)


def test_results_stay_correct_at_every_thread_count(session, fixture_module):
    """A module without a pool (the C fixture) reports 1 and still computes."""
    session.upload(fixture_module, "kernels.so")
    module = session.load_module("kernels.so")
    assert module.set_num_threads(4) == 1
    session.get_function("runtime.config_threadpool")(0, 3)
    a = nd.array(np.arange(1024, dtype="float32"), session.cpu(0))
    b = nd.empty((1024,), "float32", session.cpu(0))
    module["addone"](a, b)
    np.testing.assert_array_equal(b.numpy(), np.arange(1024, dtype="float32") + 1)


@pytest.fixture(scope="module")
def parallel_scale(tmp_path_factory):
    """A compiled kernel whose outer loop is parallel: B = A * 2 + 1."""
    from kernelrpc import build, te

    n = 1 << 14
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * 2.0 + 1.0, name="B")
    s = te.create_schedule(B.op)
    outer, inner = s[B].split(B.op.axis[0], factor=64)
    s[B].parallel(outer)
    s[B].vectorize(inner)
    module = build(s, [A, B], target="llvm", name="scale")
    return module, module.export_library(tmp_path_factory.mktemp("parallel") / "scale.so")


def test_a_parallel_kernel_computes_correctly_at_every_size(session, parallel_scale):
    built, path = parallel_scale
    assert "call i32 @__kernelrpc_parallel_launch" in built.get_source()  # runs on the pool
    module = load_probe(session, path, "scale.so")
    dev = session.cpu(0)
    a = np.random.default_rng(1).standard_normal(1 << 14).astype("float32")
    ta = nd.array(a, dev)
    for n in (1, 2, 3):
        assert module.set_num_threads(n) == n
        tb = nd.empty((1 << 14,), "float32", dev)
        result = module.time_evaluator("scale", dev, number=10, repeat=2)(ta, tb)
        assert len(result.results) == 2
        np.testing.assert_allclose(tb.numpy(), a * 2 + 1, rtol=1e-6)
    assert built.set_num_threads(2) == 2  # the same knob on the locally built module
