"""Servers behind a proxy report their device record to the tracker (``-device=`` in the key).

The codec and the registration machine without a network; then real trackers, proxies and
``python -m kernelrpc.server --through-proxy`` processes, a raw peer that sends what an old
server or a broken one would, and Apache TVM's proxy, which must ignore the new option.
"""
from __future__ import annotations

import base64
import json
import random
import re
import subprocess
import sys
import urllib.request
import zlib

import hypothesis
import pytest
from hypothesis import strategies as st

from conftest import wait_until
from kernelrpc.rpc import connect_tracker
from kernelrpc.wire import device_record as D
from kernelrpc.wire import registration as R
from kernelrpc.wire.backoff import Backoff
from kernelrpc.wire.tracker_codec import MAGIC_BYTES, FrameDecoder, TrackerCode
from kernelrpc.runtime import device_info
from proxy_peers import connect, read_reply, start_tvm_proxy, wait_for_matches
from servicectl import child_env

DEVICE_READY = re.compile(r"connected to proxy (\S+):(\d+)")
RECORD = device_info.describe()


def pack(obj) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return base64.urlsafe_b64encode(zlib.compress(raw)).rstrip(b"=").decode()


# -- the codec ------------------------------------------------------------------------------------
def test_this_machines_record_travels_whole_in_one_key_token():
    option = D.key_option(RECORD)
    assert option.startswith(" -device=") and " " not in option[1:] and len(option) < D.MAX_OPTION_CHARS
    assert D.decode(option.split("=", 1)[1]) == (RECORD, [])


def test_a_record_too_long_for_the_key_goes_without_its_features():
    rng = random.Random(0)
    for length in (8, 40):      # too long once compressed; too long as JSON
        features = ["".join(rng.choice("abcdefghijklmnop") for _ in range(length)) for _ in range(256)]
        record, _ = D.decode(D.encode({**RECORD, "features": features}))
        assert record == {k: v for k, v in RECORD.items() if k != "features"}
    assert D.key_option({**RECORD, "cpus": "2"}) == ""          # what the proxy would refuse


@pytest.mark.parametrize("value, reason", [
    ("x" * (D.MAX_OPTION_CHARS + 1), "the limit is"),
    ("not+base64/", "outside base64url"),
    (pack(b"")[:-3] + "AAA", "not base64url-encoded zlib|truncated"),
    (base64.urlsafe_b64encode(b"plain json").decode().rstrip("="), "not base64url-encoded zlib"),
    (pack(b" " * (1 << 20)), "expands to more than"),                 # a compression bomb
    (pack(json.dumps(RECORD).encode()[:-1]), "not JSON"),
    (pack(b"[" * 4000 + b"]" * 4000), "not JSON"),                     # deeper than Python recurses
    (pack(["machine", "target"]), "a JSON list, not an object"),
    (pack({"target": "llvm"}), "has no machine"),
    (pack({**RECORD, "cpus": "2"}), "'cpus' is str, not int"),
    (pack({**RECORD, "cpus": True}), "'cpus' is bool, not int"),
    (pack({**RECORD, "cpus": 0}), "outside"),
    (pack({**RECORD, "machine": "x" * 65}), "longer than 64"),
    (pack({**RECORD, "machine": "x86\n"}), "unprintable"),
    (pack({**RECORD, "features": ["sse", 3]}), "list of at most 256 short names"),
    (pack({**RECORD, "features": ["f"] * 257}), "list of at most 256"),
])
def test_bad_records_are_refused_with_the_reason(value, reason):
    with pytest.raises(D.BadRecord, match=reason):
        D.decode(value)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(st.one_of(st.text(max_size=3000), st.binary(max_size=3000).map(pack),
                            st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=40),
                                         lambda inner: st.lists(inner, max_size=4)
                                         | st.dictionaries(st.sampled_from(sorted(D.FIELDS)), inner, max_size=6),
                                         max_leaves=30).map(pack)))
