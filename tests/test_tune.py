"""kernelrpc.autotvm: spaces (pure), and tuning runs on a real tracker and device servers."""
import json

import numpy as np
import pytest

import kernelrpc
from kernelrpc import autotvm, nd, te
from kernelrpc.autotvm.space import ConfigSpace, split_choices
from kernelrpc.measure import MeasureResult
from kernelrpc.runtime.profile import ProfileResult

N = 32


@autotvm.template("test/matmul")
def matmul(n):
    cfg = autotvm.get_config()
    A = te.placeholder((n, n), name="A")
    B = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), "k")
    C = te.compute((n, n), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C.op)
    i, j = s[C].op.axis
    cfg.define_split("tile_i", i, num_outputs=2)
    cfg.define_split("tile_j", n, num_outputs=2, policy="power2", max_factor=16)
    cfg.define_knob("vectorize", [False, True])
    io, ii = cfg["tile_i"].apply(s, C, i)
    jo, ji = cfg["tile_j"].apply(s, C, j)
    s[C].reorder(io, jo, ii, ji)
    if cfg["vectorize"].val:
        s[C].vectorize(ji)
    return s, [A, B, C]


def test_split_choices_follow_the_policy():
    assert split_choices(12, 2, "factors", None) == [[-1, f] for f in (1, 2, 3, 4, 6, 12)]
    assert split_choices(100, 2, "power2", 16) == [[-1, f] for f in (1, 2, 4, 8, 16)]
    three = split_choices(8, 3, "factors", None)
    assert [-1, 2, 4] in three and all(8 % (a * b) == 0 for _, a, b in three)
    with pytest.raises(ValueError, match="policy"):
        split_choices(8, 2, "fancy", None)


def test_space_indexes_every_configuration_once():
    space = matmul.space((N,))
    assert list(space.space_map) == ["tile_i", "tile_j", "vectorize"]
    assert len(space) == 6 * 5 * 2
    seen = {json.dumps(space.get(i).to_dict(), sort_keys=True) for i in range(len(space))}
    assert len(seen) == len(space)
    config = space.get(37)
    logged = json.loads(json.dumps(config.to_dict()))            # as read back from a log
    assert space.from_values(logged).index == 37
    with pytest.raises(ValueError, match="knob"):
        space.from_values({"tile_i": [-1, 2]})
    with pytest.raises(IndexError):
        space.get(len(space))
    assert "60 configurations" in repr(space)


def test_knob_defined_twice_is_an_error():
    space = ConfigSpace()
    space.define_knob("x", [1, 2])
    with pytest.raises(ValueError, match="twice"):
        space.define_knob("x", [3])


def test_model_tuner_ranks_by_its_fit():
    """Pure: after a warm-up whose fastest configurations vectorize, the model proposes vectorized ones."""
    from types import SimpleNamespace

    task = autotvm.task.create("test/matmul", args=(N,))
    tuner = autotvm.tuner.ModelTuner(task, warmup=8, epsilon=0.0, seed=3)
    for config in tuner.next_batch(12):
        seconds = 1e-3 if config["vectorize"].val else 4e-3
        tuner._record(config, SimpleNamespace(status="ok", profile=SimpleNamespace(median=seconds),
                                              gflops=None))
    proposed = tuner.next_batch(8)
    assert proposed and all(c["vectorize"].val for c in proposed)
    assert not {c.index for c in proposed} & tuner.visited


def test_get_config_outside_a_template_says_how_to_call_it():
    with pytest.raises(RuntimeError, match="template"):
        autotvm.get_config()


def option(tracker):
    return autotvm.measure_option(runner=autotvm.RPCRunner("board", "127.0.0.1", tracker.port,
                                                           number=2, repeat=2, rtol=1e-4, atol=1e-3))


@pytest.mark.parametrize("tuner_class", [autotvm.tuner.RandomTuner, autotvm.tuner.GATuner,
                                         autotvm.tuner.ModelTuner])
def test_tuning_logs_every_trial_resumes_and_applies_the_best(fleet, tmp_path, tuner_class):
    log = tmp_path / "matmul.log"
    task = autotvm.task.create("test/matmul", args=(N,), reference=lambda a, b: a @ b, flop=2 * N ** 3)
    tuner = tuner_class(task, seed=1)
    best = tuner.tune(12, option(fleet[0]), callbacks=[autotvm.callback.log_to_file(log)], batch_size=6)
    records = autotvm.load_from_file(log)
    assert len(records) == 12
    assert all(r["result"]["status"] == "ok" for r in records)
    assert len({r["config"]["index"] for r in records}) == 12          # no configuration twice
    assert best is not None and tuner.best_flops > 0

    resumed = tuner_class(task, seed=1)
    assert resumed.load_history(records) == 12
    resumed.tune(6, option(fleet[0]), callbacks=[autotvm.callback.log_to_file(log)], batch_size=6)
    again = autotvm.load_from_file(log)
    assert len(again) == 18 and len({r["config"]["index"] for r in again}) == 18

    fastest = min(again, key=lambda r: r["result"]["mean"])
    with autotvm.apply_history_best(log):
        s, args = matmul(N)
    config = task.config_space.from_values(fastest["config"]["knobs"])
    module = kernelrpc.build(s, args)
    a, b = np.random.default_rng(0).random((2, N, N), dtype=np.float32)
    c = nd.empty((N, N), "float32")
    module(nd.array(a), nd.array(b), c)
    np.testing.assert_allclose(c.numpy(), a @ b, rtol=1e-4, atol=1e-4)
    applied = str(kernelrpc.lower(s, args, simple_mode=True))
    assert applied == str(kernelrpc.lower(*task.instantiate(config), simple_mode=True))


