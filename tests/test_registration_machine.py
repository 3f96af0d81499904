"""The tracker-registration state machine (kernelrpc.wire.registration) without sockets."""
import random

from hypothesis import given, settings, strategies as st

from kernelrpc.wire import registration as R
from kernelrpc.wire.auth import ServiceAuth, AUTH_CONTEXT
from kernelrpc.wire.backoff import Backoff
from kernelrpc.wire.tracker_codec import MAGIC_BYTES, FrameDecoder, TrackerCode, encode_frame

SUCCESS = encode_frame(TrackerCode.SUCCESS)


def machine(**kwargs):
    kwargs.setdefault("backoff", Backoff(0.25, 10.0, rng=random.Random(1)))
    return R.Registration("board", 9000, None, where="t:1", device={"arch": "x"}, **kwargs)


def sent(actions):
    """The tracker messages among ``actions``, decoded."""
    decoder = FrameDecoder()
    return [m for a in actions if isinstance(a, R.Send) and a.data != MAGIC_BYTES for m in decoder.feed(a.data)]


def register(m, now=0.0):
    assert m.handle(R.TimerFired(), now) == [R.Connect()]
    assert m.handle(R.Connected("127.0.0.1"), now) == [R.Send(MAGIC_BYTES)]
    first = m.handle(R.DataReceived(MAGIC_BYTES), now)
    m.handle(R.DataReceived(SUCCESS + SUCCESS), now)
    assert m.registered
    return first


def test_tvm_sequence_with_protocol_device_and_session():
    m = machine()
    update, put = sent(register(m))
    assert update == [TrackerCode.UPDATE_INFO, {"key": "server:board", "addr": [None, 9000], "session": "idle",
                                                "protocol": "kernelrpc/1", "device": {"arch": "x"}}]
    assert put == [TrackerCode.PUT, "board", [9000, m.matchkey], None]
    assert m.matchkey.startswith("board:")
    assert m.deadline == 2.0                      # the first GET_PENDING_MATCHKEYS, not a busy poll


def test_session_reports_and_fresh_keys():
    m = machine()
    register(m)
    first = m.matchkey
    (active,) = sent(m.handle(R.SessionStarted(), 1.0))
    assert active[1]["session"] == "active" and "device" not in active[1]
    assert m.matchkey != first
    m.handle(R.DataReceived(SUCCESS), 1.0)
    idle, put = sent(m.handle(R.SessionFinished(), 2.0))
    assert idle[1]["session"] == "idle" and put[2][1] == m.matchkey


def test_key_rotates_after_four_polls_without_it():
    m = machine()
    register(m)
    taken, now = m.matchkey, 0.0
    for _ in range(R.MISSES_BEFORE_ROTATE - 1):
        now = m.deadline
        assert sent(m.handle(R.TimerFired(), now)) == [[TrackerCode.GET_PENDING_MATCHKEYS]]
        assert sent(m.handle(R.DataReceived(encode_frame([])), now)) == []
    now = m.deadline
    m.handle(R.TimerFired(), now)
    (put,) = sent(m.handle(R.DataReceived(encode_frame([])), now))
    assert m.matchkey != taken and put[2][1] == m.matchkey


def test_key_still_pending_is_kept():
    m = machine()
    register(m)
    for _ in range(2 * R.MISSES_BEFORE_ROTATE):
        now = m.deadline
        m.handle(R.TimerFired(), now)
        assert sent(m.handle(R.DataReceived(encode_frame([m.matchkey])), now)) == []


def test_silent_tracker_times_out_and_backs_off():
    m = machine()
    register(m)
    m.handle(R.TimerFired(), m.deadline)            # a poll the tracker never answers
    now = m.deadline
    (gone,) = m.handle(R.TimerFired(), now)
    assert isinstance(gone, R.Disconnect) and "no reply" in gone.reason
    assert not m.registered and m.state is R.State.DISCONNECTED
    assert 0.2 <= gone.retry_in <= 0.3 and m.deadline == now + gone.retry_in


def test_reregisters_after_the_tracker_goes_away():
    m = machine()
    register(m)
    old = m.matchkey
    (gone,) = m.handle(R.ConnectionClosed(), 5.0)
    assert isinstance(gone, R.Disconnect)
    assert m.handle(R.TimerFired(), 5.0) == []     # the backoff is not over yet
    register(m, m.deadline)
    assert m.matchkey != old


def test_refused_put_disconnects():
    m = machine()
    m.handle(R.TimerFired(), 0)
    m.handle(R.Connected(), 0)
    m.handle(R.DataReceived(MAGIC_BYTES), 0)
    actions = m.handle(R.DataReceived(SUCCESS + encode_frame(TrackerCode.FAIL)), 0)
    assert [type(a) for a in actions] == [R.Disconnect] and "refused PUT" in actions[0].reason


