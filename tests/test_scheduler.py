"""The tracker's pure matching logic, driven with explicit times."""
from hypothesis import given, settings, strategies as st

import pytest

from kernelrpc.errors import ProtocolError
from kernelrpc.tracker.scheduler import Scheduler


def served(matches):
    return [(m.client, m.slot.matchkey) for m in matches]


def test_priority_then_fifo():
    s = Scheduler()
    assert s.request("low", "k", 1, now=0) == []
    s.request("high-a", "k", 5, now=1)
    s.request("high-b", "k", 5, now=2)
    s.request("mid", "k", 3, now=3)
    order = []
    for i in range(4):
        order += served(s.put("srv", "k", "h", 9000 + i, f"k:{i}", now=10 + i))
    assert order == [("high-a", "k:0"), ("high-b", "k:1"), ("mid", "k:2"), ("low", "k:3")]


def test_free_slots_are_handed_out_oldest_first_and_per_key():
    s = Scheduler()
    s.put("a", "k", "10.0.0.1", 1, "k:a", now=0)
    s.put("b", "k", "10.0.0.2", 2, "k:b", now=1)
    s.put("c", "other", "10.0.0.3", 3, "other:c", now=2)
    m = s.request("cl", "k", 1, now=3)
    assert [x.slot.address for x in m] == [["10.0.0.1", 1, "k:a"]]
    assert s.queue_info() == {"k": {"free": 1, "pending": 0}, "other": {"free": 1, "pending": 0}}
    assert s.request("cl", "nokey", 1, now=4) == []
    assert s.queue_info()["nokey"] == {"free": 0, "pending": 1}


def test_client_that_disconnects_leaves_the_queue_at_once():
    s = Scheduler()
    s.request("gone", "k", 9, now=0)
    s.request("stays", "k", 1, now=1)
    assert s.queue_info()["k"]["pending"] == 2
    s.drop("gone", now=2)
    assert s.queue_info()["k"]["pending"] == 1
    assert served(s.put("srv", "k", "h", 1, "k:1", now=3)) == [("stays", "k:1")]


def test_server_that_disconnects_takes_its_slots_with_it():
    s = Scheduler()
    s.put("srv", "k", "h", 1, "k:1", now=0)
    s.put("srv", "k", "h", 2, "k:2", now=0)
    s.put("other", "k", "h", 3, "k:3", now=0)
    s.drop("srv", now=1)
    assert s.queue_info()["k"]["free"] == 1
    assert s.pending_matchkeys("srv") == []
    assert served(s.request("cl", "k", 1, now=2)) == [("cl", "k:3")]
    assert s.request("cl2", "k", 1, now=3) == []


def test_pending_matchkeys_follow_handouts():
    s = Scheduler()
    s.put("srv", "k", "h", 1, "k:1", now=0)
    assert s.pending_matchkeys("srv") == ["k:1"]
    s.request("cl", "k", 1, now=1)
    assert s.pending_matchkeys("srv") == []


def test_handed_out_key_is_never_handed_out_again():
    s = Scheduler()
    s.put("srv", "k", "h", 1, "k:1", now=0)
    assert served(s.request("a", "k", 1, now=1)) == [("a", "k:1")]
    assert s.request("b", "k", 1, now=2) == []
    s.expire(now=1000)          # the server does not report sessions: no lease expiry
    assert s.queue_info()["k"] == {"free": 0, "pending": 1}
    assert served(s.put("srv", "k", "h", 1, "k:2", now=1001)) == [("b", "k:2")]


def test_duplicate_put_is_one_slot():
    s = Scheduler()
    s.put("srv", "k", "h", 1, "k:1", now=0)
    s.put("srv", "k", "h", 1, "k:1", now=1)
    assert s.queue_info()["k"]["free"] == 1


def test_lease_of_reporting_server_expires_when_client_never_arrives():
    s = Scheduler(lease_timeout=5)
    s.reports_sessions("srv")
    s.put("srv", "k", "h", 1, "k:1", now=0)
    s.request("ghost", "k", 1, now=1)
    s.request("next", "k", 1, now=2)
    assert s.next_expiry() == 6
    assert s.expire(now=5.9) == []
    assert served(s.expire(now=6)) == [("next", "k:1")]
    assert s.queue_info()["k"]["pending"] == 0


