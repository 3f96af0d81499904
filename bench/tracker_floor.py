"""The floor reference of ``bench/tracker.py``: the least a Python tracker can do per message.

    python bench/tracker_floor.py        # prints "floor listening on HOST:PORT"

One ``selectors`` loop on raw sockets; per message one ``recv``, ``json.loads``, a
first-in first-out match of requests to offered slots, ``json.dumps`` of the reply
and one ``send``.  No validation, priorities, leases, limits or error handling: it
is not a tracker, only a measure of what this machine and the load generator allow
a Python tracker to reach, so that the real one can be judged against it.
"""
from __future__ import annotations

import collections
import json
import selectors
import socket
import struct

MAGIC = struct.pack("<i", 0x2F271)
I32 = struct.Struct("<i")


def frame(obj) -> bytes:
    body = json.dumps(obj).encode()
    return I32.pack(len(body)) + body


def main() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    print("floor listening on %s:%d" % listener.getsockname(), flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    free: collections.deque = collections.deque()
    waiting: collections.deque = collections.deque()
    servers = 0
    ok = frame(0)
    while True:
        for key, _ in selector.select():
            sock = key.fileobj
            if sock is listener:
                conn, _ = listener.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if conn.recv(4) == MAGIC:
                    conn.sendall(MAGIC)
                    conn.setblocking(False)
                    selector.register(conn, selectors.EVENT_READ, bytearray())
                continue
            data = sock.recv(65536)
            if not data:
                selector.unregister(sock)
                sock.close()
                continue
            buf = key.data
            buf += data
            while len(buf) >= 4 and len(buf) >= 4 + I32.unpack_from(buf)[0]:
                n = I32.unpack_from(buf)[0]
                msg = json.loads(buf[4:4 + n])
                del buf[:4 + n]
                code = msg[0]
                if code == 4:
                    waiting.append(sock)
                elif code == 3:
                    free.append(["127.0.0.1", msg[2][0], msg[2][1]])
                    sock.send(ok)
                elif code == 5:
                    servers += 1
                    sock.send(ok)
                elif code == 6:
                    sock.send(frame([0, {"queue_info": {"bench": {"free": len(free), "pending": len(waiting)}},
                                         "server_info": [{}] * servers}]))
                else:
                    sock.send(ok)
                while free and waiting:
                    waiting.popleft().send(frame([0, free.popleft()]))


if __name__ == "__main__":
    main()
