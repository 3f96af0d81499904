"""What keeps a tuning run's devices measuring: the build cache, rounds that take their device
once built, tasks tuned side by side on one build pool (real tracker and device servers)."""
import time

import numpy as np
import pytest

import kernelrpc
from kernelrpc import autotvm, te
from kernelrpc.compiler.expr import DTypeError, parse_dtype
from kernelrpc.measure import OK, BuildCache
from kernelrpc.measure.build import BuildOutput, LinkFiles, dumps_candidate
from test_measure import addone

pytest.importorskip("cloudpickle")

N = 64


def scaled(factor, pause=0.0):
    """test_measure's candidate, its build ``pause`` seconds longer (with a pause, another
    function: another cache key, the same kernel)."""
    if not pause:
        return addone(factor)
    inner = addone(factor)

    def schedule():
        time.sleep(pause)
        return inner()
    return schedule


def run(tracker, candidates, **options):
    a = np.arange(N, dtype="float32")
    return kernelrpc.measure(candidates, key="board", tracker=f"127.0.0.1:{tracker.port}",
                             inputs=[a], reference=lambda x: x + 1.0, number=1, repeat=1,
                             timeout=60, **options)


def test_the_cache_key_is_what_the_build_depends_on(tmp_path):
    payload = dumps_candidate(scaled(8))
    key = BuildCache.key(payload, "llvm", "main", None)
    assert BuildCache.key(dumps_candidate(scaled(8)), "llvm", "main", None) == key
    assert BuildCache.key(dumps_candidate(scaled(16)), "llvm", "main", None) != key
    assert BuildCache.key(payload, "llvm -mcpu=generic", "main", None) != key
    assert BuildCache.key(payload, "llvm", "other", None) != key
    source = tmp_path / "extra.c"
    source.write_text("int f(void) { return 1; }\n")
    linked = BuildCache.key(payload, "llvm", "main", LinkFiles([source]))
    assert linked != key
    source.write_text("int f(void) { return 2; }\n")
    assert BuildCache.key(payload, "llvm", "main", LinkFiles([source])) != linked


def test_the_cache_drops_the_oldest_beyond_its_bound():
    cache = BuildCache(max_bytes=10)
    for k in range(4):
        cache.put(bytes([k]), BuildOutput(bytes(4), [], 0.1))
    assert len(cache) == 2 and cache.get(bytes([0])) is None and cache.get(bytes([3])) is not None
    cache.put(b"big", BuildOutput(bytes(11), [], 0.1))          # larger than the bound: not kept
    assert cache.get(b"big") is None and cache.hits == 1


def test_a_candidate_built_before_is_measured_from_the_cache(fleet):
    tracker, _ = fleet
    cache = BuildCache()
    first = run(tracker, {"s8": scaled(8), "s16": scaled(16)}, build_cache=cache)
    assert [r.status for r in first.wait()] == [OK, OK]
    assert first.stats()["built"] == 2 and first.stats()["cached"] == 0
    again = run(tracker, {"s8": scaled(8), "s4": scaled(4)}, build_cache=cache)
    assert [r.status for r in again.wait()] == [OK, OK]
    stats = again.stats()
    assert stats["built"] == 1 and stats["cached"] == 1 and cache.hits == 1


def test_wait_for_builds_takes_the_device_once_every_candidate_is_built(fleet):
    tracker, _ = fleet
    candidates = {"quick": scaled(8), "slow": scaled(16, pause=1.0)}
    batch = run(tracker, candidates, wait_for_builds=True, max_devices=1)
    assert [r.status for r in batch.wait()] == [OK, OK]
    stats = batch.stats()
    assert stats["builds_done_after"] is not None and len(stats["devices"]) == 1
    assert stats["devices"][0]["opened_after"] >= stats["builds_done_after"]


def test_a_kernel_lowered_to_the_same_ir_is_linked_once(tmp_path):
    from kernelrpc.compiler.build import build_library

    first = build_library(*scaled(8)(), reuse_dir=tmp_path)
    again = build_library(*scaled(8, pause=0.01)(), reuse_dir=tmp_path)   # another function
    other = build_library(*scaled(16)(), reuse_dir=tmp_path)
    assert first[2] is False and again[2] is True and other[2] is False
    assert again[0] == first[0] and again[1] == first[1] and other[0] != first[0]
    assert build_library(*scaled(8)())[2] is False                      # no directory: built
    assert len(list(tmp_path.iterdir())) == 2                           # two kernels, whole files


def test_a_batch_reuses_the_kernels_its_workers_linked_before(fleet, tmp_path):
    tracker, _ = fleet
    cache = BuildCache(directory=tmp_path)
    first = run(tracker, {"s8": scaled(8)}, build_cache=cache)
    assert [r.status for r in first.wait()] == [OK] and first.stats()["reused"] == 0
    again = run(tracker, {"s8_again": scaled(8, pause=0.01)}, build_cache=cache)
    assert [r.status for r in again.wait()] == [OK]
    assert again.stats()["built"] == 1 and again.stats()["reused"] == 1


@autotvm.template("test/pipeline_ignored_knob")
def ignored_knob_template(n):
    cfg = autotvm.get_config()
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    s = te.create_schedule(B.op)
    cfg.define_knob("factor", [4, 8])
    cfg.define_knob("ignored", [0, 1, 2])       # changes nothing: three configurations, one kernel
    s[B].split(B.op.axis[0], factor=cfg["factor"].val)
    return s, [A, B]