def test_whatever_arrives_is_a_checked_record_or_a_bad_record(value):
    try:
        record, unknown = D.decode(value)
    except D.BadRecord:
        return
    assert set(record) <= set(D.FIELDS) and not unknown and len(json.dumps(record)) <= D.MAX_RECORD_BYTES


def test_unknown_fields_are_left_out_and_named():
    assert D.decode(pack({**RECORD, "memory": 1 << 30, "gpu": "none"})) == (RECORD, ["gpu", "memory"])


def test_log_lines_show_the_start_of_a_record_only():
    key = "server:rpi -protocol=kernelrpc/1" + D.key_option(RECORD)
    short = D.shorten(key)
    assert short.startswith("server:rpi -protocol=kernelrpc/1 -device=") and short.endswith(" chars)")
    assert len(short) < 90 and D.shorten("server:rpi -protocol=kernelrpc/1") == "server:rpi -protocol=kernelrpc/1"


# -- the proxy's registration machine ----------------------------------------------------------
def machine():
    count = iter(range(1, 10_000))
    return R.ProxyRegistration(9090, None, where="t:1", rekey=lambda offer: f"{offer}:{next(count)}",
                               backoff=Backoff(0.25, 10.0, rng=random.Random(1)))


def infos(actions) -> list[dict]:
    frames = FrameDecoder().feed(b"".join(a.data for a in actions if isinstance(a, R.Send)))
    return [f[1] for f in frames if f[0] == TrackerCode.UPDATE_INFO]


def ready(m) -> list:
    m.handle(R.TimerFired(), 0)
    m.handle(R.Connected("127.0.0.1"), 0)
    return m.handle(R.DataReceived(MAGIC_BYTES), 0)


ARM = {"machine": "aarch64", "target": "llvm -mtriple=aarch64-linux-gnu -mattr=+neon", "cpus": 4}


def test_identical_boards_read_like_a_direct_server():
    m = machine()
    for d in ("d1", "d2"):
        m.handle(R.OfferAdded(d, "rpi", d, "kernelrpc/1", dict(ARM)), 0)
    info = infos(ready(m))[-1]
    assert info["device"] == ARM and info["devices"] == {"rpi": [ARM]} and "devices_omitted" not in info


def test_mixed_boards_are_listed_per_key_and_stale_records_are_cleared():
    m = machine()
    m.handle(R.OfferAdded("arm", "lab", "arm", "kernelrpc/1", ARM), 0)
    ready(m)
    x86 = {"machine": "x86_64", "target": "llvm -mtriple=x86_64-linux-gnu"}
    (info,) = infos(m.handle(R.OfferAdded("x86", "lab", "x86", "kernelrpc/1", x86), 1))
    assert info["device"] == {} and info["devices"] == {"lab": [ARM, x86]}
    info = infos(m.handle(R.OfferAdded("tvm", "old", "tvm", ""), 1))[0]     # no record: named by its key only
    assert info["key"] == "server:proxy[lab,old]" and info["devices"] == {"lab": [ARM, x86]}
    m.handle(R.OfferWithdrawn("tvm", handed_out=True), 2)
    (info,) = infos(m.handle(R.OfferWithdrawn("x86", handed_out=True), 2))
    assert info["device"] == ARM and info["devices"] == {"lab": [ARM]}
    (info,) = infos(m.handle(R.OfferWithdrawn("arm", handed_out=True), 3))
    assert info == {"key": "server:proxy[]", "addr": [None, 9090], "device": {}, "devices": {}}


def test_without_records_the_update_is_tvms_shape():
    m = machine()
    m.handle(R.OfferAdded("d", "k", "d", ""), 0)
    assert infos(ready(m))[0] == {"key": "server:proxy[k]", "addr": [None, 9090]}