def _logged(task, index, seconds, target):
    config = task.config_space.get(index)
    result = MeasureResult(0, "c", "ok", profile=ProfileResult([seconds], 1))
    task.target = target
    return autotvm.record.decode(autotvm.record.encode(task, config, result))


def test_a_log_shared_by_boards_gives_each_target_its_own_configurations():
    """Identical boards (one target) share a log; another target's entries are never applied
    or resumed, and a log of several targets must be told which."""
    task = autotvm.task.create("test/matmul", args=(N,))
    arm, x86 = "llvm -mtriple=aarch64-linux-gnu", "llvm -mcpu=haswell"
    records = [_logged(task, 5, 1e-3, arm), _logged(task, 7, 2e-3, arm),
               _logged(task, 9, 1e-4, x86)]
    for target, index in ((arm, 5), (x86, 9)):
        with autotvm.apply_history_best(records, target=target):
            applied = str(kernelrpc.lower(*matmul(N), simple_mode=True))
        expected = task.instantiate(task.config_space.get(index))
        assert applied == str(kernelrpc.lower(*expected, simple_mode=True))
    with autotvm.apply_history_best(records), pytest.raises(ValueError, match="2 targets"):
        matmul(N)
    with autotvm.apply_history_best(records[:2]):    # one target in the log: it applies
        assert str(kernelrpc.lower(*matmul(N), simple_mode=True)) == str(kernelrpc.lower(
            *task.instantiate(task.config_space.get(5)), simple_mode=True))
    arm_task = autotvm.task.create("test/matmul", args=(N,), target=arm)
    tuner = autotvm.tuner.RandomTuner(arm_task, seed=1)
    assert tuner.load_history(records) == 2
    assert tuner.best_config.index == 5


def test_failed_trials_are_logged_with_their_status(fleet, tmp_path):
    @autotvm.template("test/fails_on_a_bad_split")
    def template(n):
        cfg = autotvm.get_config()
        A = te.placeholder((n,), name="A")
        B = te.compute((n,), lambda i: A[i] * 2.0, name="B")
        s = te.create_schedule(B.op)
        cfg.define_knob("factor", [4, 0])            # 0 is not a valid split: a compile error
        s[B].split(B.op.axis[0], factor=cfg["factor"].val)
        return s, [A, B]

    log = tmp_path / "fails.log"
    task = autotvm.task.create("test/fails_on_a_bad_split", args=(16,), reference=lambda a: a * 2)
    autotvm.tuner.GridSearchTuner(task).tune(4, option(fleet[0]), callbacks=[autotvm.callback.log_to_file(log)])
    statuses = {r["config"]["knobs"]["factor"]: r["result"]["status"] for r in autotvm.load_from_file(log)}
    assert statuses == {0: "compile_error", 4: "ok"}


@autotvm.template("test/annotated")
def annotated(n):
    cfg = autotvm.get_config()
    A = te.placeholder((n, n), name="A")
    B = te.compute((n, n), lambda i, j: A[i, j] * 3.0, name="B")
    s = te.create_schedule(B.op)
    i, j = s[B].op.axis
    cfg.define_split("tile_j", j, num_outputs=3, policy="power2", max_factor=8)
    jo, jm, ji = cfg["tile_j"].apply(s, B, j)
    cfg.define_annotate("ann", [jm, ji], policy="try_unroll_vec")
    cfg["ann"].apply(s, B, [jm, ji])
    return s, [A, B]


def test_every_annotation_and_three_way_split_builds_correctly():
    space = annotated.space((16,))
    assert [c.value for c in space.space_map["ann"].entities] == [
        ["none", "none"], ["none", "unroll"], ["unroll", "none"], ["unroll", "unroll"],
        ["none", "vec"], ["unroll", "vec"]]
    a = np.random.default_rng(0).random((16, 16), dtype=np.float32)
    for index in range(0, len(space), 7):
        config = space.get(index)
        s, args = annotated.instantiate(config, (16,))
        lowered = str(kernelrpc.lower(s, args, simple_mode=True))
        anns = config["ann"].value
        assert ("ramp(" in lowered) == ("vec" in anns) or config["tile_j"].size[-1] == 1
        b = nd.empty((16, 16), "float32")
        kernelrpc.build(s, args)(nd.array(a), b)
        np.testing.assert_allclose(b.numpy(), a * 3.0, rtol=1e-6)
