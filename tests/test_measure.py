"""kernelrpc.measure against a real tracker and device servers started as users start them."""
import signal
import threading

import numpy as np
import pytest

import kernelrpc
from kernelrpc import te
from kernelrpc.rpc import connect_tracker
from kernelrpc.measure import COMPILE_ERROR, OK, RUNTIME_ERROR, TIMEOUT, WRONG_RESULT, MeasureResult
from conftest import wait_until
from servicectl import queue, start_server, start_tracker

N = 64


def addone(factor, offset=1.0):
    """A candidate: B = A + offset, split by ``factor`` (a closure, as written in a notebook)."""
    def schedule():
        A = te.placeholder((N,), name="A")
        B = te.compute((N,), lambda i: A[i] + offset, name="B")
        s = te.create_schedule(B.op)
        _, inner = s[B].split(B.op.axis[0], factor=factor)
        s[B].vectorize(inner)
        return s, [A, B]
    return schedule


def broken():
    A = te.placeholder((N,), name="A")
    B = te.compute((N,), lambda i: A[i] + 1.0, name="B")
    s = te.create_schedule(B.op)
    s[B].split(B.op.axis[0], factor=0)           # not a valid split: the build fails
    return s, [A, B]


def segfaults():
    """Reads far outside A at an index computed from A's data: no build-time check can refuse
    it, so it crashes on the device."""
    A = te.placeholder((N,), name="A")
    B = te.compute((N,), lambda i: A[(A[i] * 1e9).astype("int64") + (1 << 40)], name="B")
    return te.create_schedule(B.op), [A, B]


def endless():
    """Every output element sums 2**30 terms (in order: floats do not reassociate), about a
    minute of work: far past the test's timeout."""
    A = te.placeholder((N,), name="A")
    k = te.reduce_axis((0, 1 << 30), "k")
    B = te.compute((N,), lambda i: te.sum(A[i] + te.indexmod(k, 2).astype("float32"), axis=k), name="B")
    return te.create_schedule(B.op), [A, B]


def run(tracker, candidates, **options):
    a = np.arange(N, dtype="float32")
    options = {"timeout": 60, "number": 2, "repeat": 2, **options}
    batch = kernelrpc.measure(candidates, key="board", tracker=f"127.0.0.1:{tracker.port}",
                              inputs=[a], reference=lambda x: x + 1.0, **options)
    return batch


def test_batch_keeps_outcomes_apart_and_uses_every_device(fleet):
    tracker, _ = fleet
    candidates = {f"split{f}": addone(f) for f in (4, 8, 16, 32)}
    candidates["broken"] = broken
    candidates["off_by_one"] = addone(8, offset=2.0)
    candidates["lambda"] = lambda: addone(2)()
    candidates["segfault"] = segfaults
    candidates["after_crash"] = addone(16)
    batch = run(tracker, candidates)
    seen = []
    for res in batch:                           # results stream in as they finish
        assert isinstance(res, MeasureResult)
        seen.append(res)
    assert len(seen) == len(candidates)
    by_name = {r.name: r for r in batch.wait()}
    for name in ("split4", "split8", "split16", "split32", "lambda", "after_crash"):
        assert by_name[name].status == OK, by_name[name]
        assert by_name[name].profile.mean > 0
    assert by_name["broken"].status == COMPILE_ERROR
    assert "ScheduleError" in by_name["broken"].error
    assert by_name["off_by_one"].status == WRONG_RESULT
    assert "differ from the reference" in by_name["off_by_one"].error
    assert by_name["segfault"].status == RUNTIME_ERROR
    assert "crashed" in by_name["segfault"].error
    stats = batch.stats()
    assert len({d["address"] for d in stats["devices"]}) >= 2      # both boards were used
    assert stats["statuses"] == {OK: 6, COMPILE_ERROR: 1, WRONG_RESULT: 1, RUNTIME_ERROR: 1}
    text = str(batch)
    assert "off_by_one" in text and "wrong_result" in text and ("µs" in text or " ns" in text)
    assert "<table>" in batch._repr_html_() and "segfault" in batch._repr_html_()


def test_timeout_costs_only_its_candidate(fleet):
    tracker, _ = fleet
    candidates = {"endless": endless, **{f"split{f}": addone(f) for f in (4, 8, 16)}}
    results = {r.name: r for r in run(tracker, candidates, timeout=3, session_timeout=10).wait()}
    assert results["endless"].status == TIMEOUT
    assert all(results[f"split{f}"].status == OK for f in (4, 8, 16))