def test_lease_in_session_does_not_expire_and_busy_server_is_withdrawn():
    s = Scheduler(lease_timeout=5)
    s.reports_sessions("srv")
    s.put("srv", "k", "h", 1, "k:1", now=0)
    s.request("a", "k", 1, now=0)
    s.session_started("srv", now=1)
    assert s.expire(now=100) == []
    assert s.lease_info(now=100)[0]["state"] == "session"
    s.put("srv", "k", "h", 1, "k:2", now=101)
    assert s.lease_info(now=101) == []
    stats = s.key_stats()["k"]
    assert stats["sessions"] == 1 and abs(stats["session_mean"] - 101) < 1e-9


def test_late_client_after_expiry_withdraws_requeued_slot():
    s = Scheduler(lease_timeout=5)
    s.reports_sessions("srv")
    s.put("srv", "k", "h", 1, "k:1", now=0)
    s.request("late", "k", 1, now=0)
    s.expire(now=5)
    assert s.queue_info()["k"]["free"] == 1
    s.session_started("srv", now=6)           # the late client did connect after all
    assert s.queue_info()["k"]["free"] == 0
    assert s.request("b", "k", 1, now=7) == []


def test_queue_wait_is_kept_apart_from_session_time():
    s = Scheduler()
    s.request("cl", "k", 1, now=10)
    m = s.put("srv", "k", "h", 1, "k:1", now=13)
    assert m[0].queue_wait == 3
    s.put("srv", "k", "h", 1, "k:2", now=20)  # session of 7 s ended
    stats = s.key_stats()["k"]
    assert stats["queue_wait_mean"] == 3 and stats["session_mean"] == 7


def test_cancel_puts_slot_back_in_front():
    s = Scheduler()
    s.put("srv1", "k", "h", 1, "k:1", now=0)
    s.put("srv2", "k", "h", 2, "k:2", now=0)
    (m,) = s.request("dead", "k", 1, now=1)
    s.drop("dead", now=1)
    assert s.cancel(m, now=1) == []
    assert served(s.request("cl", "k", 1, now=2)) == [("cl", "k:1")]


def test_summary_helpers_hide_matchkeys():
    s = Scheduler()
    s.put("srv", "k", "h", 1, "k:secret", now=0)
    s.request("a", "k", 1, now=0)
    s.request("b", "k", 7, now=1)
    text = repr(s.lease_info(now=2, describe=str)) + repr(s.wait_info(now=2, describe=str))
    assert "secret" not in text
    assert s.wait_info(now=2, describe=str) == [{"key": "k", "protocol": "tvm", "client": "b", "priority": 7,
                                                   "waited": 1}]


def test_idle_queues_are_forgotten_past_the_limit():
    s = Scheduler(max_keys=3)
    for i in range(10):
        s.request(f"c{i}", f"k{i}", 1, now=i)
        s.drop(f"c{i}", now=i)
    assert len(s.queue_info()) <= 3


