"""What the device saw while timing: read from the real /proc and sysfs, locally and through a
device server, and a measurement disturbed by a real competing process says so."""
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kernelrpc
from kernelrpc import nd, rpc
from kernelrpc.compiler import recipes
from kernelrpc.runtime import ProfileResult, cpu, load_module
from kernelrpc.runtime import conditions
from kernelrpc.runtime.conditions import ConditionsProbe
from servicectl import SRC


def _affinity():
    return sorted(os.sched_getaffinity(0))


def test_local_measurement_reports_cpus_threads_and_other_processes():
    # 256 rows: 8 parallel tiles, so the pool's thread gets some even when it wakes up late
    s, args = recipes.tutorial_schedule("parallel", 256, 256, 256)
    module = kernelrpc.build(s, args, target="llvm", name="gemm").runtime_module
    threads = min(2, len(_affinity()))
    module.set_num_threads(threads)
    a, b = nd.array(np.ones((256, 256), "float32")), nd.array(np.ones((256, 256), "float32"))
    c = nd.empty((256, 256), "float32")
    result = module.time_evaluator("gemm", cpu(0), number=5, repeat=3)(a, b, c)
    cond = result.conditions
    assert cond["cpus"] == _affinity()
    assert cond["wall_s"] > 0 and cond["own_cpu_s"] >= 0 and cond["preempted"] >= 0
    assert cond["other_cpu_s"] is not None and cond["other_load"] is not None
    ran = {t["tid"] for t in cond["threads"]}
    assert threading.get_native_id() in ran          # the caller runs the kernel too
    assert len(ran) >= threads                        # and so does the module's pool
    assert all(t["cpu"] in cond["cpus"] and t["cpu_s"] > 0 for t in cond["threads"])
    assert ProfileResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_frequency_from_sysfs_and_its_change(tmp_path):
    probe = ConditionsProbe(sys_cpu=str(tmp_path))
    cpus = sorted(os.sched_getaffinity(0))

    def write(khz):
        for c in cpus:
            path = tmp_path / f"cpu{c}" / "cpufreq"
            path.mkdir(parents=True, exist_ok=True)
            (path / "scaling_cur_freq").write_text(f"{khz}\n")

    write(2400000)
    measurement = probe.measurement()
    measurement.batch_started()
    write(3000000)
    cond = measurement.report()
    assert cond["freq_mhz"] == [2400.0, 3000.0]
    result = ProfileResult([1e-3], number=1, conditions=cond)
    assert "the CPU frequency varied from 2400 to 3000 MHz" in result.disturbance()


def test_without_procfs_or_cpufreq_the_fields_are_none(tmp_path):
    probe = ConditionsProbe(proc=str(tmp_path), sys_cpu=str(tmp_path))
    measurement = probe.measurement()
    measurement.batch_started()
    cond = measurement.report()
    assert cond["other_cpu_s"] is None and cond["other_load"] is None
    assert cond["freq_mhz"] is None and cond["threads"] == []
    result = ProfileResult([1e-3], number=1, conditions=cond)
    assert not result.disturbed and "frequency not exposed" in str(result)


def test_a_cpufreq_file_that_appears_later_is_found(tmp_path, monkeypatch):
    """A missing cpufreq file is remembered for a while (reading absent files costs time on
    every call), then looked for again."""
    probe = ConditionsProbe(sys_cpu=str(tmp_path))

    def freq():
        measurement = probe.measurement()
        measurement.batch_started()
        return measurement.report()["freq_mhz"]

    assert freq() is None
    for c in _affinity():
        (tmp_path / f"cpu{c}" / "cpufreq").mkdir(parents=True)
        (tmp_path / f"cpu{c}" / "cpufreq" / "scaling_cur_freq").write_text("1800000\n")
    assert freq() is None                               # still believed absent
    monkeypatch.setattr(conditions, "REDISCOVER_S", 0.0)
    assert freq() == [1800.0, 1800.0]