def test_not_a_tracker():
    m = machine()
    m.handle(R.TimerFired(), 0)
    m.handle(R.Connected(), 0)
    (gone,) = m.handle(R.DataReceived(b"HTTP/1.0 400\r\n"), 0)
    assert "is not a tracker" in gone.reason


def test_hmac_authentication_then_magic():
    token = b"s" * 32
    m = machine(auth_token=token)
    m.handle(R.TimerFired(), 0)
    assert m.handle(R.Connected(), 0) == [R.Send(MAGIC_BYTES)]
    service = ServiceAuth(token, AUTH_CONTEXT)
    (answer,) = m.handle(R.DataReceived(service.challenge()), 0)
    verdict = service.feed(answer.data)
    assert service.ok
    update, put = sent(m.handle(R.DataReceived(verdict + MAGIC_BYTES), 0))
    assert update[0] == TrackerCode.UPDATE_INFO and put[0] == TrackerCode.PUT


def test_auth_token_against_an_open_tracker_is_refused():
    m = machine(auth_token=b"s" * 32)
    m.handle(R.TimerFired(), 0)
    m.handle(R.Connected(), 0)
    (gone,) = m.handle(R.DataReceived(MAGIC_BYTES), 0)
    assert isinstance(gone, R.Disconnect) and "does not ask for authentication" in gone.reason


def test_session_events_while_disconnected_shape_the_next_offer():
    m = machine()
    m.handle(R.SessionStarted(), 0)
    assert m.state is R.State.DISCONNECTED
    (update,) = sent(register_busy(m))
    assert update[1]["session"] == "active"        # no PUT while a session runs


def register_busy(m):
    m.handle(R.TimerFired(), 0)
    m.handle(R.Connected(), 0)
    return m.handle(R.DataReceived(MAGIC_BYTES), 0)


def test_closed_machine_ignores_everything():
    m = machine()
    register(m)
    m.close()
    for event in (R.TimerFired(), R.SessionStarted(), R.DataReceived(b"x"), R.ConnectionClosed()):
        assert m.handle(event, 100.0) == []
    assert m.deadline == float("inf")


def test_backoff_doubles_with_jitter_and_resets():
    b = Backoff(0.5, 4.0, jitter=0.2, rng=random.Random(0))
    delays = [b.next() for _ in range(6)]
    for delay, base in zip(delays, [0.5, 1, 2, 4, 4, 4]):
        assert 0.8 * base <= delay <= 1.2 * base
    b.reset()
    assert b.next() <= 0.6


events = st.one_of(
    st.binary(max_size=64).map(R.DataReceived),
    st.sampled_from([R.TimerFired(), R.Connected("h"), R.SessionStarted(), R.SessionFinished(),
                     R.ConnectionClosed()]),
    st.builds(lambda frame: R.DataReceived(encode_frame(frame)),
              st.recursive(st.none() | st.integers(-2, 8) | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3), max_leaves=6)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(events, st.floats(0, 30)), max_size=40), st.booleans())
def test_arbitrary_input_never_crashes(steps, with_token):
    m = machine(auth_token=b"k" * 32 if with_token else None)
    now = 0.0
    for event, dt in steps:
        now += dt
        actions = m.handle(event, now)
        assert all(isinstance(a, (R.Connect, R.Send, R.Disconnect)) for a in actions)
        if isinstance(event, R.TimerFired):
            assert m.deadline > now                 # a timer never asks to fire again at once: no busy loop
        if any(isinstance(a, R.Disconnect) for a in actions):
            assert m.state is R.State.DISCONNECTED and not m.registered


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=256), st.integers(1, 16))
def test_replies_split_anywhere_register_the_same(noise, chunk):
    m = machine()
    m.handle(R.TimerFired(), 0)
    m.handle(R.Connected(), 0)
    stream = MAGIC_BYTES + SUCCESS + SUCCESS
    for i in range(0, len(stream), chunk):
        m.handle(R.DataReceived(stream[i:i + chunk]), 0)
    assert m.registered
    m.handle(R.DataReceived(noise), 0)              # whatever follows: a clean disconnect at worst


# -- the proxy's flavour: many offers ---------------------------------------------------------
class Keys:
    """The proxy's side of rekeying: a fresh key per call, remembered per offer."""

    def __init__(self):
        self.count = 0

    def __call__(self, offer):
        self.count += 1
        return f"{offer}:{self.count}"


def proxy_machine(**kwargs):
    kwargs.setdefault("backoff", Backoff(0.25, 10.0, rng=random.Random(1)))
    return R.ProxyRegistration(9090, None, where="t:1", rekey=Keys(), **kwargs)


def open_link(m, now=0.0):
    m.handle(R.TimerFired(), now)
    m.handle(R.Connected("127.0.0.1"), now)
    return m.handle(R.DataReceived(MAGIC_BYTES), now)


