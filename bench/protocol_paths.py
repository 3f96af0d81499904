"""The session protocol's fast paths against the general paths they mirror, on bytes only.

    PYTHONPATH=src python bench/protocol_paths.py [--number N] [--repeat R]

Each row times one fast path and the general code that gives the same answer (tests/
test_protocol_fastpath.py checks that they agree on every input), for the messages a
measurement loop repeats: ``echo(1)``'s CALL and its RETURN. Best of ``repeat`` runs of
``number`` calls each, in nanoseconds per call; the gain is what one round trip saves.
"""
from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kernelrpc.wire import protocol as P  # noqa: E402
from kernelrpc.wire.connection import ClientConnection, ServerConnection, SessionAccount  # noqa: E402
from kernelrpc.wire.hello import _checked_info  # noqa: E402
from kernelrpc.wire.convert import Converter  # noqa: E402
from kernelrpc.wire.requests import from_values  # noqa: E402
from kernelrpc.wire import values as V  # noqa: E402
from kernelrpc.wire.values import DeviceValue, FunctionHandle, TensorHandle, decode_values  # noqa: E402


def pairs():
    call = P.encode_call(3, (1,))
    body = call[P.HEADER_SIZE:]
    result = P.encode_result(1)

    def reassembled():
        reader = P.FrameReader()
        reader.feed(result)
        return reader.next_frame()

    one_read = P.FrameReader()
    server = ServerConnection(1 << 20, SessionAccount(0, 0, 0))
    client = ClientConnection({"max_frame_bytes": 1 << 20, "max_tensor_bytes": 0, "max_session_bytes": 0,
                               "max_client_tensors": 0, "globals": []})
    yield ("encode CALL echo(1)", lambda: P.encode_call(3, (1,)),
           lambda: P.encode_request(P.CALL, [FunctionHandle(3), 1]))
    yield ("decode CALL echo(1)", lambda: P.decode_call(body), lambda: from_values(body[0], decode_values(body, 1)))
    yield ("encode RETURN 1", lambda: P.encode_result(1), lambda: P.encode_return([1]))
    yield ("frame from one read", lambda: one_read.whole_frame(result), reassembled)
    yield ("CALL frame from one read", lambda: server.call_from_read(call),
           lambda: P.decode_call(one_read.whole_frame(call)[1]))
    yield ("RETURN frame from one read", lambda: client.result_from_read(result),
           lambda: P.decode_result(one_read.whole_frame(result)[1]))
    yield ("encode CALL echo('x')", lambda: P.encode_call(3, ("x",)),
           lambda: P.encode_request(P.CALL, [FunctionHandle(3), "x"]))
    device = DeviceValue("cpu", 0)
    kernel_call = P.encode_call(3, (TensorHandle(5, "float32", (1,), device), TensorHandle(6, "float32", (1,), device)))

    def without_memo():
        V._HANDLES.clear()  # the memos of decoded tensor handles and lists, emptied: decoded in full
        V._LISTS.clear()
        return server.call_from_read(kernel_call)

    yield ("CALL f(a, b), memos", lambda: server.call_from_read(kernel_call), without_memo)
    kept = ServerConnection(1 << 20, SessionAccount(0, 0, 0))
    kept.keep_call(*kept.call_from_read(kernel_call))
    yield ("CALL f(a, b) again, kept", lambda: kept.call_from_read(kernel_call),
           lambda: server.call_from_read(kernel_call))
    none_result = P.encode_result(None)
    yield ("encode RETURN None", lambda: P.encode_result(None), lambda: P.encode_return([None]))
    yield ("RETURN None from one read", lambda: client.result_from_read(none_result),
           lambda: P.decode_result(one_read.whole_frame(none_result)[1]))
    to_wire = Converter().all_to_wire  # what a session's Function passes: plain values stay as they are
    yield ("CALL echo(1), to_wire given", lambda: P.encode_call(3, (1,), 1 << 20, to_wire),
           lambda: P.encode_call(3, to_wire((1,)), 1 << 20))
    yield from conversions()


def conversions():
    """A kernel call's two tensor arguments converted by each side's own ``all_*_wire`` (vs the
    shared Converter's, which looks for a value that is not plain first)."""
    import socket

    from kernelrpc import runtime
    from kernelrpc.rpc.client import RPCSession
    from kernelrpc.rpc.remote import Tensor as RemoteTensor
    from kernelrpc.wire.requests import OPTIONAL_OPS
    from kernelrpc.server.handler import HandleTable

    table = HandleTable()
    device = DeviceValue("cpu", 0)
    handles = [TensorHandle(table.put(runtime.Tensor((1,), "float32")), "float32", (1,), device)
               for _ in range(2)]
    yield ("server: f(a, b)'s tensors", lambda: table.all_from_wire(handles),
           lambda: Converter.all_from_wire(table, handles))
    mine, peer = socket.socketpair()  # the session only converts: nothing is sent
    session = RPCSession(mine, _checked_info({"ops": [int(op) for op in OPTIONAL_OPS]}), "bench")
    tensors = tuple(RemoteTensor(session, handle) for handle in handles)
    yield ("client: f(a, b)'s tensors", lambda: session.all_to_wire(tensors),
           lambda: Converter.all_to_wire(session, tensors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print(f"{'':28}{'fast ns':>10}{'general ns':>12}{'gain ns':>10}")
    for name, fast, general in pairs():
        f, g = (min(timeit.repeat(fn, number=args.number, repeat=args.repeat)) / args.number * 1e9
                for fn in (fast, general))
        print(f"{name:28}{f:10.0f}{g:12.0f}{g - f:10.0f}")


if __name__ == "__main__":
    main()
