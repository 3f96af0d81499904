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

import kernelrpc
from kernelrpc import nd, rpc
from kernelrpc.compiler import recipes
from kernelrpc.runtime import ProfileResult, cpu, load_module
from kernelrpc.runtime.conditions import ConditionsProbe
from servicectl import SRC


def _affinity():
    return sorted(os.sched_getaffinity(0))


def test_local_measurement_reports_cpus_threads_and_other_processes():
    s, args = recipes.tutorial_schedule("parallel", 64, 64, 64)
    module = kernelrpc.build(s, args, target="llvm", name="gemm").runtime_module
    threads = min(2, len(_affinity()))
    module.set_num_threads(threads)
    a, b = nd.array(np.ones((64, 64), "float32")), nd.array(np.ones((64, 64), "float32"))
    c = nd.empty((64, 64), "float32")
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