def test_proxy_offers_every_waiting_device_with_its_protocol():
    m = proxy_machine()
    m.handle(R.OfferAdded("d1", "a", "a:0.1", "kernelrpc/1"), 0)
    m.handle(R.OfferAdded("d2", "b", "b:0.2", ""), 0)
    assert m.offer_state("d1") is m.offer_state("d2") is R.OfferState.WAITING
    messages = sent(open_link(m))
    info = {"key": "server:proxy[a,b]", "addr": [None, 9090]}
    key1, key2 = m.offers["d1"].matchkey, m.offers["d2"].matchkey
    assert key1 == "d1:1" and key2 == "d2:2"          # a new connection: fresh keys from the proxy
    assert messages == [[TrackerCode.UPDATE_INFO, info],
                        [TrackerCode.UPDATE_INFO, {**info, "protocol": "kernelrpc/1"}],
                        [TrackerCode.PUT, "a", [9090, key1], None],
                        [TrackerCode.UPDATE_INFO, {**info, "protocol": ""}],
                        [TrackerCode.PUT, "b", [9090, key2], None]]
    assert m.offer_state("d1") is R.OfferState.OFFERED
    m.handle(R.DataReceived(SUCCESS * 5), 0)
    assert m.registered
    (put,) = sent(m.handle(R.OfferAdded("d3", "b", "b:0.3", ""), 1))
    info3 = {"key": "server:proxy[a,b]", "addr": [None, 9090]}
    assert put == [TrackerCode.PUT, "b", [9090, "b:0.3"], None] and info3 == info


def test_proxy_rotates_a_handed_out_key_after_the_shared_number_of_polls():
    m = proxy_machine()
    m.handle(R.OfferAdded("d", "a", "a:0.1"), 0)
    open_link(m)
    m.handle(R.DataReceived(SUCCESS * 3), 0)
    taken = m.offers["d"].matchkey
    now = m.deadline
    m.handle(R.TimerFired(), now)
    assert sent(m.handle(R.DataReceived(encode_frame([taken])), now)) == []
    assert m.offer_state("d") is R.OfferState.OFFERED
    for _ in range(R.MISSES_BEFORE_ROTATE - 1):
        now = m.deadline
        m.handle(R.TimerFired(), now)
        assert sent(m.handle(R.DataReceived(encode_frame([])), now)) == []
        assert m.offer_state("d") is R.OfferState.CLAIMED
    now = m.deadline
    m.handle(R.TimerFired(), now)
    (put,) = sent(m.handle(R.DataReceived(encode_frame([])), now))
    assert put[2][1] == m.offers["d"].matchkey != taken
    assert m.offer_state("d") is R.OfferState.OFFERED


def test_proxy_withdraws_an_offered_slot_by_reconnecting_at_once():
    m = proxy_machine()
    for d in ("d1", "d2"):
        m.handle(R.OfferAdded(d, "a", d), 0)
    open_link(m)
    m.handle(R.DataReceived(SUCCESS * 4), 0)
    assert m.handle(R.OfferWithdrawn("d2", handed_out=True), 1) == []   # its client took it from the tracker
    (gone,) = m.handle(R.OfferWithdrawn("d1"), 1)
    assert isinstance(gone, R.Disconnect) and gone.retry_in == 0 and "withdrawing slots" in gone.reason
    assert m.deadline == 1 and m.offers == {}
    m.handle(R.OfferAdded("d3", "a", "x"), 1)
    assert m.handle(R.TimerFired(), 1) == [R.Connect()]             # no backoff for a deliberate reconnect


def test_proxy_offers_wait_while_the_tracker_is_away():
    m = proxy_machine()
    m.handle(R.OfferAdded("d", "a", "a:0.1"), 0)
    open_link(m)
    m.handle(R.ConnectionClosed(), 1)
    assert m.offer_state("d") is R.OfferState.WAITING
    assert m.handle(R.OfferWithdrawn("d"), 1) == [] and m.offer_state("d") is None


proxy_events = st.one_of(
    events,
    st.builds(R.OfferAdded, st.sampled_from("abc"), st.sampled_from(["k", "j"]), st.text(max_size=4)),
    st.builds(R.OfferWithdrawn, st.sampled_from("abc"), st.booleans()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(proxy_events, st.floats(0, 30)), max_size=40))
def test_proxy_arbitrary_input_never_crashes(steps):
    m = proxy_machine()
    now = 0.0
    for event, dt in steps:
        now += dt
        actions = m.handle(event, now)
        assert all(isinstance(a, (R.Connect, R.Send, R.Disconnect)) for a in actions)
        if m.state is not R.State.READY:
            assert all(o.state is R.OfferState.WAITING for o in m.offers.values())