def test_records_beyond_the_trackers_info_bound_are_counted_not_sent():
    m = machine()
    for i in range(60):
        m.handle(R.OfferAdded(i, "k", str(i), "kernelrpc/1", {**ARM, "cpu_model": f"board {i} " + "x" * 180}), 0)
    info = infos(ready(m))[-1]
    assert 0 < info["devices_omitted"] < 60 and len(info["devices"]["k"]) + info["devices_omitted"] == 60
    assert len(json.dumps(info)) < 16 * 1024
    huge = {**ARM, "features": [f"{i:064d}" for i in range(100)]}      # within the decoder's bounds
    m = machine()
    m.handle(R.OfferAdded("one", "k", "one", "kernelrpc/1", huge), 0)
    info = infos(ready(m))[-1]
    assert info["device"] == huge and info["devices"] == {} and info["devices_omitted"] == 1


BOARDS = [None, ARM, {"machine": "x86_64", "target": "llvm"}, {"machine": "riscv64", "target": "llvm", "cpus": 1}]


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.sampled_from(["a", "b"]),
                                     st.integers(0, len(BOARDS) - 1)), max_size=30))
def test_what_the_tracker_holds_matches_the_waiting_devices(steps):
    m = machine()
    ready(m)
    held: dict = {}                         # the tracker's merged info, as it applies UPDATE_INFO
    waiting: dict = {}
    for now, (add, offer, key, board) in enumerate(steps):
        if add and offer not in waiting:
            waiting[offer] = (key, BOARDS[board])
            actions = m.handle(R.OfferAdded(offer, key, f"{key}:{offer}", "kernelrpc/1", BOARDS[board]), now)
        elif not add and offer in waiting:
            del waiting[offer]
            actions = m.handle(R.OfferWithdrawn(offer, handed_out=True), now)
        else:
            continue
        for info in infos(actions):
            held.update(info)
    records = [r for _, r in waiting.values()]
    if not any(records):
        assert held.get("device", {}) == {} and held.get("devices", {}) == {}
        return
    expected: dict = {}
    for key, record in waiting.values():
        if record and record not in expected.setdefault(key, []):
            expected[key].append(record)
    assert held["devices"] == {k: v for k, v in sorted(expected.items()) if v}
    assert held["device"] == (records[0] if all(r == records[0] for r in records) else {})


# -- real processes -------------------------------------------------------------------------------
@pytest.fixture
def device(start_service):
    def start(proxy, key):
        return start_service("kernelrpc.server", ["--through-proxy", "--host", proxy.host, "--port",
                                                  str(proxy.port), "--key", key], ready=DEVICE_READY)
    return start


def server_infos(tracker) -> list[dict]:
    with connect_tracker(*tracker.address) as session:
        return session.summary()["server_info"]


def test_the_tracker_shows_the_same_device_for_a_server_behind_the_proxy(start_service, proxy, device):
    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--web-port", "0"])
    page = tracker.wait_for_line(r"status page on http://").split("status page on ", 1)[1].strip()
    start_service("kernelrpc.server", ["--port", "0", "--tracker", f"127.0.0.1:{tracker.port}", "--key", "direct"])
    p = proxy("--tracker", f"127.0.0.1:{tracker.port}")
    device(p, "behind")
    device(p, "behind")
    wait_for_matches(p, r"offered behind:\S+ to the tracker", 2)

    def both():
        infos = {i["key"]: i for i in server_infos(tracker)}
        return infos if {"server:direct", "server:proxy[behind]"} <= infos.keys() else None
    infos = wait_until(both)
    direct, behind = infos["server:direct"], infos["server:proxy[behind]"]
    assert behind["device"] == direct["device"] and behind["device"]["machine"] == RECORD["machine"]
    assert behind["devices"] == {"behind": [direct["device"]]}
    with urllib.request.urlopen(page + "api/status", timeout=10) as response:
        rows = {row["key"]: row for row in json.loads(response.read())["servers"]}
    assert rows["proxy[behind]"]["arch"] == rows["direct"]["arch"] == RECORD["machine"]
    out = subprocess.run([sys.executable, "-m", "kernelrpc.query_rpc_tracker", "--port", str(tracker.port),
                          "--json"], env=child_env(), capture_output=True, text=True, timeout=60)
    listed = {i["key"]: i for i in json.loads(out.stdout)["summary"]["server_info"]}
    assert listed["server:proxy[behind]"]["device"] == listed["server:direct"]["device"] == direct["device"]
    with connect_tracker(*tracker.address).request("behind", session_timeout=30) as sess:
        assert sess.get_function("testing.echo")("ok") == "ok"
    wait_for_matches(p, r"paired client .* with device .*-device=\S+\.\.\.\(\d+ chars\)")


