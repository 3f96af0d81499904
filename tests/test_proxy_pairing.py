"""The proxy's pure matchmaker: who is paired with whom, without sockets."""
from hypothesis import given, strategies as st

from kernelrpc.proxy.pairing import Matchmaker


def test_devices_with_one_key_queue_oldest_first():
    mm = Matchmaker()
    d1, out1 = mm.add_device("d1", "server:k", "k")
    d2, out2 = mm.add_device("d2", "server:k", "k")
    assert out1.action == out2.action == "wait" and d1.matchkey != d2.matchkey
    assert d1.matchkey.startswith("k:0.")
    assert mm.add_client("c1", "client:k", "k")[1].partner is d1
    assert mm.add_client("c2", "client:k", "k")[1].partner is d2
    assert mm.add_client("c3", "client:k", "k")[1].action == "wait"


def test_a_device_promised_to_a_tracker_client_is_picked_last():
    promised = set()
    mm = Matchmaker(promised=lambda device: device in promised)
    d1, _ = mm.add_device("d1", "server:k", "k")
    d2, _ = mm.add_device("d2", "server:k", "k")
    promised.add(d1)
    assert mm.add_client("c", "client:k", "k")[1].partner is d2
    assert mm.add_client("t", f"client:{d1.matchkey}", d1.matchkey)[1].partner is d1


def test_renamed_and_removed_keys_answer_mismatch():
    mm = Matchmaker()
    d, _ = mm.add_device("d", "server:k", "k")
    old = d.matchkey
    assert mm.rename(d) != old
    assert mm.add_client("c", "", old)[1].action == "mismatch"
    assert mm.remove(d) and not mm.remove(d)
    assert mm.add_client("c", "", d.matchkey)[1].action == "mismatch"
    assert mm.device_keys() == [] and mm.waiting_counts() == (0, 0)


def test_waiting_clients_are_served_in_order_and_bounded():
    mm = Matchmaker(max_waiting_per_key=2)
    c1, _ = mm.add_client("c1", "client:k", "k")
    c2, _ = mm.add_client("c2", "client:k", "k")
    assert mm.add_client("c3", "client:k", "k")[1].action == "duplicate"
    assert mm.add_device("d1", "server:k", "k")[1].partner is c1
    assert mm.remove(c2)
    assert mm.add_device("d2", "server:k", "k")[1].action == "wait"


@given(st.lists(st.tuples(st.sampled_from(["device", "client", "drop"]),
                          st.sampled_from(["a", "b"])), max_size=60))
def test_nobody_is_paired_twice_and_counts_add_up(ops):
    mm = Matchmaker()
    live, paired = [], set()
    for i, (kind, key) in enumerate(ops):
        if kind == "drop":
            if live:
                mm.remove(live.pop(0))
            continue
        add = mm.add_device if kind == "device" else mm.add_client
        waiter, outcome = add(i, f"{kind}:{key}", key)
        if outcome.action == "pair":
            assert outcome.partner.is_device != waiter.is_device
            assert outcome.partner.handle not in paired
            paired.add(outcome.partner.handle)
            live.remove(outcome.partner)
        else:
            assert outcome.action == "wait"
            live.append(waiter)
    devices, clients = mm.waiting_counts()
    assert devices == sum(w.is_device for w in live) and clients == len(live) - devices
    for key in "ab":
        kinds = {w.is_device for w in live if w.wanted == key}
        assert len(kinds) <= 1, "a device and a client with the same key were left waiting"
