import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernelrpc
from fixtures.build import SOURCE, compile_module
from kernelrpc import nd, te
from kernelrpc.errors import KernelError
from kernelrpc.runtime import Device, ProfileResult, cpu, load_module
from kernelrpc.runtime.timing import TimerState, TimingConfig, measure, measure_at_once, repeats_apart


class FakeKernel:
    """A kernel whose every call takes ``cost_ns`` on a fake clock; counts calls and sleeps."""

    def __init__(self, cost_ns: int):
        self.cost_ns = cost_ns
        self.calls = 0
        self.preprocs = 0
        self.sleeps: list[float] = []
        self.events: list[str] = []

    def warmup(self):
        self.calls += 1
        self.events.append("warmup")

    def run_batch(self, number):
        self.calls += number
        self.events.append(f"batch{number}")
        return number * self.cost_ns

    def preproc(self):
        self.preprocs += 1
        self.events.append("preproc")

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.events.append("sleep")

    def measure(self, state, **config):
        return measure(state, TimingConfig(**config), warmup=self.warmup,
                       run_batch=self.run_batch, preproc=self.preproc, sleep=self.sleep)


def test_number_2_repeat_3_makes_7_calls():
    kernel = FakeKernel(1000)
    results = kernel.measure(TimerState(2), repeat=3)
    assert kernel.calls == 7
    assert results == [1e-6] * 3
    assert kernel.events == ["warmup", "preproc", "batch2", "preproc", "batch2", "preproc", "batch2"]


def test_min_repeat_ms_grows_number_and_it_persists_across_calls():
    # TVM 0.27, 2.08 ms kernel, number=1, repeat=3, min_repeat_ms=20: 32 calls, then 31.
    kernel = FakeKernel(2_080_000)
    state = TimerState(1)
    kernel.measure(state, repeat=3, min_repeat_ms=20)
    assert kernel.calls == 32 and state.number == 10
    kernel.calls = 0
    results = kernel.measure(state, repeat=3, min_repeat_ms=20)
    assert kernel.calls == 31
    assert results == pytest.approx([2.08e-3] * 3)


def test_number_grows_to_the_larger_of_the_estimate_and_the_golden_ratio_step():
    kernel = FakeKernel(1_000_000)      # 1 ms per call
    state = TimerState(1)
    kernel.measure(state, repeat=1, min_repeat_ms=2)
    assert state.number == 3            # int(max(2 / 1 + 1, 1 * 1.618))
    state = TimerState(5)
    kernel.measure(state, repeat=1, min_repeat_ms=6)
    assert state.number == 8            # int(max(6 / 1 + 1, 5 * 1.618)) = int(8.09)


def test_zero_time_guard_stops_after_the_limit():
    kernel = FakeKernel(0)
    state = TimerState(3)
    results = kernel.measure(state, repeat=2, min_repeat_ms=10, limit_zero_time_iterations=100)
    assert results == [0.0, 0.0]
    assert state.number == 3                        # never grows on zero durations
    assert kernel.calls == 1 + 2 * 100 * 3


def test_cooldown_after_repeats_divisible_by_repeats_to_cooldown():
    kernel = FakeKernel(1000)
    kernel.measure(TimerState(1), repeat=4, cooldown_interval_ms=100, repeats_to_cooldown=2)
    assert kernel.sleeps == [0.1, 0.1]
    assert kernel.events.index("sleep") == kernel.events.index("batch1") + 1   # after repeat 0
    kernel = FakeKernel(1000)
    kernel.measure(TimerState(1), repeat=3, cooldown_interval_ms=5)
    assert kernel.sleeps == [0.005] * 3


@settings(max_examples=200, deadline=None)
@given(number=st.integers(1, 1000), repeat=st.integers(1, 30), cost_ns=st.integers(0, 10**7),
       repeats_to_cooldown=st.integers(1, 5), limit=st.integers(0, 200))
