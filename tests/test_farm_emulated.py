"""``--all-devices`` over a host board and an emulated aarch64 board: two targets, two builds, and the
emulated board's timings labelled as not the board's speed."""
import json
import subprocess
import sys

import pytest

pytest.importorskip("onnx")
from conftest import wait_until  # noqa: E402
from emulated_boards import need_qemu, start_board  # noqa: E402
from kernelrpc.results import trust  # noqa: E402
from servicectl import child_env, queue, start_server  # noqa: E402
from test_farm import _plotted, tiny_net  # noqa: E402,F401 - the fixture

pytestmark = pytest.mark.cross


def test_a_host_board_and_an_emulated_board_each_get_their_build(tiny_net, tmp_path, start_service,  # noqa: F811
                                                                  tracker):
    need_qemu("aarch64")
    start_server(start_service, tracker, key="shelf-host")
    board = start_board("aarch64", tracker.port, "shelf-arm")
    try:
        wait_until(lambda: queue(tracker, "shelf-host")["free"] == 1 and queue(tracker, "shelf-arm")["free"] == 1,
                   what="both boards registered")
        done = subprocess.run([sys.executable, "-m", "kernelrpc.model", str(tiny_net), "--tracker",
                               f"127.0.0.1:{tracker.port}", "--key", "shelf-host,shelf-arm", "--all-devices",
                               "--json", "--db", str(tmp_path / "r.sqlite"), "--repeat", "1", "--number", "1",
                               "--runs", "3", "--warmup", "1"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=900, env=child_env())
    finally:
        board.stop()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert len(report["modules"]) == 2
    by_key = {b["key"]: b for b in report["boards"]}
    assert by_key["shelf-arm"]["facts"]["emulated"] is True and trust.EMULATED in by_key["shelf-arm"]["flags"]
    assert by_key["shelf-arm"]["target"].startswith("llvm -mtriple=aarch64-linux-gnu")
    assert by_key["shelf-host"]["facts"]["emulated"] is False and trust.EMULATED not in by_key["shelf-host"]["flags"]
    assert by_key["shelf-arm"]["onnxruntime"]["outputs"][0]["relative"] < 1e-4
    ax = _plotted(report["boards"])
    hatched = {t.get_text().split()[0]: bool(b.get_hatch()) for t, b in zip(ax.get_yticklabels(), ax.patches)}
    assert hatched == {"shelf-arm": True, "shelf-host": False}
    assert trust.EMULATED in [t.get_text() for t in ax.get_legend().get_texts()]