def test_when_every_board_vanishes_the_batch_ends_after_board_wait(fleet):
    """The candidate in flight goes back to the queue; with no server of the key registered
    for ``board_wait`` seconds, what is left fails naming why."""
    tracker, servers = fleet
    quick = {f"split{f}": addone(f) for f in (4, 8, 16, 32)}
    batch = run(tracker, {"endless": endless, **quick}, timeout=120, session_timeout=150,
                board_wait=2)
    results = {}
    for res in batch:
        results[res.name] = res
        if set(quick) <= set(results) and "endless" not in results:
            for server in servers:                  # the boards vanish, one mid-kernel
                server.stop(signal.SIGKILL)
    assert all(results[name].status == OK for name in quick)
    assert results["endless"].status == RUNTIME_ERROR
    assert "no server with key 'board' registered" in results["endless"].error


HELD_ONCE = r"""
#include <fcntl.h>
#include <unistd.h>

/* x + 1; the first call on any board creates MARK and sleeps there until its board is
   killed (60 s at most); every later call, on any board, returns at once. */
float held_once(float x) {
    int fd = open(MARK, O_CREAT | O_EXCL | O_WRONLY, 0600);
    if (fd >= 0) {
        close(fd);
        for (int i = 0; i < 600; i++)
            usleep(100000);
    }
    return x + 1.0f;
}
"""


def test_a_board_that_goes_away_mid_candidate_costs_nothing_and_a_new_one_joins(
        start_service, tracker, tmp_path):
    """The board running the first candidate is killed; the batch waits, a board registered
    under the key afterwards (a rebooted one) takes the candidate in flight and the rest.

    The candidate's kernel marks a file when it starts and holds its first board until the
    kill, so the kill always lands mid-candidate."""
    mark = tmp_path / "held.started"
    source = tmp_path / "held_once.c"
    source.write_text(f'#define MARK "{mark}"\n' + HELD_ONCE)
    first = start_server(start_service, tracker)
    wait_until(lambda: queue(tracker)["free"] == 1, what="the board registered")
    candidates = {"held": calls_c("held_once"), **{f"split{f}": addone(f) for f in (4, 8)}}
    batch = run(tracker, candidates, number=1, repeat=1, board_wait=60, sources=[source])
    batch._start()
    wait_until(mark.exists, timeout=60, what="the held candidate running on the first board")
    first.stop(signal.SIGKILL)
    second = start_server(start_service, tracker)
    results = {r.name: r for r in batch.wait()}
    assert all(r.status == OK for r in results.values()), results
    assert results["held"].device.endswith(f":{second.port}")
    addresses = [d["address"] for d in batch.stats()["devices"]]
    assert len(addresses) == 2 and addresses[1].endswith(f":{second.port}")


def test_session_reports_its_cores(start_service, capsys):
    tracker = start_tracker(start_service)
    start_service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{tracker.port}",
                                       "--key", "board", "--cpus", "0"])
    wait_until(lambda: queue(tracker)["free"] == 1)
    (res,) = run(tracker, [addone(8)], progress=True).wait()
    assert res.status == OK and res.cpus == [0]
    bar = capsys.readouterr().err
    assert "measure" in bar and "1/1" in bar and "best" in bar


def test_server_rejects_bad_cpus(start_service):
    with pytest.raises(RuntimeError, match="--cpus"):
        start_service("kernelrpc.server", ["--port", "0", "--cpus", "0-x"], timeout=10)


def test_dask_cluster_builds_the_batch(fleet):
    distributed = pytest.importorskip("distributed")
    tracker, _ = fleet
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        results = run(tracker, [addone(4), addone(8), broken], executor=client.get_executor()).wait()
    assert [r.status for r in results] == [OK, OK, COMPILE_ERROR]


def test_a_device_held_by_someone_else_is_waited_for_not_required(fleet):
    tracker, _ = fleet
    with connect_tracker(*tracker.address) as other, other.request("board", session_timeout=60, timeout=30):
        results = run(tracker, [addone(4), addone(8), addone(16)]).wait()
        assert [r.status for r in results] == [OK, OK, OK]
        assert len({r.device for r in results}) == 1
        with connect_tracker(*tracker.address) as probe:
            wait_until(lambda: not probe.summary()["waiting"])     # the batch left the queue


def test_time_queued_for_a_board_does_not_count_against_the_timeout(fleet):
    """Both boards are held by someone else for 3 s; candidates with a 1 s timeout wait in
    the tracker's queue, then run."""
    tracker, _ = fleet
    with connect_tracker(*tracker.address) as other:
        held = [other.request("board", session_timeout=60, timeout=30) for _ in range(2)]
    release = threading.Timer(3.0, lambda: [session.close() for session in held])
    release.start()
    try:
        batch = run(tracker, [addone(4), addone(8)], timeout=1)
        assert [r.status for r in batch.wait()] == [OK, OK]
        assert min(d["opened_after"] for d in batch.stats()["devices"]) >= 2.5
    finally:
        release.cancel()
        for session in held:
            session.close()