def test_measure_at_once_gives_what_measure_gives(number, repeat, cost_ns, repeats_to_cooldown, limit):
    """Where each repeat is one batch, the repeats timed at once are the same calls, batches,
    results and ``number`` as ``measure``'s batch by batch."""
    config = TimingConfig(repeat=repeat, repeats_to_cooldown=repeats_to_cooldown,
                          limit_zero_time_iterations=limit)
    assert repeats_apart(config) is None
    by_batch, at_once = FakeKernel(cost_ns), FakeKernel(cost_ns)
    state_by_batch, state_at_once = TimerState(number), TimerState(number)
    expected = measure(state_by_batch, config, warmup=by_batch.warmup, run_batch=by_batch.run_batch,
                       sleep=by_batch.sleep, resume=lambda: by_batch.events.append("resume"))

    def run_repeats(n):
        return [at_once.run_batch(n) for _ in range(repeat)]

    got = measure_at_once(state_at_once, config, warmup=at_once.warmup, run_repeats=run_repeats,
                          resume=lambda: at_once.events.append("resume"))
    assert got == expected
    assert at_once.events == by_batch.events and at_once.sleeps == by_batch.sleeps == []
    assert state_at_once.number == state_by_batch.number == number


@pytest.mark.parametrize("config, reason", [
    (TimingConfig(repeat=3, min_repeat_ms=0.5), "min_repeat_ms"),
    (TimingConfig(repeat=3, cooldown_interval_ms=1), "cooldown_interval_ms"),
])
def test_measure_at_once_refuses_repeats_that_are_not_one_batch_each(config, reason):
    assert reason in repeats_apart(config)
    kernel = FakeKernel(1000)
    with pytest.raises(ValueError, match=reason):
        measure_at_once(TimerState(1), config, warmup=kernel.warmup, run_repeats=kernel.run_batch)
    assert kernel.calls == 0


def counting_module(limit: int):
    """A compiled module (the runtime kernelrpc emits) whose ``count(A, C)`` adds ``A[C[0]]`` to
    ``C[0]``: with A all ones it counts its calls in C, and its bound check fails the call
    that finds ``C[0] == limit`` (error code 3)."""
    A = te.placeholder((limit,), name="A", dtype="int32")

    def body(ins, outs):
        ib = te.ir_builder.create()
        a, c = ib.buffer_ptr(ins[0]), ib.buffer_ptr(outs[0])
        c[0] = c[0] + a[c[0]]
        return ib.get()

    C = te.extern((1,), [A], body, name="count", dtype="int32")
    with te.PassContext(config={"tir.instrument_bound_checkers": True}):
        return kernelrpc.build(te.create_schedule(C.op), [A, C], name="count").runtime_module


@pytest.fixture(scope="module")
def counting():
    return counting_module(1000)


def count_tensors(limit: int):
    return nd.array(np.ones(limit, "int32")), nd.array(np.zeros(1, "int32"))


def test_a_compiled_module_times_all_repeats_in_one_native_call(counting):
    assert counting.has_repeats_timer
    a, c = count_tensors(1000)
    evaluator = counting.time_evaluator("count", cpu(0), number=5, repeat=4)
    assert evaluator.per_batch_reason is None
    result = evaluator(a, c)
    assert c.numpy()[0] == 1 + 5 * 4             # the warm-up call, then 4 batches of 5
    assert result.number == 5 and result.repeat == 4 and all(r >= 0 for r in result.results)
    assert result.conditions["wall_s"] > 0 and result.conditions["threads"]
    evaluator(a, c)
    assert c.numpy()[0] == 2 * 21


def test_repeats_past_the_budget_return_to_python_between_batches(monkeypatch):
    """Batches that take longer than the budget come back batch by batch (where Python takes a
    KeyboardInterrupt), and the next native calls run the rest: the same calls and results."""
    from kernelrpc.runtime import module as runtime_module

    monkeypatch.setattr(runtime_module, "REPEATS_BUDGET_NS", 1)
    module = counting_module(1000)
    native = module._time_repeats
    returned = []

    def counting_native(*args):
        returned.append(native(*args))
        return returned[-1]

    module._time_repeats = counting_native
    a, c = count_tensors(1000)
    result = module.time_evaluator("count", cpu(0), number=3, repeat=5)(a, c)
    assert returned == [1] * 5                   # every batch took at least the 1 ns budget
    assert c.numpy()[0] == 1 + 3 * 5 and result.repeat == 5
    assert all(r > 0 for r in result.results)


def test_a_kernel_error_stops_the_native_repeats_at_the_failing_call():
    module = counting_module(10)
    a, c = count_tensors(10)
    evaluator = module.time_evaluator("count", cpu(0), number=2, repeat=8)
    assert evaluator.per_batch_reason is None
    with pytest.raises(KernelError, match="'count' failed with error code 3"):
        evaluator(a, c)
    assert c.numpy()[0] == 10                    # the 11th call found C[0] out of A's bounds


