"""Each side's CPU per remote call, in one process: ``echo(1)`` and a kernel call ``f(a, b)``.

    PYTHONPATH=src python bench/call_path.py [--blocks B] [--calls N]

The server's side is its request loop (``SessionHandler.serve``) fed the CALL frame by a canned
socket; the client's side is a remote ``Function`` whose socket answers with the canned RETURN.
The sockets' reads and writes are C-level callables, so only each side's Python is timed
(``time.thread_time``; best and first quartile of ``blocks`` blocks of ``calls`` calls, in ns per
call). ``f`` is a 1-element ``addone`` built by kernelrpc. The server keeps a kernel's call with
the same tensor handles prepared from its second call in a row; the row "unprepared" is the same
loop with no call kept (each converts its handles and fills the argument array again), and
"alternating" calls ``f(a, b)`` and ``f(b, a)`` in turn, which are never prepared. The client
sends the CALL frame it kept for the same live tensors again (remote.KernelFunction); its row
"alternating" takes turns in the same way, so every call converts and encodes its tensors. A
real round trip costs each side more than this (its code and data are out of the caches after
the other side ran); compare rows, and trees, in one run.
"""
from __future__ import annotations

import argparse
import collections
import functools
import itertools
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kernelrpc import runtime  # noqa: E402
from kernelrpc.errors import ConnectionLost  # noqa: E402
from kernelrpc.wire import protocol as P  # noqa: E402
from kernelrpc.rpc.client import RPCSession  # noqa: E402
from kernelrpc.rpc.remote import Function, KernelFunction  # noqa: E402
from kernelrpc.rpc.remote import Tensor as RemoteTensor  # noqa: E402
from kernelrpc.wire.requests import OPTIONAL_OPS  # noqa: E402
from kernelrpc.wire.transport import FramedSocket  # noqa: E402
from kernelrpc.wire.values import DeviceValue, FunctionHandle, TensorHandle  # noqa: E402
from kernelrpc.server import registry  # noqa: E402
from kernelrpc.server.config import ServerConfig  # noqa: E402
from kernelrpc.server.handler import SessionHandler  # noqa: E402


class CannedSocket:
    """``recv`` hands out ``reads`` one by one, ``sendall`` keeps the last write; both C-level."""

    def __init__(self, reads) -> None:
        self.recv = functools.partial(next, reads)
        self.sendall = collections.deque(maxlen=1).append


class NeverKept(dict):
    """A handler's kernel calls, never kept: every kernel call takes the unprepared path."""

    def __setitem__(self, key, value) -> None:
        pass


def build_addone(directory: str) -> str:
    import kernelrpc
    from kernelrpc import te

    a = te.placeholder((1,), name="A")
    b = te.compute((1,), lambda i: a[i] + 1.0, name="B")
    path = os.path.join(directory, "addone.so")
    kernelrpc.build(te.create_schedule(b.op), [a, b], target="llvm", name="addone").export_library(path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    config = ServerConfig()
    device = DeviceValue("cpu", 0)
    with tempfile.TemporaryDirectory() as tmp:
        kernel = runtime.load_module(build_addone(tmp)).get_function("addone")

    sock = CannedSocket(iter(()))
    handler = SessionHandler(FramedSocket(sock, config.max_frame_bytes), None, config)
    unprepared = SessionHandler(FramedSocket(sock, config.max_frame_bytes), None, config)
    unprepared._kernel_calls = NeverKept()
    frames = {}
    for name, h in (("", handler), (", unprepared", unprepared)):
        a, b = (TensorHandle(h.handles.put(runtime.Tensor((1,), "float32")), "float32", (1,), device)
                for _ in range(2))
        echo_id, kernel_id = h.handles.put(registry.get("testing.echo")), h.handles.put(kernel)
        if not name:
            frames["server echo(1)"] = h, [P.encode_call(echo_id, (1,))]
        frames[f"server f(a, b){name}"] = h, [P.encode_call(kernel_id, (a, b))]
        if not name:
            frames["server f(a, b), alternating"] = h, [P.encode_call(kernel_id, (a, b)),
                                                       P.encode_call(kernel_id, (b, a))]

    def serve(h: SessionHandler, cycle: list) -> float:
        reads = itertools.islice(itertools.cycle(cycle), args.calls)
        sock.recv = functools.partial(next, itertools.chain(reads, [b""]))
        start = time.thread_time_ns()
        try:
            h.serve()
        except ConnectionLost:  # the canned socket's end
            pass
        return (time.thread_time_ns() - start) / args.calls

    info = {"session_timeout": 0, "max_frame_bytes": config.max_frame_bytes,
            "max_upload_bytes": config.max_upload_bytes, "max_tensor_bytes": config.max_tensor_bytes,
            "max_session_bytes": config.max_session_bytes, "max_client_tensors": config.max_client_tensors,
            "ops": [op.value for op in OPTIONAL_OPS], "globals": []}
    echo_session = RPCSession(CannedSocket(itertools.repeat(P.encode_result(1))), info, "canned")
    kernel_session = RPCSession(CannedSocket(itertools.repeat(P.encode_result(None))), info, "canned")
    echo = Function(echo_session, FunctionHandle(3), "testing.echo")
    f = KernelFunction(kernel_session, FunctionHandle(4), "addone")   # a module's function
    tensors = [RemoteTensor(kernel_session, TensorHandle(5 + i, "float32", (1,), device)) for i in range(2)]

    def call(fn, *fn_args) -> float:
        """CPU per call of ``fn``, called with each of ``fn_args`` in turn."""
        arg_lists = list(itertools.islice(itertools.cycle(fn_args), args.calls))
        start = time.thread_time_ns()
        for arg_list in arg_lists:
            fn(*arg_list)
        return (time.thread_time_ns() - start) / args.calls

    rows = {name: functools.partial(serve, h, cycle) for name, (h, cycle) in frames.items()}
    rows["client echo(1)"] = functools.partial(call, echo, (1,))
    rows["client f(a, b)"] = functools.partial(call, f, tensors)
    rows["client f(a, b), alternating"] = functools.partial(call, f, tensors, tensors[::-1])
    samples = {name: [] for name in rows}
    for _ in range(args.blocks):
        for name, run in rows.items():
            samples[name].append(run())
    print(f"CPU per call, in one process (best / first quartile of {args.blocks} blocks of {args.calls}), ns")
    for name, values in samples.items():
        values.sort()
        print(f"{name:30}{values[0]:8.0f}{values[len(values) // 4]:8.0f}")


if __name__ == "__main__":
    main()