def test_a_tuner_builds_configurations_of_one_kernel_once(fleet):
    tracker, _ = fleet
    task = autotvm.task.create("test/pipeline_ignored_knob", args=(32,), reference=lambda a: a + 1.0)
    option = autotvm.measure_option(runner=autotvm.RPCRunner("board", "127.0.0.1", tracker.port,
                                                             number=1, repeat=1))
    tuner = autotvm.tuner.GridSearchTuner(task)
    tuner.tune(6, option, batch_size=6)
    stats = tuner.rounds[0]
    assert stats["statuses"] == {"ok": 6} and stats["built"] == 6
    assert 1 <= stats["reused"] <= 4             # two workers may link a kernel at the same time


@autotvm.template("test/pipeline_offset")
def offset_template(n):
    cfg = autotvm.get_config()
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    s = te.create_schedule(B.op)
    cfg.define_knob("factor", [1, 2, 4, 8, 16])
    cfg.define_knob("vectorize", [0, 1])
    _, inner = s[B].split(B.op.axis[0], factor=cfg["factor"].val)
    if cfg["vectorize"].val:
        s[B].vectorize(inner)
    return s, [A, B]


@pytest.mark.parametrize("overlap", [1, 2])
def test_tasks_tuned_side_by_side_log_every_trial_and_build_each_configuration_once(
        fleet, tmp_path, overlap):
    tracker, _ = fleet
    tasks = [autotvm.task.create("test/pipeline_offset", args=(n,), reference=lambda a: a + 1.0)
             for n in (32, 48, 64)]
    option = autotvm.measure_option(runner=autotvm.RPCRunner("board", "127.0.0.1", tracker.port,
                                                             number=1, repeat=1, max_devices=1))
    log = tmp_path / "tasks.log"
    report = autotvm.tune_tasks(tasks, 6, option, log, confirm=2, overlap=overlap)
    records = autotvm.load_from_file(log)
    for task in tasks:
        mine = [r for r in records if r["workload"] == [task.name, *task.args]]
        assert len({r["config"]["index"] for r in mine}) == 6
        assert len(mine) in (6 + 2, 6 + 3)       # the default and the two fastest once more
        assert all(r["result"]["status"] == "ok" for r in mine)
    totals = report.totals()
    assert totals["built"] == 3 * 6 and totals["cached"] == len(records) - 3 * 6   # not rebuilt
    assert totals["measured"] == len(records)
    assert 0 <= totals["device_idle_fraction"] <= 1
    assert totals["busy_seconds"] <= totals["held_seconds"]
    assert 1 <= totals["devices"] <= 2 and 0 < totals["measuring_share"] <= 1   # of the fleet's two
    assert "held" in str(report) and "build cache" in str(report)
    if overlap > 1:                              # every round took its device once all were built
        rounds = [r for t in report.tasks for r in t.rounds]
        assert all(d["opened_after"] >= r["builds_done_after"] for r in rounds for d in r["devices"])


def test_measured_alone_no_build_runs_beside_a_measurement(fleet, tmp_path):
    """``measure_alone``: one task at a time, and every round takes its device once all its
    candidates are built (for devices that share the builds' cores)."""
    tracker, _ = fleet
    tasks = [autotvm.task.create("test/pipeline_offset", args=(n,), reference=lambda a: a + 1.0)
             for n in (32, 48)]
    option = autotvm.measure_option(runner=autotvm.RPCRunner("board", "127.0.0.1", tracker.port,
                                                             number=1, repeat=1, max_devices=1))
    report = autotvm.tune_tasks(tasks, 6, option, tmp_path / "alone.log", confirm=1,
                                measure_alone=True)
    rounds = [r for t in report.tasks for r in t.rounds]
    assert rounds and all(d["opened_after"] >= r["builds_done_after"]
                          for r in rounds for d in r["devices"])
    first, second = report.tasks                  # one after the other: their walls add up
    assert first.wall_seconds + second.wall_seconds <= report.wall_seconds + 1e-3


def test_a_failing_task_stops_the_run_and_no_further_task_starts(fleet, tmp_path):
    tracker, _ = fleet

    def broken_reference(a):
        raise RuntimeError("broken reference")
    tasks = [autotvm.task.create("test/pipeline_offset", args=(n,),
                                 reference=broken_reference if n == 48 else lambda a: a + 1.0)
             for n in (32, 48, 64, 80)]
    option = autotvm.measure_option(runner=autotvm.RPCRunner("board", "127.0.0.1", tracker.port,
                                                             number=1, repeat=1, max_devices=1))
    log = tmp_path / "tasks.log"
    with pytest.raises(RuntimeError, match="broken reference"):
        autotvm.tune_tasks(tasks, 6, option, log, confirm=1, overlap=2)
    logged = {r["workload"][1] for r in autotvm.load_from_file(log)} if log.exists() else set()
    assert logged <= {32}                        # the task running beside it ends its round


def test_tune_tasks_refuses_an_overlap_below_one(fleet, tmp_path):
    tracker, _ = fleet
    option = autotvm.measure_option(runner=autotvm.RPCRunner("board", "127.0.0.1", tracker.port))
    task = autotvm.task.create("test/pipeline_offset", args=(16,))
    with pytest.raises(ValueError, match="overlap"):
        autotvm.tune_tasks([task], 2, option, tmp_path / "x.log", overlap=0)


def test_parsed_dtypes_are_remembered_and_bad_ones_still_refused():
    assert parse_dtype("float32x16") == ("float", 32, 16)
    assert parse_dtype("float32x16") is parse_dtype("float32x16")
    for bad in ("float7", "intx", "bool8", "float32x0"):
        with pytest.raises(DTypeError):
            parse_dtype(bad)
        with pytest.raises(DTypeError):      # a failure is not remembered as a success
            parse_dtype(bad)
    with pytest.raises(DTypeError):
        parse_dtype(["float32"])
