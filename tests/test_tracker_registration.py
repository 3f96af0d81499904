"""TrackerRegistration (the device server's tracker link) against our tracker process."""
import logging
import os
import selectors
import socket
import time

import pytest

from conftest import wait_until
from kernelrpc.rpc.tracker_client import connect_tracker
from kernelrpc.runtime import device_info
from kernelrpc.wire.registration import State
from kernelrpc.server.registration import TrackerRegistration
from servicectl import free_port


def drive(regs, until, timeout=15.0):
    """Run the registrations on their own selectors until ``until()`` holds."""
    regs = regs if isinstance(regs, list) else [regs]

    def tick_due():
        for reg in regs:
            reg.tick()
        return False

    wait_until(lambda: until() or tick_due(), timeout=timeout,
               what=f"the registration condition at {os.path.basename(until.__code__.co_filename)}:"
                    f"{until.__code__.co_firstlineno}")


@pytest.fixture
def registration():
    made = []

    def make(*args, **kwargs):
        reg = TrackerRegistration(*args, **kwargs)
        made.append(reg)
        return reg

    yield make
    for reg in made:
        reg.close()


def summary(tracker):
    with connect_tracker(*tracker.address) as session:
        return session.summary()


def test_registers_and_cycles_match_keys(tracker, registration, caplog):
    caplog.set_level(logging.INFO, "kernelrpc.server.registration")
    reg = registration(tracker.address, "board", 9999)
    drive(reg, lambda: reg.registered)
    assert f"registered key board at tracker 127.0.0.1:{tracker.port}, advertised 127.0.0.1:9999" in caplog.text
    info = summary(tracker)
    assert info["server_info"] == [{"key": "server:board", "addr": ["127.0.0.1", 9999], "session": "idle",
                                    "protocol": "kernelrpc/1", "device": device_info.describe()}]
    assert info["queue_info"]["board"] == {"free": 1, "pending": 0}
    with connect_tracker(*tracker.address) as session:
        first = session.request_address("board", timeout=5)
        assert first == ("127.0.0.1", 9999, reg.matchkey)
        reg.session_started()
        assert reg.matchkey != first[2]
        drive(reg, lambda: summary(tracker)["server_info"][0]["session"] == "active")
        reg.session_finished()
        drive(reg, lambda: summary(tracker)["queue_info"]["board"]["free"] == 1)
        assert summary(tracker)["server_info"][0]["session"] == "idle"
        second = session.request_address("board", timeout=5)
        assert second[2] == reg.matchkey and second[2] != first[2]


def test_unused_key_is_rotated(tracker, registration):
    reg = registration(tracker.address, "k", 1234, "10.1.2.3", poll_interval=0.05)
    drive(reg, lambda: reg.registered)
    with connect_tracker(*tracker.address) as session:
        host, port, taken = session.request_address("k", timeout=5)
        assert (host, port) == ("10.1.2.3", 1234)
        drive(reg, lambda: reg.matchkey != taken)               # four polls without the key
        assert session.request_address("k", timeout=5)[2] == reg.matchkey


def test_reconnects_after_tracker_restart(start_service, registration, caplog):
    caplog.set_level(logging.INFO, "kernelrpc.server.registration")
    port = free_port()
    args = ["--port", str(port), "--port-end", str(port + 1)]
    tracker = start_service("kernelrpc.tracker", args)
    regs = [registration(tracker.address, "k", 7000 + i) for i in range(3)]
    drive(regs, lambda: all(r.registered for r in regs))
    tracker.stop()
    drive(regs, lambda: not any(r.registered for r in regs))
    assert "lost the connection to tracker" in caplog.text
    drive(regs, lambda: "cannot reach tracker" in caplog.text)
    tracker = start_service("kernelrpc.tracker", args)
    drive(regs, lambda: all(r.registered for r in regs))
    info = summary(tracker)
    assert info["queue_info"]["k"] == {"free": 3, "pending": 0}
    assert sorted(s["addr"][1] for s in info["server_info"]) == [7000, 7001, 7002]


def test_not_a_tracker_is_reported(registration, caplog):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    reg = registration(listener.getsockname(), "k", 1)
    drive(reg, lambda: reg.state is State.OPENING)
    conn, _ = listener.accept()
    assert conn.recv(4) == bytes.fromhex("71f20200")
    conn.sendall(b"HTTP/1.0 400\r\n")
    drive(reg, lambda: "is not a tracker" in caplog.text)
    conn.close()
    listener.close()


def test_attached_selector_wakes_the_loop_instead_of_polling(tracker, registration):
    selector = selectors.DefaultSelector()
    reg = registration(tracker.address, "sel", 9999, poll_interval=60)
    reg.attach(selector)

    def turn():
        timeout = max(0.0, reg.next_deadline() - time.monotonic())
        for key, _ in selector.select(min(timeout, 0.05)):
            key.data(key.fileobj)
        reg.tick()
        return reg.registered

    wait_until(turn, timeout=15, what="registration through the attached selector")
    assert len(selector.get_map()) == 1                    # the tracker socket, in the caller's selector
    assert reg.next_deadline() - time.monotonic() > 50     # the next wake-up is the poll, not a 5 ms tick
    with connect_tracker(*tracker.address) as session:
        assert session.summary()["queue_info"]["sel"] == {"free": 1, "pending": 0}
    reg.close()
    assert len(selector.get_map()) == 0
    selector.close()
