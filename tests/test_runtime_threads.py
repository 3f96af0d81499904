"""Thread counts in the local runtime: validation shared with the remote API, the default
size read from the environment, and config_threadpool over modules loaded before and after."""
import shutil

import numpy as np
import pytest
from fixtures.thread_probe import SLOTS, observed

from kernelrpc import nd, runtime
from kernelrpc.runtime import threads


def run_probe(module) -> tuple[int, int]:
    ntasks, tids = nd.array(np.zeros(SLOTS, "int32")), nd.array(np.zeros(SLOTS, "int64"))
    module["record_tasks"](ntasks, tids)
    return observed(ntasks.numpy(), tids.numpy())


@pytest.fixture
def load_copy(thread_probe_module, tmp_path):
    """Load a fresh copy of the probe: a library of its own, with a pool of its own."""
    count = iter(range(1000))

    def load():
        path = tmp_path / f"probe{next(count)}.so"
        shutil.copyfile(thread_probe_module, path)
        return runtime.load_module(path)
    return load


@pytest.mark.parametrize("good", [0, 1, 64, threads.MAX_NUM_THREADS, np.int32(3)])
def test_thread_counts_accepted(good):
    assert threads.check_num_threads(good) == int(good)


@pytest.mark.parametrize("bad, error", [(-1, ValueError), (threads.MAX_NUM_THREADS + 1, ValueError),
                                        (1 << 40, ValueError), (True, TypeError),
                                        (np.bool_(True), TypeError), (2.0, TypeError),
                                        ("2", TypeError), (None, TypeError)])
def test_thread_counts_refused(bad, error):
    with pytest.raises(error, match="set_num_threads"):
        threads.check_num_threads(bad)


def test_affinity_modes():
    assert [threads.check_affinity_mode(m) for m in (1, 0, -1)] == [1, 0, -1]
    for mode in (-2, -3):
        with pytest.raises(ValueError, match="explicit CPU list"):
            threads.check_affinity_mode(mode)
    with pytest.raises(ValueError, match="must be 1"):
        threads.check_affinity_mode(2)
    with pytest.raises(TypeError):
        threads.check_affinity_mode(False)


@pytest.mark.parametrize("env, expected", [
    ({"KERNELRPC_NUM_THREADS": "3"}, 3),
    ({"KERNELRPC_NUM_THREADS": " 4 threads"}, 4),      # atoi reads the leading number
    ({"TVM_NUM_THREADS": "5"}, 5),
    ({"KERNELRPC_NUM_THREADS": "6", "TVM_NUM_THREADS": "5"}, 6),
    ({"KERNELRPC_NUM_THREADS": "", "TVM_NUM_THREADS": "5"}, None),   # set, so it wins: all cores
    ({"KERNELRPC_NUM_THREADS": "-2"}, None),
    ({"TVM_NUM_THREADS": "many"}, None),
    ({}, None)])
def test_default_size_reads_the_environment_like_the_pool(monkeypatch, load_copy, env, expected):
    for var in ("KERNELRPC_NUM_THREADS", "TVM_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    expected = expected or threads.usable_cores()
    assert threads.default_num_threads() == expected
    size = min(expected, SLOTS)
    assert run_probe(load_copy()) == (size, size)   # the native pool agrees


def test_local_set_num_threads_checks_like_the_remote_one(load_copy):
    module = load_copy()
    assert module.set_num_threads(3) == 3 and run_probe(module) == (3, 3)
    with pytest.raises(ValueError, match="out of range"):
        module.set_num_threads(-1)
    with pytest.raises(TypeError):
        module.set_num_threads(True)
    assert run_probe(module) == (3, 3)


def test_a_config_covers_tracked_modules_and_later_ones(load_copy):
    config = threads.ThreadPoolConfig()
    before = load_copy()
    config.track(before)
    config.configure(0, 3)
    after = load_copy()
    config.track(after)
    assert run_probe(before) == (3, 3) and run_probe(after) == (3, 3)
    config.configure(-1, 1)
    assert (config.affinity_mode, config.nthreads) == (-1, 1)
    assert run_probe(before) == (1, 1) and run_probe(after) == (1, 1)
    config.configure(0, 0)
    assert config.nthreads is None
    default = min(threads.default_num_threads(), SLOTS)
    assert run_probe(before) == (default, default)
    with pytest.raises(ValueError):
        config.configure(0, -1)
    assert config.nthreads is None


def test_process_wide_config_threadpool(load_copy):
    before = load_copy()
    try:
        runtime.config_threadpool(0, 3)
        assert run_probe(before) == (3, 3)
        assert run_probe(load_copy()) == (3, 3)
    finally:
        runtime.config_threadpool(0, 0)
    default = min(threads.default_num_threads(), SLOTS)
    assert run_probe(before) == (default, default)
    assert run_probe(load_copy()) == (default, default)
