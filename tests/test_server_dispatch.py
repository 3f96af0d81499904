"""The listener's event dispatch: an event made stale by an earlier callback of the same select()
is skipped, not run on a closed socket (which ended the server with a KeyError)."""
import selectors
import socket

from kernelrpc.server.listener import dispatch


def _readable_pair():
    a, b = socket.socketpair()
    b.sendall(b"x")
    return a, b


def test_every_live_event_runs_once():
    selector = selectors.DefaultSelector()
    pairs = [_readable_pair() for _ in range(3)]
    ran = []
    for a, _ in pairs:
        selector.register(a, selectors.EVENT_READ, lambda s: ran.append(s.recv(1) and s))
    try:
        dispatch(selector, selector.select(5))
        assert sorted(s.fileno() for s in ran) == sorted(a.fileno() for a, _ in pairs)
    finally:
        selector.close()
        for pair in pairs:
            for s in pair:
                s.close()


def test_an_event_whose_socket_an_earlier_callback_unregistered_and_closed_is_skipped():
    selector = selectors.DefaultSelector()
    (a, a_peer), (b, b_peer) = _readable_pair(), _readable_pair()
    ran = []

    def first(sock):            # whichever runs first hands the other one off
        ran.append(sock)
        other = b if sock is a else a
        selector.unregister(other)
        other.close()

    selector.register(a, selectors.EVENT_READ, first)
    selector.register(b, selectors.EVENT_READ, first)
    try:
        events = selector.select(5)
        assert len(events) == 2
        dispatch(selector, events)
        assert len(ran) == 1
    finally:
        selector.close()
        for s in (a, a_peer, b, b_peer):
            s.close()


def test_an_event_of_a_file_registered_again_under_a_new_key_is_skipped():
    """(A plain socket replaced by its TLS socket on the same descriptor: the old key's event is
    stale; the new key gets its own event from the next select().)"""
    selector = selectors.DefaultSelector()
    (a, a_peer), (b, b_peer) = _readable_pair(), _readable_pair()
    ran = []

    def replace_other(sock):
        sock.recv(1)
        ran.append(sock)
        other = b if sock is a else a
        selector.unregister(other)
        selector.register(other, selectors.EVENT_READ, lambda s: ran.append("new key"))

    selector.register(a, selectors.EVENT_READ, replace_other)
    selector.register(b, selectors.EVENT_READ, replace_other)
    try:
        dispatch(selector, selector.select(5))
        assert len(ran) == 1
        dispatch(selector, selector.select(5))
        assert ran[1:] == ["new key"]
    finally:
        selector.close()
        for s in (a, a_peer, b, b_peer):
            s.close()