def test_leaving_the_loop_early_releases_the_devices(fleet):
    tracker, _ = fleet
    batch = run(tracker, {"endless": endless, **{f"split{f}": addone(f) for f in (4, 8)}}, timeout=120,
                session_timeout=150)
    for res in batch:
        if res.name != "endless":
            break
    assert batch._queue.cancelled and not any(t.is_alive() for t in batch._threads)
    assert len(batch.results) == 1


def test_unreachable_tracker_is_a_clear_error():
    from kernelrpc.rpc.tracker_client import TrackerUnreachable

    batch = kernelrpc.measure([addone(4)], key="board", tracker="127.0.0.1:1",
                              inputs=[np.zeros(N, "float32")])
    with pytest.raises(TrackerUnreachable, match="127.0.0.1:1"):
        batch.wait()


def test_a_tracker_address_it_cannot_take_is_refused_before_any_build():
    with pytest.raises(ValueError, match=r"tracker: ':9190': the host is empty"):
        kernelrpc.measure([addone(4)], key="board", tracker=":9190", inputs=[])
    batch = kernelrpc.measure([addone(4)], key="board", tracker="[::1]:9190", inputs=[])
    assert batch.tracker_addr == ("::1", 9190)


def test_candidates_must_be_callable():
    with pytest.raises(TypeError, match="returns \\(schedule, args\\)"):
        kernelrpc.measure([42], key="board", tracker="127.0.0.1:1", inputs=[])


def calls_c(function="add_offset"):
    """A candidate whose kernel calls a C function linked from the batch's sources."""
    def schedule():
        from kernelrpc import tir

        A = te.placeholder((N,), name="A")
        B = te.compute((N,), lambda i: tir.call_extern("float32", function, A[i]), name="B")
        return te.create_schedule(B.op), [A, B]
    return schedule


@pytest.fixture
def c_source(tmp_path):
    (tmp_path / "offset.h").write_text("#define OFFSET 1.0f\n")
    source = tmp_path / "add_offset.c"
    source.write_text('#include "offset.h"\nfloat add_offset(float x) { return x + OFFSET; }\n')
    return source


def test_candidates_link_the_batchs_c_sources(fleet, c_source):
    tracker, _ = fleet
    results = run(tracker, {"c": calls_c(), "missing": calls_c("not_defined_anywhere")},
                  sources=[c_source]).wait()
    by_name = {r.name: r for r in results}
    assert by_name["c"].status == OK, by_name["c"]
    assert by_name["missing"].status == COMPILE_ERROR
    assert "not_defined_anywhere" in by_name["missing"].error


def test_a_worker_without_the_file_builds_from_the_bytes_read_at_the_start(tmp_path):
    from kernelrpc.measure.build import LinkFiles, build_candidate, dumps_candidate

    source = tmp_path / "add_offset.c"
    source.write_text("float add_offset(float x) { return x + 1.0f; }\n")
    link = LinkFiles(sources=[source])
    source.write_text("float add_offset(float x) { return x - 1.0f; }\n")  # not the file read at the start
    output = build_candidate(dumps_candidate(calls_c()), None, "main", link)
    assert output.library is not None, output.error
    path = tmp_path / "built.so"
    path.write_bytes(output.library)
    module = kernelrpc.runtime.load_module(str(path))
    dev = kernelrpc.cpu(0)
    a = kernelrpc.nd.array(np.arange(N, dtype="float32"), dev)
    b = kernelrpc.nd.empty((N,), "float32", dev)
    module["main"](a, b)
    np.testing.assert_array_equal(b.numpy(), np.arange(N, dtype="float32") + 1)


def test_a_copied_source_cannot_find_the_headers_beside_the_original(c_source):
    from kernelrpc.measure.build import LinkFiles, build_candidate, dumps_candidate

    link = LinkFiles(sources=[c_source])
    c_source.write_text(c_source.read_text() + "\n")
    output = build_candidate(dumps_candidate(calls_c()), None, "main", link)
    assert output.library is None and "offset.h" in output.error


def test_sources_must_be_a_list():
    with pytest.raises(TypeError, match="lists of paths"):
        kernelrpc.measure([addone(4)], key="board", tracker="127.0.0.1:1", inputs=[], sources="x.c")