@pytest.mark.parametrize("kwargs, reason", [
    ({"min_repeat_ms": 0.01}, "min_repeat_ms"),
    ({"cooldown_interval_ms": 0.01}, "cooldown_interval_ms"),
    ({"f_preproc": "cache_flush_cpu_non_first_arg"}, "f_preproc"),
    ({"cache_flush_bytes": 4096}, "cache_flush_bytes"),
])
def test_repeats_that_are_not_one_batch_each_get_a_native_call_per_batch(counting, caplog, kwargs,
                                                                         reason):
    a, c = count_tensors(1000)
    with caplog.at_level(logging.DEBUG, logger="kernelrpc.runtime.evaluator"):
        evaluator = counting.time_evaluator("count", cpu(0), number=2, repeat=3, **kwargs)
    assert reason in evaluator.per_batch_reason
    assert any(reason in r.getMessage() for r in caplog.records)
    if "min_repeat_ms" not in kwargs:          # (it grows number past what C can count here)
        assert evaluator(a, c).repeat == 3
        assert c.numpy()[0] == 1 + 2 * 3


def test_a_module_without_the_repeats_entry_point_falls_back_visibly(mod, caplog):
    """A module built by an older kernelrpc (the fixture module, written by hand, has only
    ``__kernelrpc_time``): a call per batch, said at debug, counted the same."""
    assert not mod.has_repeats_timer and mod.repeats_timer(mod["counted"], 3) is None
    with caplog.at_level(logging.DEBUG, logger="kernelrpc.runtime.evaluator"):
        evaluator = mod.time_evaluator("counted", cpu(0), number=2, repeat=3)
    assert "has no __kernelrpc_time_repeats" in evaluator.per_batch_reason
    assert any("has no __kernelrpc_time_repeats" in r.getMessage() for r in caplog.records)
    mod["counter_reset"]()
    assert evaluator(nd.empty((16,)), nd.empty((16,))).repeat == 3
    assert counters(mod) == [7, 0]


@pytest.fixture(scope="module")
def mod(fixture_module):
    return load_module(fixture_module)


def counters(mod):
    out = nd.empty((2,), "int64")
    mod["counter_read"](out)
    return out.numpy().tolist()


def test_native_call_counts_match_tvm(mod):
    a, b = nd.empty((16,)), nd.empty((16,))
    mod["counter_reset"]()
    evaluator = mod.time_evaluator("counted", cpu(0), number=2, repeat=3)
    result = evaluator(a, b)
    assert counters(mod) == [7, 0]
    assert result.number == 2 and result.repeat == 3 and len(result.results) == 3
    assert all(r > 0 for r in result.results)
    evaluator(a, b)
    assert counters(mod) == [14, 0]


def test_the_batch_timer_runs_each_batch_with_the_number_it_is_given(mod):
    """It converts ``number`` for ctypes once per value: a number that changes, and comes back,
    must still run exactly that many calls."""
    a, b = nd.empty((16,)), nd.empty((16,))
    counted = mod["counted"]
    time_batch = mod.batch_timer(counted, counted.pack((a, b)))
    mod["counter_reset"]()
    for number in (3, 5, 5, 3, 1):
        assert time_batch(number) > 0
    assert counters(mod) == [17, 0]


def test_cache_flush_non_first_arg_flushes_each_repeat(mod):
    a, b = nd.empty((16,)), nd.empty((16,))
    mod["counter_reset"]()
    evaluator = mod.time_evaluator("counted", cpu(0), number=1, repeat=4,
                                   f_preproc="cache_flush_cpu_non_first_arg")
    evaluator(a, b)
    assert counters(mod) == [5, 4]            # one flush per repeat: only B is a non-first tensor


def test_min_repeat_ms_on_the_native_loop(mod):
    evaluator = mod.time_evaluator("sleep_ms", cpu(0), number=1, repeat=2, min_repeat_ms=9)
    result = evaluator(2)
    assert evaluator.number > 1 and result.number == evaluator.number
    assert all(r >= 2e-3 for r in result.results)
    assert all(r * result.number >= 9e-3 for r in result.results)
    grown = evaluator.number
    evaluator(2)
    assert evaluator.number >= grown


