"""A tracker peer that speaks the wire format byte by byte (shared by the tracker tests)."""
import json
import socket
import struct

MAGIC = bytes.fromhex("71f20200")


class Raw:
    """A tracker peer that writes exactly the bytes it is given."""

    def __init__(self, addr, magic=True):
        self.sock = socket.create_connection(addr, timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if magic:
            self.sock.sendall(MAGIC)
            assert self.read(4) == MAGIC

    def read(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed")
            out += chunk
        return out

    def send(self, obj):
        data = json.dumps(obj).encode()
        self.sock.sendall(struct.pack("<i", len(data)) + data)

    def recv_raw(self):
        n = struct.unpack("<i", self.read(4))[0]
        return self.read(n)

    def recv(self):
        return json.loads(self.recv_raw())

    def call(self, obj):
        self.send(obj)
        return self.recv()

    def register(self, key, port, matchkey, addr=None, protocol=None):
        info = {"key": f"server:{key}", "addr": [addr, port]}
        if protocol is not None:
            info["protocol"] = protocol
        assert self.call([5, info]) == 0
        assert self.call([3, key, [port, matchkey], None]) == 0

    def closed_by_peer(self, timeout=5):
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def close(self):
        self.sock.close()
