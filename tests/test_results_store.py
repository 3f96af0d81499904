"""The results database: its schema, its checks, concurrent writers, and ``python -m kernelrpc.results``."""
import json
import sqlite3
import subprocess
import sys

import pytest

from kernelrpc.results import compare, store
from servicectl import child_env


def _row(**over):
    row = {"run": "r1", "model": "net.onnx", "model_hash": "ab" * 32, "build_hash": "cd" * 32,
           "target": "llvm -mtriple=aarch64-linux-gnu", "key": "rpi4", "board": "10.0.0.5:9090",
           "machine": "aarch64", "cpu_model": "Cortex-A72", "cpus": 4, "emulated": False,
           "p50": 0.010, "p90": 0.011, "p99": 0.012, "runs": 50, "peak_rss_bytes": 50 << 20,
           "max_relative_error": 1e-6, "flags": [], "facts": {"kernel": "6.6"},
           "state": {"before": {}, "after": {}}}
    row.update(over)
    return row


def results(*args):
    return subprocess.run([sys.executable, "-m", "kernelrpc.results", *args], capture_output=True,
                          text=True, timeout=60, env=child_env())


def test_rows_round_trip_with_the_schema_recorded(tmp_path):
    path = tmp_path / "sub" / "r.sqlite"
    with store.open_db(path) as conn:
        first = store.insert(conn, _row(recorded=100.0))
        store.insert(conn, _row(recorded=200.0, board="10.0.0.6:9090", p50=0.02, flags=["hot: 85 °C"]))
        assert dict(conn.execute("SELECT name, value FROM meta")) == {"schema": store.SCHEMA,
                                                                      "version": str(store.VERSION)}
    conn = store.open_db(path, readonly=True)
    got = store.rows(conn)
    assert [r["id"] for r in got] == [first, first + 1]
    assert got[1]["flags"] == ["hot: 85 °C"] and got[0]["facts"] == {"kernel": "6.6"}
    assert got[0]["emulated"] == 0 and got[0]["p50"] == 0.010
    assert [r["board"] for r in store.rows(conn, board="10.0.0.6:9090")] == ["10.0.0.6:9090"]
    assert len(store.rows(conn, model="abab")) == 2 and store.rows(conn, model="zz") == []
    assert [r["board"] for r in store.latest_per_board(conn)] == ["10.0.0.5:9090", "10.0.0.6:9090"]
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("DELETE FROM runs")                      # the readers cannot write
    conn.close()


def test_what_is_not_a_results_database_is_refused_by_name(tmp_path):
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database at all" * 100)
    with pytest.raises(store.ResultsError, match="garbage.sqlite is not a kernelrpc results database"):
        store.open_db(garbage)
    foreign = tmp_path / "foreign.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE photos (id INTEGER)")
    with pytest.raises(store.ResultsError, match="SQLite database of something else .tables: photos"):
        store.open_db(foreign)
    newer = tmp_path / "newer.sqlite"
    store.open_db(newer).close()
    with sqlite3.connect(newer) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE name = 'version'")
    with pytest.raises(store.ResultsError, match="schema version '99'; this kernelrpc reads versions up to 1"):
        store.open_db(newer, readonly=True)
    with pytest.raises(store.ResultsError, match="no results database at"):
        store.open_db(tmp_path / "missing.sqlite", readonly=True)
    done = results("--db", str(garbage))
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1
    assert "is not a kernelrpc results database" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("field,value,message", [
    ("p50", float("nan"), "finite number"), ("p99", -1.0, "finite number"), ("board", "x" * 2000, "at most"),
    ("cpus", -3, "integer >= 0"), ("flags", "hot", "JSON list"), ("facts", {"x": "y" * 70000}, "bytes of JSON"),
    ("model_hash", None, "missing"), ("colour", "red", "unknown result fields")])
def test_an_invalid_row_is_refused_and_nothing_is_written(tmp_path, field, value, message):
    with store.open_db(tmp_path / "r.sqlite") as conn:
        with pytest.raises(store.ResultsError, match=message):
            store.insert(conn, _row(**{field: value}))
        assert conn.execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)