def test_result_reflects_the_kernel_time(mod):
    result = mod.time_evaluator("sleep_ms", cpu(0), number=2, repeat=2)(3)
    assert all(3e-3 <= r < 1.0 for r in result.results)
    assert result.target == mod.target and result.function == "sleep_ms"


def test_cache_flush_bytes(mod):
    x = nd.array(np.arange(64 * 64, dtype="float32").reshape(64, 64))
    out = nd.empty((64, 64))
    result = mod.time_evaluator("matmul", cpu(0), number=1, repeat=2,
                                cache_flush_bytes=1 << 20)(x, x, out)
    assert all(r > 0 for r in result.results)
    np.testing.assert_allclose(out.numpy(), x.numpy() @ x.numpy(), rtol=1e-5)


def test_scratch_buffer_fallback_without_module_flush(tmp_path):
    noflush = load_module(compile_module(SOURCE.read_text(), tmp_path, "noflush",
                                         {"KRPC_NO_CACHE_FLUSH": ""}))
    assert not noflush.has_cache_flush
    evaluator = noflush.time_evaluator("counted", cpu(0), number=1, repeat=2,
                                       f_preproc="cache_flush_cpu_non_first_arg")
    a, b = nd.empty((16,)), nd.empty((16,))
    assert evaluator(a, b).repeat == 2
    assert evaluator._scratch._scratch is not None


def test_kernel_errors_in_time_evaluator(mod):
    with pytest.raises(KernelError, match="'error_code' failed with error code 9"):
        mod.time_evaluator("error_code", cpu(0))(9)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"number": 0}, ValueError, "number must be in"),
    ({"repeat": 0}, ValueError, "repeat must be in"),
    ({"number": 1.5}, TypeError, "number must be an integer"),
    ({"min_repeat_ms": -1}, ValueError, "min_repeat_ms must be in"),
    ({"cooldown_interval_ms": "5"}, TypeError, "cooldown_interval_ms must be a number"),
    ({"repeats_to_cooldown": 0}, ValueError, "repeats_to_cooldown must be in"),
    ({"f_preproc": "flush_everything"}, ValueError, "unknown f_preproc 'flush_everything'"),
    ({"cache_flush_bytes": -4}, ValueError, "cache_flush_bytes must be in"),
])
def test_time_evaluator_arguments_are_checked(mod, kwargs, error, message):
    with pytest.raises(error, match=message):
        mod.time_evaluator("addone", cpu(0), **kwargs)


def test_time_evaluator_needs_a_local_device_and_a_known_function(mod):
    with pytest.raises(ValueError, match="needs a local device"):
        mod.time_evaluator("addone", Device("cpu", 0, session=object()))
    with pytest.raises(AttributeError, match="no function 'nope'"):
        mod.time_evaluator("nope", cpu(0))
    with pytest.raises(TypeError, match="takes 2 arguments, got 0"):
        mod.time_evaluator("addone", cpu(0))()


def test_profile_result_statistics_and_wire_form():
    values = [3e-3, 1e-3, 2e-3, 6e-3]
    result = ProfileResult(values, number=5, target={"string": "llvm -mcpu=znver4"},
                           function="gemm")
    assert result.mean == pytest.approx(np.mean(values))
    assert result.median == pytest.approx(np.median(values))
    assert result.std == pytest.approx(np.std(values))
    assert (result.min, result.max, result.repeat) == (1e-3, 6e-3, 4)
    assert ProfileResult.from_dict(result.to_dict()) == result
    text = str(result)
    assert "mean (ms)" in text and "median (ms)" in text and "3.000 " in text
    assert "gemm on llvm -mcpu=znver4, number=5, repeat=4" in text


@pytest.mark.parametrize("data, message", [
    ([], "must be a dict"),
    ({"results": [], "number": 1}, "non-empty list"),
    ({"results": [1e-3, "x"], "number": 1}, "non-empty list"),
    ({"results": [float("nan")], "number": 1}, "finite"),
    ({"results": [True], "number": 1}, "non-empty list"),
    ({"results": [1e-3], "number": 0}, "'number' must be a positive integer"),
    ({"results": [1e-3], "number": 1, "repeat": 2}, "'repeat' is 2"),
    ({"results": [1e-3], "number": 1, "target": "llvm"}, "'target' must be a dict"),
])
def test_profile_result_from_untrusted_dict(data, message):
    with pytest.raises(ValueError, match=message):
        ProfileResult.from_dict(data)