events = st.lists(st.tuples(st.sampled_from(["put", "req", "drop", "start", "expire"]),
                            st.integers(0, 3), st.integers(0, 2)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(events)
def test_invariants(evs):
    """Matches follow priority, then the request's rank among its connection's waiting ones,
    then arrival; a key of a dropped or busy server is never handed out; a key is handed out
    twice only when its server reports sessions (lease expiry)."""
    s = Scheduler(lease_timeout=3)
    waiting = []                                   # (-priority, rank, seq, client) of live requests
    keys_of: dict[str, list[str]] = {}
    dead: set[str] = set()
    handed: set[str] = set()
    reporting: set[str] = set()
    for t, (kind, who, prio) in enumerate(evs):
        server, client = f"s{who}", f"c{who}"
        if kind == "put":
            key = f"k:{t}"
            keys_of.setdefault(server, []).append(key)
            matches = s.put(server, "k", "h", who, key, now=t)
        elif kind == "req":
            waiting.append((-prio, sum(w[-1] == client for w in waiting), t, client))
            matches = s.request(client, "k", prio, now=t, host="h")
        elif kind == "drop":
            s.drop(client, now=t)
            s.drop(server, now=t)
            waiting = [w for w in waiting if w[-1] != client]
            dead.update(keys_of.pop(server, []))
            reporting.discard(server)
            matches = []
        elif kind == "start":
            s.session_started(server, now=t)
            dead.update(keys_of.pop(server, []))
            reporting.add(server)
            matches = []
        else:
            matches = s.expire(now=t)
        for m in matches:
            best = min(waiting)
            assert m.client == best[-1]
            waiting.remove(best)
            assert m.slot.matchkey not in dead
            if m.slot.matchkey in handed:
                assert m.slot.server in reporting
            handed.add(m.slot.matchkey)
        info = s.queue_info().get("k", {"free": 0, "pending": 0})
        assert info["pending"] == len(waiting) == s.host_waiting_count("h")
        assert info["free"] == 0 or info["pending"] == 0


def test_cancelled_requests_do_not_pile_up():
    s = Scheduler()
    s.request("stays", "k", 1, now=0)
    for i in range(10_000):
        s.request(f"c{i}", "k", 1, now=i)
        s.drop(f"c{i}", now=i)
    assert len(s._queues[("k", "")].waiting) < 100
    assert served(s.put("srv", "k", "h", 1, "k:1", now=1)) == [("stays", "k:1")]


def test_request_served_at_once_past_cancelled_waiters_and_counted():
    s = Scheduler()
    s.request("gone", "k", 9, now=0)
    s.drop("gone", now=1)
    assert s.put("srv", "k", "h", 1, "k:1", now=2) == []        # only a cancelled waiter: the slot stays free
    matches = s.request("cl", "k", 1, now=5)
    assert served(matches) == [("cl", "k:1")] and matches[0].queue_wait == 0
    assert s.waiting_count("cl") == 0 and s.pending_matchkeys("srv") == []
    assert s.queue_info()["k"] == {"free": 0, "pending": 0}
    assert s.key_stats()["k"]["matches"] == 1
    assert [x["client"] for x in s.lease_info(6, describe=str)] == ["cl"]


def test_connections_take_turns_within_a_priority():
    s = Scheduler()
    for _ in range(3):
        s.request("greedy", "k", 1, now=0)
    s.request("other", "k", 1, now=1)
    s.request("urgent", "k", 2, now=2)
    order = [m.client for t in range(5) for m in s.put("srv", "k", "h", 9000, f"k:{t}", now=3 + t)]
    assert order == ["urgent", "greedy", "other", "greedy", "greedy"]


def test_a_hosts_waiting_requests_are_bounded_and_shared_fairly():
    s = Scheduler(max_requests_per_host=4)
    for t in range(4):
        s.request("greedy", "k", 1, now=t, host="127.0.0.1")
    with pytest.raises(ProtocolError, match="limit per host.*as many as any other"):
        s.request("greedy", "k", 1, now=5, host="127.0.0.1")
    assert s.pop_evictions() == [] and s.host_waiting_count("127.0.0.1") == 4
    s.request("remote", "k", 1, now=6, host="10.0.0.2")     # another host is not concerned
    assert s.pop_evictions() == []
    s.request("honest", "k", 1, now=7, host="127.0.0.1")    # takes the greedy one's oldest place
    (eviction,) = s.pop_evictions()
    assert eviction.client == "greedy" and "held the most (4)" in eviction.message
    assert s.waiting_count("greedy") == 3 and s.host_waiting_count("127.0.0.1") == 4
    with pytest.raises(ProtocolError):                       # as many as the greedy one: no more
        for t in range(3):
            s.request("honest", "k", 1, now=8 + t, host="127.0.0.1")
    assert s.waiting_count("honest") == 2 and s.waiting_count("greedy") == 2
    order = [m.client for t in range(5) for m in s.put("srv", "k", "h", 9000, f"k:{t}", now=20 + t)]
    assert order == ["remote", "honest", "honest", "greedy", "greedy"]
    assert s.host_waiting_count("127.0.0.1") == 0 and not s.holds("greedy")


def test_a_refused_request_for_a_new_key_leaves_no_queue():
    s = Scheduler(max_requests_per_host=1)
    s.request("a", "k", 1, now=0, host="h")
    with pytest.raises(ProtocolError):
        s.request("a", "made-up", 1, now=1, host="h")
    assert not s.has_queue("made-up") and s.unserved_keys() == 1
    s.drop_client("a")
    assert s.host_waiting_count("h") == 0 and s.unserved_keys() == 0