def test_a_row_edited_by_hand_is_reported_when_read(tmp_path):
    path = tmp_path / "r.sqlite"
    with store.open_db(path) as conn:
        store.insert(conn, _row())
        conn.execute("UPDATE runs SET flags = '{\"not\": \"a list\"}'")
    with pytest.raises(store.ResultsError, match="row 1: field 'flags' is not a JSON list"):
        store.rows(store.open_db(path, readonly=True))


def test_two_writers_at_once_lose_nothing(tmp_path):
    path = tmp_path / "shared.sqlite"
    writer = ("import sys; from kernelrpc.results import store\n"
              "conn = store.open_db(sys.argv[1])\n"
              "for i in range(40):\n"
              "    store.insert(conn, {'run': sys.argv[2], 'model_hash': 'a', 'build_hash': 'b', 'board': sys.argv[2],"
              " 'p50': 0.001 * (i + 1)})\n")
    procs = [subprocess.Popen([sys.executable, "-c", writer, str(path), name], env=child_env())
             for name in ("w1", "w2")]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    rows = store.rows(store.open_db(path, readonly=True))
    assert sorted((r["run"], r["p50"]) for r in rows) == sorted(
        (name, 0.001 * (i + 1)) for name in ("w1", "w2") for i in range(40))


def test_regressions_are_changes_beyond_the_earlier_runs_spread():
    def row(board, p50, n):
        return {**_row(board=board, p50=p50), "id": n, "recorded": float(n)}

    steady = [row("a", p, i) for i, p in enumerate([1.00, 1.04, 0.98, 1.03])]
    slower = [row("b", p, 10 + i) for i, p in enumerate([1.00, 1.02, 0.99, 1.50])]
    faster = [row("c", p, 20 + i) for i, p in enumerate([1.00, 1.02, 0.60])]
    young = [row("d", p, 30 + i) for i, p in enumerate([1.00, 3.00])]
    found = {f["board"]: f for f in compare.regressions(steady + slower + faster + young)}
    assert set(found) == {"b", "c"}
    assert found["b"]["kind"] == "regression" and found["b"]["baseline_p50"] == 1.00
    assert found["b"]["spread"] == pytest.approx(0.03) and found["b"]["change"] == pytest.approx(0.5)
    assert found["c"]["kind"] == "improvement"
    boards = compare.side_by_side(steady + slower)
    assert [b["board"] for b in boards[0]["boards"]] == ["a", "b"] and boards[0]["boards"][1]["p50"] == 1.50


def test_the_command_lists_compares_and_fails_on_a_regression(tmp_path):
    path = tmp_path / "r.sqlite"
    with store.open_db(path) as conn:
        for n, p50 in enumerate([0.010, 0.0102, 0.0099, 0.020]):
            store.insert(conn, _row(recorded=1000.0 + n, p50=p50))
        store.insert(conn, _row(recorded=2000.0, board="emu", emulated=True, flags=["emulated: not the board's speed"]))
    done = results("--db", str(path))
    assert done.returncode == 0, done.stderr
    assert "5 runs:" in done.stdout and "the newest run on each board" in done.stdout
    assert "REGRESSION: net.onnx on 10.0.0.5:9090: p50 20.000 ms against 10.000 ms" in done.stdout
    assert "emulated: not the board's speed" in done.stdout
    report = json.loads(results("--db", str(path), "--json").stdout)
    assert len(report["runs"]) == 5 and report["regressions"][0]["kind"] == "regression"
    assert {b["board"] for b in report["boards"][0]["boards"]} == {"10.0.0.5:9090", "emu"}
    lines = results("--db", str(path), "--csv", "--board", "emu").stdout.splitlines()
    assert lines[0].startswith("id,run,recorded,model,") and len(lines) == 2
    assert results("--db", str(path), "--fail-on-regression").returncode == 3
    bad = results("--db", str(path), "--limit", "0")
    assert bad.returncode == 1 and "limit must be in" in bad.stderr


def test_the_default_database_is_in_kernelrpcs_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("KERNELRPC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert store.default_path() == tmp_path / "kernelrpc" / "results.sqlite"
    monkeypatch.setenv("KERNELRPC_CACHE_DIR", str(tmp_path / "own"))
    assert store.default_path() == tmp_path / "own" / "results.sqlite"