def test_different_boards_behind_one_proxy_are_listed_under_their_key(start_service, proxy):
    tracker = start_service("kernelrpc.tracker", ["--port", "0", "--web-port", "0"])
    page = tracker.wait_for_line(r"status page on http://").split("status page on ", 1)[1].strip()
    p = proxy("--tracker", f"127.0.0.1:{tracker.port}")
    x86 = {"machine": "x86_64", "target": "llvm -mtriple=x86_64-linux-gnu", "cpus": 8}
    boards = [connect(p.address, f"server:lab -protocol=kernelrpc/1 -device={pack(record)}")
              for record in (ARM, x86, ARM)]
    wait_for_matches(p, r"offered lab:\S+ to the tracker", 3)
    info = wait_until(lambda: [i for i in server_infos(tracker)
                               if i["key"] == "server:proxy[lab]" and len(i.get("devices", {}).get("lab", ())) == 2])[0]
    assert info["device"] == {} and info["devices"] == {"lab": [ARM, x86]}
    with urllib.request.urlopen(page + "api/status", timeout=10) as response:
        (row,) = json.loads(response.read())["servers"]
    assert row["key"] == "proxy[lab]" and row["arch"] == "aarch64, x86_64"
    for _ in range(2):        # clients by plain key take the oldest two: one ARM board is left
        client = connect(p.address, "client:lab")
        assert read_reply(client)[0].ok
        client.close()
    wait_until(lambda: [i["device"] for i in server_infos(tracker) if i["key"] == "server:proxy[lab]"] == [ARM])
    for board in boards:
        board.close()


def test_a_bad_record_is_logged_and_the_device_still_serves(start_service, proxy):
    tracker = start_service("kernelrpc.tracker", ["--port", "0"])
    p = proxy("--tracker", f"127.0.0.1:{tracker.port}")
    bad = connect(p.address, "server:shaky -protocol=kernelrpc/1 -device=" + pack(b" " * (1 << 20)))
    old = connect(p.address, "server:shaky -protocol=kernelrpc/1")          # a server from before
    wait_for_matches(p, r"device .* \(key 'shaky'\): -device= expands to more than 8192 bytes; "
                        r"offered to the tracker without a device record")
    wait_for_matches(p, r"offered shaky:\S+ to the tracker", 2)
    info = wait_until(lambda: [i for i in server_infos(tracker) if i["key"] == "server:proxy[shaky]"])[0]
    assert "device" not in info and "devices" not in info
    for sock in (bad, old):
        client = connect(p.address, "client:shaky")
        assert read_reply(client)[0].ok and read_reply(sock)[0].ok
        client.close()
        sock.close()


@pytest.mark.tvm
def test_tvms_proxy_ignores_the_record_and_hands_it_to_the_client(start_service, device):
    pytest.importorskip("tvm", reason="apache-tvm is not installed")
    tvm_proxy = start_tvm_proxy(start_service)
    device(tvm_proxy, "viatvm")
    wait_for_matches(tvm_proxy, "Handler ready")
    client = connect(tvm_proxy.address, "client:viatvm")     # TVM's proxy paired by the first word
    key = read_reply(client)[0].key
    client.close()
    head, _, value = key.partition(" -device=")
    assert head == "server:viatvm -protocol=kernelrpc/1" and D.decode(value) == (RECORD, [])
