"""examples/remote_model.ipynb, executed with nbclient and ipykernel: once against a real
tracker and device server, once with no tracker reachable (it starts its own)."""
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")
pytest.importorskip("onnx")

from notebook_helpers import run_notebook  # noqa: E402
from servicectl import free_port  # noqa: E402

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "remote_model.ipynb"


def _outputs(cell, kind):
    return [o for o in cell.get("outputs", []) if o.get("output_type") == kind]


def _check(nb):
    errors = [o for c in nb.cells for o in _outputs(c, "error")]
    assert not errors, errors
    text = "".join(o.get("text", "") for c in nb.cells for o in _outputs(c, "stream"))
    assert "kernel calls" in text and "top-5 classes" in text
    assert "top-5 classes: [0 1 2 3 4]" not in text     # seeded weights: the outputs differ
    assert "agreement with onnxruntime" in text or "onnxruntime is not installed" in text
    html = [o["data"]["text/html"] for c in nb.cells for o in _outputs(c, "execute_result")
            if "text/html" in o.get("data", {})]
    assert any("Execution time summary" in h for h in html)
    assert any("Per-layer profile" in h and "Conv" in h for h in html)
    plots = [o for c in nb.cells for o in _outputs(c, "display_data") if "image/png" in o.get("data", {})]
    assert len(plots) == 2                               # the layers, and the boards side by side
    assert "1 board side by side" in text and "p50" in text
    return text


def test_the_notebook_on_a_device_of_a_tracker(start_service, monkeypatch, tmp_path):
    tracker = start_service("kernelrpc.tracker", ["--port", "0"])
    server = start_service("kernelrpc.server", ["--port", "0", "--key", "nbnet",
                                                "--tracker", f"{tracker.host}:{tracker.port}"])
    server.wait_for_line("registered")
    monkeypatch.setenv("KERNELRPC_TRACKER", f"{tracker.host}:{tracker.port}")
    monkeypatch.setenv("KERNELRPC_KEY", "nbnet")
    nb = run_notebook(nbformat.read(NOTEBOOK, as_version=4), tmp_path, timeout=300)
    nbformat.write(nb, tmp_path / "remote_model.executed.ipynb")
    text = _check(nb)
    assert "started a local tracker" not in text


def test_the_notebook_with_no_tracker_starts_its_own(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELRPC_TRACKER", f"127.0.0.1:{free_port()}")
    nb = run_notebook(nbformat.read(NOTEBOOK, as_version=4), tmp_path, timeout=300)
    assert "started a local tracker" in _check(nb)