def _spin(seconds):
    end = time.thread_time() + seconds
    deadline = time.monotonic() + 30
    while time.thread_time() < end and time.monotonic() < deadline:
        pass


def test_files_kept_open_are_read_afresh_by_every_measurement():
    probe = ConditionsProbe()
    me = threading.get_native_id()
    for _ in range(3):
        measurement = probe.measurement()
        measurement.batch_started()
        _spin(0.02)
        ran = {t["tid"]: t["cpu_s"] for t in measurement.report()["threads"]}
        assert ran.get(me, 0) >= 0.015


def test_a_forked_child_reports_its_own_threads_not_the_parents():
    probe = conditions.default_probe()
    measurement = probe.measurement()
    measurement.batch_started()
    measurement.report()                                # the parent's files are open now
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            measurement = probe.measurement()
            measurement.batch_started()
            _spin(0.02)
            tids = [t["tid"] for t in measurement.report()["threads"]]
            os.write(write_end, json.dumps([threading.get_native_id(), tids]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        child, tids = json.loads(f.read())
    os.waitpid(pid, 0)
    assert child in tids and threading.get_native_id() not in tids


def test_a_forked_child_that_closes_and_reuses_the_inherited_numbers_keeps_its_files():
    """A child that closes the descriptors it does not know of (as a server's session child may)
    and opens files of its own under those numbers: its measurements must not close them."""
    probe = conditions.default_probe()
    measurement = probe.measurement()
    measurement.batch_started()
    measurement.report()                                # the parent's files are open now
    inherited = sorted(probe._files._fds.values())
    assert inherited
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in inherited:
                try:
                    os.close(fd)
                except OSError:
                    pass
            mine = [os.open(__file__, os.O_RDONLY) for _ in inherited]
            measurement = probe.measurement()
            measurement.batch_started()
            threads = measurement.report()["threads"]
            intact = all(os.pread(fd, 3, 0) == b'"""' for fd in mine)
            os.write(write_end, json.dumps([intact, bool(set(mine) & set(inherited)), len(threads)]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        intact, reused, threads = json.loads(f.read())
    os.waitpid(pid, 0)
    assert reused and intact and threads >= 1


def test_the_files_of_a_fork_that_ran_no_hooks_are_forgotten_at_the_next_measurement():
    """A child forked without the at-fork hooks (a C library's fork) still holds the parent's
    descriptors under the probe: the next measurement notices the new pid, leaves those numbers
    alone (they may be the child's own files by now) and opens its own."""
    probe = ConditionsProbe()
    measurement = probe.measurement()
    measurement.batch_started()
    measurement.report()
    inherited = sorted(probe._files._fds.values())
    probe._files._pid = -1              # what a child forked without the hooks would see
    try:
        measurement = probe.measurement()
        measurement.batch_started()
        _spin(0.005)
        cond = measurement.report()
        assert probe._files._pid == os.getpid()
        assert not set(probe._files._fds.values()) & set(inherited)
        assert all(os.fstat(fd) for fd in inherited)                  # not closed
        assert cond["other_cpu_s"] is not None and cond["threads"]
    finally:
        for fd in inherited:
            os.close(fd)


def test_threads_that_come_and_go_between_measurements_are_seen():
    """The thread list is read again when the number of threads changed, and when it did not
    but a thread listed before has ended (one ended, another started)."""
    probe = ConditionsProbe()

    def ran_while(work):
        measurement = probe.measurement()
        measurement.batch_started()
        work()
        return {t["tid"] for t in measurement.report()["threads"]}

    def spin_in_a_thread(started, stop):
        def run():
            started.append(threading.get_native_id())
            while not stop.is_set():
                _spin(0.001)
        return threading.Thread(target=run)

    ran_while(lambda: _spin(0.001))
    first, stop_first = [], threading.Event()
    worker = spin_in_a_thread(first, stop_first)
    worker.start()
    try:
        assert first[0] in ran_while(lambda: _spin(0.02))           # one thread more
    finally:
        stop_first.set()
        worker.join()
    second, stop_second = [], threading.Event()
    worker = spin_in_a_thread(second, stop_second)
    worker.start()                                                 # as many threads as before
    try:
        ran = ran_while(lambda: _spin(0.02))
        assert second[0] in ran and (first[0] == second[0] or first[0] not in ran)
    finally:
        stop_second.set()
        worker.join()


ENDED_THREADS_CHILD = textwrap.dedent("""
    import os, threading, time
    from kernelrpc.runtime.conditions import MAX_KEPT_FILES, ConditionsProbe

    def spin():
        end = time.thread_time() + 0.005
        while time.thread_time() < end:
            pass

    probe = ConditionsProbe()
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(MAX_KEPT_FILES):
        worker = threading.Thread(target=spin)
        worker.start()
        measurement = probe.measurement()
        measurement.batch_started()
        worker.join()
        measurement.report()
    probe.measurement().report()
    print(len(os.listdir("/proc/self/fd")) - before)
""")


def test_threads_that_ended_leave_no_open_files():
    """In a fresh interpreter (one thread): what stays open is /proc/stat, the main thread's two
    files and at most the last worker's (its exit may trail ``join``; the next look closes it),
    however many threads came and went."""
    proc = subprocess.run([sys.executable, "-c", ENDED_THREADS_CHILD], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": SRC})
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout.split()[-1]) <= 4


def test_a_process_with_many_threads_keeps_a_bounded_number_of_files_open(monkeypatch):
    monkeypatch.setattr(conditions, "MAX_KEPT_FILES", 4)
    probe = ConditionsProbe()
    stop = threading.Event()
    workers = [threading.Thread(target=stop.wait) for _ in range(8)]
    for worker in workers:
        worker.start()
    try:
        before = len(os.listdir("/proc/self/fd"))
        measurement = probe.measurement()
        measurement.batch_started()
        _spin(0.01)
        cond = measurement.report()
        assert len(os.listdir("/proc/self/fd")) - before <= 4
        assert threading.get_native_id() in {t["tid"] for t in cond["threads"]}
    finally:
        stop.set()
        for worker in workers:
            worker.join()


DISTURBED_CHILD = textwrap.dedent("""
    import json, subprocess, sys
    from kernelrpc import runtime
    spinner = subprocess.Popen([sys.executable, "-c", "print('spinning', flush=True)\\nwhile True: pass"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert spinner.stdout.readline().strip() == "spinning"
        mod = runtime.load_module(sys.argv[1])
        a, b = runtime.empty((1024,), "float32"), runtime.empty((1024,), "float32")
        result = mod.time_evaluator("addone", runtime.cpu(0), repeat=5, min_repeat_ms=100)(a, b)
        print(json.dumps(result.to_dict()))
    finally:
        spinner.kill()
        spinner.wait()
""")


def test_a_competing_process_on_the_same_cpu_marks_the_measurement_disturbed(fixture_module):
    """The child and its spinner share one CPU; the spinner takes about half of it."""
    only = _affinity()[-1]
    proc = subprocess.run([sys.executable, "-c", DISTURBED_CHILD, str(fixture_module)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": SRC},
                          preexec_fn=lambda: os.sched_setaffinity(0, {only}))
    assert proc.returncode == 0, proc.stderr
    result = ProfileResult.from_dict(json.loads(proc.stdout.splitlines()[-1]))
    assert result.conditions["cpus"] == [only]
    assert result.conditions["other_load"] > 0.2
    assert result.disturbed and "DISTURBED: other processes used" in repr(result)


@pytest.fixture
def session(start_service):
    server = start_service("kernelrpc.server", ["--host", "127.0.0.1", "--port", "0", "--key", "dev"])
    with rpc.connect(server.host, server.port, key="dev") as sess:
        yield sess


def test_remote_measurement_carries_the_device_conditions(session, fixture_module):
    session.upload(fixture_module, "kernels.so")
    module = session.load_module("kernels.so")
    dev = session.cpu(0)
    a, b = nd.array(np.arange(1024, dtype="float32"), dev), nd.empty((1024,), "float32", dev)
    result = module.time_evaluator("addone", dev, number=10, repeat=4)(a, b)
    cond = result.conditions
    assert cond is not None and cond["wall_s"] > 0 and cond["cpus"]
    ours = {int(tid) for tid in os.listdir("/proc/self/task")}
    assert cond["threads"] and not ours & {t["tid"] for t in cond["threads"]}  # the server's
    assert "device: CPUs" in str(result)



def test_cooldown_sleeps_are_left_out_of_the_window(fixture_module):
    module = load_module(fixture_module)
    a, b = kernelrpc.runtime.empty((1024,), "float32"), kernelrpc.runtime.empty((1024,), "float32")
    started = time.monotonic()
    result = module.time_evaluator("addone", cpu(0), number=1, repeat=3,
                                   cooldown_interval_ms=500)(a, b)
    took = time.monotonic() - started
    assert result.conditions["wall_s"] > 0
    assert result.conditions["wall_s"] + 1.5 <= took    # the three 0.5 s sleeps fall outside the window


def _busy_reference(stat: bytes, cpus: list[int]) -> int | None:
    """Non-idle ticks of ``cpus`` from a whole /proc/stat, every line split and parsed."""
    busy, found = 0, False
    for line in stat.split(b"\n")[1:]:
        fields = line.split()
        if fields and fields[0] in {b"cpu%d" % c for c in cpus}:
            user, nice, system, idle, iowait, irq, softirq, steal = map(int, fields[1:9])
            busy += user + nice + system + irq + softirq + steal
            found = True
    return busy if found else None


_STAT_COUNTERS = st.lists(st.integers(0, 10**12), min_size=10, max_size=10)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.lists(_STAT_COUNTERS, min_size=1, max_size=6),
                          st.sets(st.integers(0, 5), min_size=1), st.booleans()),
                min_size=1, max_size=12))
def test_busy_ticks_of_every_read_match_a_full_parse_of_the_file(tmp_path_factory, reads):
    """The probe keeps the cpuN lines it read last and their sum: a read whose lines are the
    same bytes answers that sum, any other is parsed; each answer must be what a full parse of
    the file says, as the counters, the CPUs asked for and the CPUs listed change."""
    root = tmp_path_factory.mktemp("proc")
    probe = ConditionsProbe(proc=str(root))
    previous = None
    for counters, cpus, same_as_before in reads:
        if same_as_before and previous is not None:
            counters = previous
        previous = counters
        lines = [b"cpu  " + b" ".join(b"%d" % v for v in counters[0])]
        lines += [b"cpu%d " % n + b" ".join(b"%d" % v for v in c) for n, c in enumerate(counters)]
        stat = b"\n".join(lines + [b"intr 123 0 0 4", b"ctxt 99", b""])
        (root / "stat").write_bytes(stat)
        cpus = sorted(cpus)
        assert probe._busy_ticks(cpus) == _busy_reference(stat, cpus)


def test_busy_ticks_of_this_machines_proc_stat_match_a_full_parse(tmp_path):
    """The same with this machine's own /proc/stat, snapshots a few clock ticks apart (the
    counters move between most of them) and some read twice."""
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    probe = ConditionsProbe(proc=str(tmp_path))
    cpus = _affinity()
    changed = 0
    previous = None
    for i in range(12):
        with open("/proc/stat", "rb") as f:
            stat = f.read()
        for _ in range(2):
            (tmp_path / "stat").write_bytes(stat)
            got = probe._busy_ticks(cpus)
            assert got is not None and got == _busy_reference(stat, cpus)
            assert probe._busy_ticks(cpus[:1]) == _busy_reference(stat, cpus[:1])
        changed += previous is not None and got != previous
        previous = got
        _spin(0.025)
    assert changed > 0       # this process kept a CPU busy: its ticks were counted
