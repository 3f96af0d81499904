"""The proxy's tracker link (the shared registration machine) against a real tracker process."""
from __future__ import annotations

import re
import signal

from conftest import wait_until
from kernelrpc.wire import handshake as hs
from proxy_peers import connect, read_reply, tracker_request, wait_for_matches
from servicectl import free_port, queue, start_tracker


def test_many_devices_are_offered_claimed_and_offered_again_after_a_tracker_restart(start_service, proxy):
    port = free_port()
    tracker = start_tracker(start_service, port)
    p = proxy("--tracker", f"127.0.0.1:{port}")
    devices = [connect(p.address, f"server:{key}") for key in ("ka", "ka", "kb")]
    wait_for_matches(p, r"offered k[ab]:\S+ to the tracker", 3)
    wait_until(lambda: queue(tracker, "ka")["free"] == 2 and queue(tracker, "kb")["free"] == 1)

    handed = tracker_request(tracker.address, "kb")[2]          # a client that never comes
    wait_for_matches(p, rf"the tracker handed out {re.escape(handed)}; waiting for its client")

    tracker.stop(signal.SIGKILL)
    wait_for_matches(p, rf"lost the connection to tracker 127\.0\.0\.1:{port} .*reconnecting")
    tracker = start_tracker(start_service, port)
    wait_for_matches(p, r"registered with tracker .*\(3 devices offered\)")
    # every device is offered again, the one handed out before the restart too, under fresh keys
    wait_until(lambda: queue(tracker, "ka")["free"] == 2 and queue(tracker, "kb")["free"] == 1)
    late = connect(p.address, f"client:{handed}")
    assert read_reply(late)[0].code == hs.RPC_CODE_MISMATCH
    fresh = tracker_request(tracker.address, "kb")[2]
    assert fresh != handed
    client = connect(p.address, f"client:{fresh}")
    assert read_reply(client)[0].ok and read_reply(devices[2])[0].ok
    for sock in devices + [late, client]:
        sock.close()
