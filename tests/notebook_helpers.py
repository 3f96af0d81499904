"""What the notebook tests share: running a notebook in a real kernel, and a request that
waits in the tracker's queue behind a holder."""
import threading

import pytest

from servicectl import SRC


def run_notebook(nb, tmp_path, timeout: int = 240):
    """Execute ``nb`` in a python3 kernel with ``tmp_path`` as working directory; return it.

    The kernel imports kernelrpc from this tree (``PYTHONPATH`` set to src/).
    """
    nbclient = pytest.importorskip("nbclient")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", SRC)
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(tmp_path)}}).execute()
    return nb


def request_behind(holder, waiter, key: str, timeout: float = 60):
    """Let ``waiter`` request ``key`` while ``holder`` (a session) holds the only board.

    Returns the queue states ``waiter.on_queue_wait`` reported and the session it got once
    the holder closed.
    """
    states, seen, got = [], threading.Event(), {}
    waiter.on_queue_wait = lambda state: (states.append(state), seen.set())
    thread = threading.Thread(target=lambda: got.setdefault("session", waiter.request(key)))
    thread.start()
    try:
        assert seen.wait(30), "the waiting request reported no queue state"
    finally:
        holder.close()
        thread.join(timeout)
    assert not thread.is_alive(), "the waiting request got no board after the holder closed"
    return states, got["session"]
