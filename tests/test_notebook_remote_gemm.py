"""examples/remote_gemm.ipynb, executed with nbclient and ipykernel against a real tracker and
device server, and its outputs checked (tables, figures, numbers)."""
import html
import math
import re
import socket
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

from kernelrpc.compiler import recipes  # noqa: E402
from notebook_helpers import run_notebook  # noqa: E402
from servicectl import SRC  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "remote_gemm.ipynb"
SIZE = 48  # small, and not a multiple of the block sizes (tails are guarded)


def _outputs(cell, mime):
    return [out["data"][mime] for out in cell.get("outputs", [])
            if out.get("output_type") in ("execute_result", "display_data") and mime in out["data"]]


def _cell(nb, marker):
    return next(c for c in nb.cells if c.cell_type == "code" and marker in c.source)


def _table_rows(markup: str) -> list[list[str]]:
    rows = re.findall(r"<tr>(.*?)</tr>", markup, re.S)
    return [[html.unescape(c) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", r, re.S)] for r in rows]


@pytest.fixture
def executed(start_service, monkeypatch, tmp_path):
    tracker = start_service("kernelrpc.tracker", ["--host", "127.0.0.1", "--port", "0"])
    server = start_service("kernelrpc.server", ["--host", "127.0.0.1", "--port", "0", "--key", "nb",
                                                "--tracker", f"{tracker.host}:{tracker.port}"])
    server.wait_for_line("registered")
    monkeypatch.setenv("KERNELRPC_TRACKER", f"{tracker.host}:{tracker.port}")
    monkeypatch.setenv("KERNELRPC_KEY", "nb")
    monkeypatch.setenv("KERNELRPC_GEMM_SIZE", str(SIZE))
    nb = run_notebook(nbformat.read(NOTEBOOK, as_version=4), tmp_path)
    nbformat.write(nb, tmp_path / "remote_gemm.executed.ipynb")  # to look at after a failure
    return nb, server


def test_remote_gemm_notebook_runs_and_shows_checked_measurements(executed):
    nb, server = executed
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors

    # the tracker's table names the device server that registered
    (summary,) = _outputs(_cell(nb, "tracker.summary_table()"), "text/html")
    assert f"127.0.0.1:{server.port}" in summary and "<table>" in summary

    # one step in detail: HTML with the statistics and the device's conditions
    (detail,) = _outputs(next(c for c in nb.cells if c.cell_type == "code"
                              and c.source.strip() == 'results["register_blocked"]'), "text/html")
    assert "Execution time summary (gemm" in detail and "device: CPUs" in detail
    assert "GFLOP/s" in detail

    # plot of every repeat, and the bar chart of GFLOP/s per step
    assert _outputs(_cell(nb, ".plot();"), "image/png")
    assert _outputs(_cell(nb, "ax.bar("), "image/png")

    # the comparison table: every step, a positive finite GFLOP/s each, checked against numpy
    (table,) = _outputs(_cell(nb, "display.compare("), "text/html")
    rows = _table_rows(table)
    header, body = rows[0], rows[1:]
    steps = [*recipes.TUTORIAL_STEPS, "register_blocked"]
    assert [r[0] for r in body] == steps
    rate = header.index("GFLOP/s")
    for row in body:
        value = float(row[rate])
        assert math.isfinite(value) and value > 0
        assert row[header.index("device")] in ("clean", "disturbed")
    error = re.search(r"max relative error of any step: ([0-9.e+-]+)", table)
    assert error and float(error.group(1)) < 1e-4
    assert f"GEMM {SIZE}x{SIZE}x{SIZE}" in table


def _closed_port() -> int:
    """A loopback port nothing listens on (the OS chose it, and it was closed again)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_with_no_tracker_the_notebook_starts_a_local_fleet_says_so_and_stops_it(monkeypatch, tmp_path):
    port = _closed_port()
    monkeypatch.setenv("KERNELRPC_TRACKER", f"127.0.0.1:{port}")
    monkeypatch.setenv("KERNELRPC_KEY", "fresh")
    monkeypatch.setenv("KERNELRPC_GEMM_SIZE", "32")
    nb = run_notebook(nbformat.read(NOTEBOOK, as_version=4), tmp_path)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    cell = _cell(nb, "tracker.summary_table()")
    said = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
    match = re.search(rf"cannot reach tracker at 127\.0\.0\.1:{port}: .*: started a local tracker at "
                      r"127\.0\.0\.1:(\d+) and 1 device server with key 'fresh'", said)
    assert match, said
    (summary,) = _outputs(cell, "text/html")
    assert "fresh" in summary
    (table,) = _outputs(_cell(nb, "display.compare("), "text/html")
    assert "GEMM 32x32x32" in table
    # the last cell closed the session, and the local tracker with it
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", int(match.group(1))), timeout=5).close()


def test_progress_is_the_notebook_widget_in_jupyter(tmp_path):
    pytest.importorskip("ipywidgets")
    pytest.importorskip("tqdm")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import sys; sys.path.insert(0, %r)\n"
        "from kernelrpc import display\n"
        "print(display.in_notebook(), display.progress_enabled())\n"
        "bar = display.byte_progress(8 << 20, 'upload gemm.so')\n"
        "bar.update(8 << 20); bar.close()" % SRC)]
    run_notebook(nb, tmp_path, timeout=120)
    outputs = nb.cells[0].outputs
    assert any(o.get("text", "").strip() == "True True" for o in outputs)
    widgets = [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert widgets, outputs
