"""``python -m kernelrpc.query_rpc_tracker``: TVM's text, JSON, and one exit code per situation."""
import json
import socket
import subprocess
import sys

from conftest import wait_until
from servicectl import child_env
from tracker_peers import Raw

CAPTURED = """Tracker address 127.0.0.1:{port}

Server List
------------------------------
server-address           key
------------------------------
127.0.0.1:19090          server:testkey
------------------------------

Queue Status
-------------------------------
key       total  free  pending
-------------------------------
testkey   1      {free}     {pending}      
-------------------------------

"""


def query(port, *extra):
    return subprocess.run([sys.executable, "-m", "kernelrpc.query_rpc_tracker", "--host", "127.0.0.1",
                           "--port", str(port), *extra], capture_output=True, text=True, env=child_env(),
                          timeout=30)


def test_free_server_prints_tvm_text(tracker):
    srv = Raw(tracker.address)
    srv.register("testkey", 19090, "testkey:0.5")
    out = query(tracker.port)
    assert out.returncode == 0, out.stderr
    assert out.stdout == CAPTURED.format(port=tracker.port, free=1, pending=0)
    srv.close()


def test_all_busy(tracker):
    srv = Raw(tracker.address)
    srv.register("testkey", 19090, "testkey:0.5")
    client = Raw(tracker.address)
    assert client.call([4, "testkey", "", 1])[0] == 0
    client.send([4, "testkey", "", 1])
    observer = Raw(tracker.address)
    wait_until(lambda: observer.call([6])[1]["queue_info"]["testkey"]["pending"] == 1, what="the request queued")
    observer.close()
    out = query(tracker.port)
    assert out.returncode == 5
    assert out.stdout == CAPTURED.format(port=tracker.port, free=0, pending=1)
    assert "all servers at tracker" in out.stderr and "testkey (1 servers, 1 waiting)" in out.stderr
    data = json.loads(query(tracker.port, "--json").stdout)
    assert data["status"] == "all_busy" and data["summary"]["queue_info"]["testkey"]["pending"] == 1
    srv.close()
    client.close()


def test_no_servers(tracker):
    out = query(tracker.port)
    assert out.returncode == 4
    assert "no servers are registered" in out.stderr
    assert out.stdout.startswith(f"Tracker address 127.0.0.1:{tracker.port}\n\nServer List\n")
    assert json.loads(query(tracker.port, "--json").stdout)["status"] == "no_servers"


def test_unreachable():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    out = query(port)
    assert out.returncode == 3
    assert out.stdout == ""
    assert "tracker unreachable: cannot reach tracker at 127.0.0.1:" in out.stderr
    data = json.loads(query(port, "--json").stdout)
    assert data["status"] == "unreachable" and "refused" in data["error"].lower()
