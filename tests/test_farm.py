"""A board farm: ``python -m kernelrpc.model NET --all-devices`` on real device servers behind a real
tracker, and what each board reports about itself and its state."""
import io
import json
import subprocess
import sys

import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
import numpy as np  # noqa: E402

from conftest import wait_until  # noqa: E402
from kernelrpc.display import time_unit  # noqa: E402
from kernelrpc.results import store, trust  # noqa: E402
from kernelrpc.runtime import device_info  # noqa: E402
from servicectl import child_env, queue, start_server  # noqa: E402


@pytest.fixture(scope="module")
def tiny_net(tmp_path_factory):
    """Conv + Relu + Gemm on a 1x3x8x8 input: built in well under a second."""
    rng = np.random.default_rng(1)
    weights = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype("float32"), "w"),
               numpy_helper.from_array(rng.standard_normal((10, 256)).astype("float32"), "fc")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], weights)
    path = tmp_path_factory.mktemp("net") / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def run_model(*args, cwd):
    env = child_env()
    env["XDG_CACHE_HOME"] = str(cwd / "cache")
    return subprocess.run([sys.executable, "-m", "kernelrpc.model", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


def test_all_devices_measures_every_board_of_two_keys_at_once(tiny_net, tmp_path, start_service, tracker):
    for key in ("farm", "farm", "solo"):
        start_server(start_service, tracker, key=key)
    wait_until(lambda: queue(tracker, "farm")["free"] == 2 and queue(tracker, "solo")["free"] == 1,
               what="three servers registered")
    db = tmp_path / "farm.sqlite"
    done = run_model(str(tiny_net), "--tracker", f"127.0.0.1:{tracker.port}", "--key", "farm,solo",
                     "--all-devices", "--json", "--db", str(db), "--repeat", "2", "--number", "2",
                     "--runs", "9", "--warmup", "2", "--threads", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    boards = report["boards"]
    assert sorted(b["key"] for b in boards) == ["farm", "farm", "solo"]
    assert len({b["board"] for b in boards}) == 3                    # three servers, one session each
    assert len(report["modules"]) == 1                               # one target: one build
    for board in boards:
        assert board["p50"] <= board["p90"] <= board["p99"] and board["runs"] == 9
        assert board["facts"]["kernelrpc"] and board["facts"]["kernel"] and board["facts"]["emulated"] is False
        assert board["target"] == report["modules"][0]["target"]
        assert board["peak_rss_bytes"] > 1 << 20
        assert board["state"]["before"]["peak_rss_since"] == "reset"
        assert board["onnxruntime"]["outputs"][0]["relative"] < 1e-4
    conn = store.open_db(db, readonly=True)
    rows = store.rows(conn)
    conn.close()
    assert len(rows) == 3 and len({r["run"] for r in rows}) == 1
    assert {r["board"] for r in rows} == {b["board"] for b in boards}
    assert {r["build_hash"] for r in rows} == {report["modules"][0]["sha256"]}
    ax = _plotted(rows)
    unit, scale = time_unit(max(r["p50"] for r in rows))
    assert [b.get_width() for b in ax.patches] == pytest.approx([r["p50"] / scale for r in rows])
    assert ax.get_xlabel().startswith(f"latency ({unit})")
    assert [t.get_text().split()[0] for t in ax.get_yticklabels()] == [r["key"] for r in rows]
    assert not any(b.get_hatch() for b in ax.patches)              # no emulated board here

    text = run_model(str(tiny_net), "--tracker", f"127.0.0.1:{tracker.port}", "--key", "farm",
                     "--all-devices", "--db", str(db), "--repeat", "1", "--number", "1", "--runs", "3",
                     "--no-check", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert text.stdout.count("ran on       key 'farm'") == 2 and "2 boards side by side" in text.stdout
    assert "p50" in text.stdout and "peak resident" in text.stdout
    listed = subprocess.run([sys.executable, "-m", "kernelrpc.results", "--db", str(db), "--json"],
                            capture_output=True, text=True, timeout=60, env=child_env())
    assert len(json.loads(listed.stdout)["runs"]) == 5


def _plotted(rows):
    """The boards' plot, drawn off screen (``kernelrpc.results.plot_boards``)."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    from kernelrpc.results import plot_boards

    ax = plot_boards(rows)
    ax.figure.savefig(io.BytesIO(), format="png")
    return ax


def test_a_key_no_server_has_names_the_keys_that_have_servers(tiny_net, tmp_path, start_service, tracker):
    start_server(start_service, tracker, key="present")
    wait_until(lambda: queue(tracker, "present")["free"] == 1, what="the server registered")
    done = run_model(str(tiny_net), "--tracker", f"127.0.0.1:{tracker.port}", "--key", "present,absent",
                     "--all-devices", "--no-db", cwd=tmp_path)
    assert done.returncode == 1
    assert "no server has key 'absent'" in done.stderr and "keys with servers: present" in done.stderr
    waited = run_model(str(tiny_net), "--tracker", f"127.0.0.1:{tracker.port}", "--key", "absent",
                       "--request-timeout", "1", "--no-db", cwd=tmp_path)
    assert waited.returncode == 1 and "within 1 s" in waited.stderr and "absent" in waited.stderr
    error = waited.stderr.strip().splitlines()[-1]                 # the command's one-line error
    assert error.startswith("kernelrpc.model: error:") and "keys with servers: present" in error


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_board_state_reads_what_sys_exposes_and_tolerates_what_it_does_not(tmp_path):
    sys_root = tmp_path / "sys"
    for cpu, (cur, governor) in enumerate([(1_500_000, "ondemand"), (600_000, "ondemand")]):
        base = sys_root / f"devices/system/cpu/cpu{cpu}/cpufreq"
        _write(base / "scaling_governor", governor + "\n")
        _write(base / "scaling_cur_freq", f"{cur}\n")
        _write(base / "scaling_min_freq", "600000\n")
        _write(base / "scaling_max_freq", "1500000\n")
    _write(sys_root / "class/thermal/thermal_zone0/temp", "83500\n")
    _write(sys_root / "class/thermal/thermal_zone0/type", "cpu-thermal\n")
    _write(sys_root / "class/thermal/thermal_zone1/temp", "garbage\n")
    _write(sys_root / "devices/platform/soc/soc:firmware/get_throttled", "0x50005\n")
    state = device_info.board_state(sys_root=str(sys_root))
    assert state["governor"] == "ondemand" and state["cur_mhz"] == [600.0, 1500.0]
    assert state["min_mhz"] == 600.0 and state["max_mhz"] == 1500.0
    assert state["temp_c"] == 83.5 and state["zones_c"] == {"thermal_zone0:cpu-thermal": 83.5}
    assert state["throttled_now"] == ["under-voltage", "throttled"]
    assert state["throttled_since_boot"] == ["under-voltage", "throttled"]
    assert state["peak_rss_bytes"] > 0
    flags = trust.flags({"emulated": True}, state, state)
    assert flags == [trust.EMULATED, "hot: 84 °C", "throttled: throttled, under-voltage"]
    assert "600-1500 MHz (range 600-1500)" in trust.state_text(state)

    bare = device_info.board_state(sys_root=str(tmp_path / "nothing"), proc_root=str(tmp_path / "noproc"))
    assert set(bare) <= {"peak_rss_bytes", "peak_rss_since"}
    assert trust.state_text(bare) == "no frequency, temperature or throttling exposed"
    assert trust.flags({}, {"throttle_events": 3}, {"throttle_events": 5}) == [
        "throttled: 2 thermal throttling events during the run"]


def test_percentiles_are_numpys():
    samples = list(np.random.default_rng(3).exponential(size=37))
    got = trust.percentiles(samples)
    assert got == pytest.approx({f"p{p}": np.percentile(samples, p) for p in (50, 90, 99)})
    with pytest.raises(ValueError):
        trust.percentiles([])


def test_the_status_page_shows_the_latest_result_per_board(tmp_path, start_service):
    pytest.importorskip("tornado")
    pytest.importorskip("prometheus_client")
    import urllib.request

    db = tmp_path / "farm.sqlite"
    conn = store.open_db(db)
    for recorded, board, p50 in [(1.0, "10.0.0.5:9090", 0.010), (2.0, "10.0.0.5:9090", 0.012),
                                 (3.0, "10.0.0.6:9090", 0.030)]:
        store.insert(conn, {"run": "r", "recorded": recorded, "model": "net.onnx", "model_hash": "a",
                            "build_hash": "b", "key": "rpi4", "board": board, "p50": p50,
                            "flags": ["hot: 85 °C"] if board.endswith("6:9090") else []})
    conn.close()
    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--web-port", "0", "--db", str(db)])
    page = tracker.wait_for_line(r"status page on http://").split("status page on ", 1)[1].strip()
    with urllib.request.urlopen(page + "api/status", timeout=10) as response:
        results = json.loads(response.read())["results"]
    assert [(r["board"], r["p50"], r["flags"]) for r in results] == [
        ("10.0.0.5:9090", 0.012, []), ("10.0.0.6:9090", 0.030, ["hot: 85 °C"])]
    with urllib.request.urlopen(page, timeout=10) as response:
        assert "Latest result per board" in response.read().decode()
    db.write_bytes(b"garbage" * 100)
    with urllib.request.urlopen(page + "api/status", timeout=10) as response:
        assert "is not a kernelrpc results database" in json.loads(response.read())["results_error"]
    refused = subprocess.run([sys.executable, "-m", "kernelrpc.tracker", "--port", "0", "--db", str(db)],
                             capture_output=True, text=True, timeout=60, env=child_env())
    assert refused.returncode == 2 and "give --web-port too" in refused.stderr


def test_a_board_killed_during_the_run_is_reported_and_the_others_go_on(tiny_net, tmp_path, start_service,
                                                                          tracker):
    servers = [start_server(start_service, tracker, key="shelf") for _ in range(2)]
    wait_until(lambda: queue(tracker, "shelf")["free"] == 2, what="both servers registered")
    env = child_env({"XDG_CACHE_HOME": str(tmp_path / "cache")})
    db = tmp_path / "farm.sqlite"
    proc = subprocess.Popen([sys.executable, "-m", "kernelrpc.model", str(tiny_net), "--tracker",
                             f"127.0.0.1:{tracker.port}", "--key", "shelf", "--all-devices", "--db", str(db),
                             "--no-check", "--repeat", "1", "--number", "1", "--runs", "3"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        for line in proc.stdout:
            if line.startswith("boards "):           # sessions open, nothing measured yet
                break
        victim = next(s for s in servers if f":{s.port}" in line)
        victim.proc.kill()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert f"board 127.0.0.1:{victim.port} (key 'shelf') FAILED" in out and "1 board side by side" in out
    conn = store.open_db(db, readonly=True)
    assert [r["board"] for r in store.rows(conn)] != [f"127.0.0.1:{victim.port}"]
    assert len(store.rows(conn)) == 1
    conn.close()
