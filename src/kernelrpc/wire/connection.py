"""The session connection, one object per side: bytes in, requests or replies out, and back.

After the hello (``hello.py``) a session is frames (``protocol.py``). Each side holds one
connection that owns them, sans-IO like h11's ``Connection``: the socket stays in a thin layer
above it (the client's ``rpc/channel.py``, the server's ``server/handler.py``; the transport,
``transport.py``, reads into the connection, which is its frame reader), and the connection
splits the bytes into frames, keeps the frame limit, turns frames into requests or replies and
requests or replies into bytes, and counts what both ends count against the server's limits
(:class:`SessionAccount`).

Each side's fast lane sits beside its general path, named, and gives what the general path
gives on every input (tests/test_session_connection.py):

* :meth:`ServerConnection.call_from_read` beside :meth:`ServerConnection.request_of`: a CALL that
  is one whole read, decoded straight from it; a call whose frame is byte for byte the one the
  server kept for its function (:meth:`ServerConnection.keep_call`) is a :class:`RepeatedCall`,
  not decoded at all;
* :meth:`ClientConnection.result_from_read` beside :meth:`ClientConnection.result_of`: a RETURN
  that is one whole read, decoded straight from it.
"""
from __future__ import annotations

import operator

from ..errors import AllocationFailed, ProtocolError, RemoteError
from .protocol import (ALLOCATE, CALL, ERROR, FRAME_NAMES, GLOBAL_AT, HEADER_SIZE, NOTICE, RELEASE, REQUEST, RETURN,
                       FrameReader, decode_data_header, decode_error, decode_notice, decode_request, decode_result,
                       encode, encode_request, notice_error)  # ops as ints:
# reading ``Op.RELEASE`` costs ~0.3 us on a per-request path
from .protocol import (CALL_HEAD, CALL_HEAD_SIZE, CALL_INT_FRAME_SIZE, CALL_INT_PREFIX, FRAME_HEADER,  # frame layouts
                       NONE_RESULT, OP_OFFSET, RESULT_INT_FRAME_SIZE, RESULT_INT_PREFIX, unpack_call_int_frame,
                       unpack_result_int_frame)
from .requests import CLIENT_IDS_FIRST, CLIENT_IDS_LAST, OPTIONAL_OPS, Call, Free, Op
from .values import T_FUNCTION, T_INT, FunctionHandle, TensorHandle, decode_items, decode_values

MAX_KEPT_CALLS = 64   # calls kept for RepeatedCall (one per function), per session
MAX_QUEUED = 256      # frees, ALLOCATEs and GLOBAL_ATs held for the next request at most
_MAX_OPS_LISTED = 256
_ID = operator.attrgetter("id")


class SessionAccount:
    """The bytes of a session's tensors and its entries under ids the client chose, counted as
    both ends count them against the server's ``max_tensor_bytes``, ``max_session_bytes`` and
    ``max_client_tensors``: the server to refuse, the client to know what the server will accept
    without asking (a pipelined ``empty()`` or ``get_function``)."""

    __slots__ = ("max_tensor_bytes", "max_session_bytes", "max_client_tensors", "tensor_bytes",
                 "client_tensors", "_sizes")

    def __init__(self, max_tensor_bytes: int, max_session_bytes: int, max_client_tensors: int) -> None:
        self.max_tensor_bytes = max_tensor_bytes
        self.max_session_bytes = max_session_bytes
        self.max_client_tensors = max_client_tensors
        self.tensor_bytes = 0       # of the live tensors counted
        self.client_tensors = 0     # entries under the client's ids (a failed ALLOCATE's too)
        self._sizes: dict[int, int] = {}    # every entry counted: id -> bytes (0: a function, a failure)

    def bytes_refused(self, nbytes: int) -> str | None:
        """Why a new tensor of ``nbytes`` is beyond the limits, or None."""
        if nbytes > self.max_tensor_bytes:
            return (f"tensor of {nbytes} bytes exceeds the server's limit of {self.max_tensor_bytes} bytes "
                    "(max_tensor_bytes)")
        if self.tensor_bytes + nbytes > self.max_session_bytes:
            return (f"a tensor of {nbytes} bytes would bring this session's tensors to "
                    f"{self.tensor_bytes + nbytes} bytes, beyond the server's limit of "
                    f"{self.max_session_bytes} bytes per session (--max-session-bytes); "
                    "free tensors you no longer need")
        return None

    def entry_refused(self) -> str | None:
        """Why one more entry under the client's ids is beyond the limit, or None."""
        if self.client_tensors >= self.max_client_tensors:
            return (f"the client holds {self.client_tensors} tensors and functions under ids it chose, "
                    "the server's limit (max_client_tensors)")
        return None

    def admit(self, handle_id: int, nbytes: int) -> bool:
        """Fast lane of ``bytes_refused`` and ``entry_refused`` for the client's pipelined requests:
        whether a new entry of ``nbytes`` under the client's id ``handle_id`` is within the limits,
        and then counted (the same tests, without building the reason)."""
        if (nbytes > self.max_tensor_bytes or self.tensor_bytes + nbytes > self.max_session_bytes
                or self.client_tensors >= self.max_client_tensors):
            return False
        self._sizes[handle_id] = nbytes
        self.tensor_bytes += nbytes
        self.client_tensors += 1
        return True

    def add(self, handle_id: int, nbytes: int) -> None:
        """Count the entry ``handle_id`` of ``nbytes`` (an entry under a client's id counts once)."""
        self._sizes[handle_id] = nbytes
        self.tensor_bytes += nbytes
        if handle_id >= CLIENT_IDS_FIRST:
            self.client_tensors += 1

    def remove(self, handle_id: int) -> None:
        """Uncount ``handle_id`` (nothing if it is not counted)."""
        nbytes = self._sizes.pop(handle_id, None)
        if nbytes is not None:
            self.tensor_bytes -= nbytes
            if handle_id >= CLIENT_IDS_FIRST:
                self.client_tensors -= 1

    def remove_all(self, handle_ids: list) -> None:
        """Uncount each of ``handle_ids`` (one call for a client's queue, which holds hundreds)."""
        for handle_id in handle_ids:
            if handle_id in self._sizes:
                self.remove(handle_id)


# ---------------------------------------------------------------- the server's side

class RepeatedCall:
    """A CALL whose frame is byte for byte the one kept for its function (``keep_call``): the
    same function and the same arguments, which the server has converted (and perhaps prepared)
    before, so the connection does not decode it. The type states what used to be a contract
    between layers (the decoder's memos handing out the very same objects for the same bytes).
    Treated as immutable; a plain slotted class (a NamedTuple's class costs ~0.1 ms to import)."""

    __slots__ = ("function_id", "frame", "args", "prepared")

    def __init__(self, function_id: int, frame: bytes, args: list, prepared=None) -> None:
        self.function_id = function_id
        self.frame = frame          # the whole CALL frame
        self.args = args            # its decoded arguments (tensor handles)
        self.prepared = prepared    # what the server attached to the call (its PreparedCall), or None


class ServerConnection(FrameReader):
    """The server's side of one session: requests out of the bytes it is fed, and the calls it
    keeps for :class:`RepeatedCall`. Replies are encoded by protocol.py's functions (the
    handler's operations make them)."""

    def __init__(self, max_frame_bytes: int, account: SessionAccount) -> None:
        super().__init__(max_frame_bytes)
        self.account = account
        #: function id -> its kept call; ``kept_ids``: the ids they name (a few more, maybe)
        self.kept: dict[int, RepeatedCall] = {}
        self.kept_ids: set[int] = set()
        self._call_frame = b""      # the last CALL frame read, repeated or not (what keep_call keeps)

    def call_from_read(self, data: bytes):
        """Fast lane of :meth:`request_of`: the CALL that ``data`` is, if it is exactly one whole
        CALL frame (what a measurement loop sends in one read), else None.

        It decodes straight from the read, without the frame reader's buffer and a copy of the
        body, a call with one int argument in one struct operation, as ``(function_id, args)``
        (a plain tuple, not a Call: building the NamedTuple cost ~0.1 us a message; a tuple of
        arguments is the one int). A kept call is its :class:`RepeatedCall`. None leaves
        everything else (part of a frame, several, another op, a bad header) to ``feed``,
        ``next_frame`` and ``request_of``, which judge it alike.
        """
        if len(data) == CALL_INT_FRAME_SIZE:
            prefix, function_id, value_tag, value = unpack_call_int_frame(data)
            if prefix == CALL_INT_PREFIX and value_tag == T_INT:
                return function_id, (value,)
        if len(data) < CALL_HEAD_SIZE or data[OP_OFFSET] != CALL:
            return None
        length, frame_type, _, count, tag, function_id = CALL_HEAD.unpack_from(data)
        if length + HEADER_SIZE != len(data) or frame_type != REQUEST or length > self.max_frame_bytes:
            return None
        if tag != T_FUNCTION or count == 0:
            raise ProtocolError("CALL needs a function handle first")
        self._call_frame = data
        kept = self.kept.get(function_id)
        if kept is not None and kept.frame == data:
            return kept
        return function_id, decode_items(data, CALL_HEAD_SIZE, count - 1)

    def request_of(self, body: bytes):
        """The request in a REQUEST frame's body (protocol.decode_request), a kept call's
        :class:`RepeatedCall`; ProtocolError if it does not check out."""
        request = decode_request(body)
        if type(request) is Call:
            self._call_frame = frame = FRAME_HEADER.pack(len(body), REQUEST) + body
            kept = self.kept.get(request.function_id)
            if kept is not None and kept.frame == frame:
                return kept
        return request

    def keep_call(self, function_id: int, args: list, prepared=None) -> None:
        """Keep the CALL just decoded (of ``function_id``, with the tensor handles ``args``) as its
        function's last, with ``prepared``: the same frame again is its RepeatedCall, until
        ``forget`` names the function or one of the tensors."""
        kept, ids = self.kept, self.kept_ids
        if len(kept) >= MAX_KEPT_CALLS and function_id not in kept:
            kept.clear()
            ids.clear()
        kept[function_id] = RepeatedCall(function_id, self._call_frame, args, prepared)
        ids.add(function_id)
        if prepared is not None:
            ids.update(map(_ID, args))

    def forget(self, handle_id: int) -> None:
        """Drop the kept call of the function ``handle_id`` and the kept calls with a tensor
        ``handle_id`` (the server dropped it: an id never names another object before)."""
        kept = self.kept
        kept.pop(handle_id, None)
        for function_id in [function_id for function_id, call in kept.items()
                            if any(arg.id == handle_id for arg in call.args)]:
            del kept[function_id]
        ids = self.kept_ids
        ids.clear()
        ids.update(kept)
        ids.update(arg.id for call in kept.values() if call.prepared is not None for arg in call.args)


# ---------------------------------------------------------------- the client's side

NOT_ONE_FRAME = object()
"""What ``ClientConnection.result_from_read`` returns for bytes that are not exactly one whole
RETURN frame."""


def served_optional_ops(info: dict) -> frozenset:
    """The optional requests the server lists in its hello (none from servers that predate them)."""
    listed = info.get("ops", [])
    if not isinstance(listed, list) or len(listed) > _MAX_OPS_LISTED:
        raise ProtocolError("session hello reply: ops is not a short list")
    return frozenset(op for op in OPTIONAL_OPS if op.value in listed)


class ClientConnection(FrameReader):
    """The client's side of one session, from the server's hello ``info``: replies out of the
    bytes it is fed, the error each failure reply stands for, and the frames that go out ahead
    of the next request (the queued frees, and the pipelined ALLOCATEs and GLOBAL_ATs, counted
    in :attr:`account` as the server will count them)."""

    def __init__(self, info: dict) -> None:
        super().__init__(int(info["max_frame_bytes"]))
        self.ops = ops = served_optional_ops(info)
        self.release_op = Op.RELEASE in ops
        self.account = SessionAccount(info["max_tensor_bytes"], info["max_session_bytes"],
                                      info["max_client_tensors"])
        #: Pipelined allocations: only with a server that announces its limits for them.
        self.allocate_op = (Op.ALLOCATE in ops and self.release_op and info["max_session_bytes"] > 0
                            and info["max_client_tensors"] > 0)
        #: Pipelined get_function (GLOBAL_AT): the names the server listed, with a server that has it.
        self.globals = (frozenset(info["globals"]) if Op.GLOBAL_AT in ops and self.release_op
                        and info["max_client_tensors"] > 0 else frozenset())
        self.queued: list = []       # handles to free, and ALLOCATE and GLOBAL_AT frames, in order
        self._seen = 0               # how far client_id has read ``queued``
        self._next_client_id = CLIENT_IDS_FIRST

    def serves(self, op: Op) -> bool:
        return op not in OPTIONAL_OPS or op in self.ops

    # ------------------------------------------------------------ what goes out ahead

    def release(self, handle) -> None:
        """Free ``handle`` with the next request (a list append: safe from a finalizer)."""
        self.queued.append(handle)

    def allocate(self, dtype: str, shape: tuple, device, nbytes: int | None) -> TensorHandle | None:
        """The handle of a new zero-filled tensor whose ALLOCATE is queued, if the server's checks
        will pass it; else None (the caller asks the server)."""
        if not self.allocate_op or nbytes is None or device.device_type != "cpu":
            return None
        handle_id = self._client_id(nbytes)
        if handle_id is None:
            return None
        handle = TensorHandle(handle_id, dtype, shape, device)
        self.queued.append(encode_request(ALLOCATE, [handle]))
        self._seen = len(self.queued)
        return handle

    def global_at(self, name: str) -> FunctionHandle | None:
        """The handle of the global function ``name``, whose GLOBAL_AT is queued, if the server
        listed ``name`` in its hello (the lookup cannot fail); else None."""
        if name not in self.globals:
            return None
        handle_id = self._client_id(0)
        if handle_id is None:
            return None
        handle = FunctionHandle(handle_id)
        self.queued.append(encode_request(GLOBAL_AT, [name, handle]))  # GlobalAt's wire values
        self._seen = len(self.queued)
        return handle

    def _client_id(self, nbytes: int) -> int | None:
        queued = self.queued
        if len(queued) > self._seen:   # freed since, as the server will see it first
            remove = self.account.remove
            for item in queued[self._seen:]:
                if type(item) is not bytes:
                    remove(item.id)
            self._seen = len(queued)
        handle_id = self._next_client_id
        if handle_id > CLIENT_IDS_LAST or not self.account.admit(handle_id, nbytes):
            return None
        self._next_client_id = handle_id + 1
        return handle_id

    def take_queued(self) -> tuple[bytes, bool]:
        """What goes out in front of the next request, and whether it is a FREE whose RETURN
        comes first (a server without RELEASE): the queued frees (as RELEASEs), ALLOCATEs and
        GLOBAL_ATs in the order they came, the freed entries uncounted."""
        queued, self.queued = self.queued, []
        self._seen = 0
        if not self.release_op:
            return encode(Free(tuple(queued))), True
        if not self.allocate_op and not self.globals:   # handles only, none counted
            return encode_request(RELEASE, [handle.id for handle in queued]), False
        parts, ids, freed = [], [], []
        for item in queued:
            if type(item) is bytes:
                if ids:
                    parts.append(encode_request(RELEASE, ids))
                    freed += ids
                    ids = []
                parts.append(item)
            else:
                ids.append(item.id)
        if ids:
            parts.append(encode_request(RELEASE, ids))
            freed += ids
        self.account.remove_all(freed)
        return b"".join(parts), False

    # ------------------------------------------------------------ replies

    def result_from_read(self, data: bytes):
        """Fast lane of :meth:`result_of`: the result in ``data`` if it is exactly one whole
        RETURN frame (one read), else NOT_ONE_FRAME (for ``feed`` and ``next_frame``, which judge
        it alike); a malformed value in a whole RETURN frame raises ProtocolError, as
        ``result_of`` does."""
        if len(data) == RESULT_INT_FRAME_SIZE:
            prefix, value = unpack_result_int_frame(data)
            if prefix == RESULT_INT_PREFIX:
                return value
        elif data == NONE_RESULT:  # a kernel's result
            return None
        if len(data) < HEADER_SIZE:
            return NOT_ONE_FRAME
        length, frame_type = FRAME_HEADER.unpack_from(data)
        if length + HEADER_SIZE != len(data) or frame_type != RETURN or length > self.max_frame_bytes:
            return NOT_ONE_FRAME
        return decode_result(data[HEADER_SIZE:])

    def result_of(self, frame: tuple[int, bytes]):
        """A CALL's result in its reply frame, or the error the frame stands for (``failure``)."""
        if frame[0] != RETURN:
            raise self.failure(frame, RETURN)
        return decode_result(frame[1])

    def reply_of(self, frame: tuple[int, bytes], frame_type: int):
        """The RETURN values or DATA length of a reply frame, or the error it stands for."""
        got, body = frame
        if got != frame_type:
            raise self.failure(frame, frame_type)
        if frame_type == RETURN:
            return decode_values(body)
        return decode_data_header(body)

    @staticmethod
    def failure(frame: tuple[int, bytes], frame_type: int) -> Exception:
        """The error that a reply other than the expected ``frame_type`` stands for: a RemoteError
        (or AllocationFailed) for an ERROR, after which the session goes on in step; anything else
        (a NOTICE's error, a ProtocolError) means the session is over."""
        got, body = frame
        if got == ERROR:
            type_name, message, traceback_text = decode_error(body)
            kind = AllocationFailed if type_name == "AllocationFailed" else RemoteError
            return kind(type_name, message, traceback_text)
        if got == NOTICE:
            return notice_error(*decode_notice(body))
        return ProtocolError(f"expected {FRAME_NAMES[frame_type]}, got {FRAME_NAMES[got]}")


__all__ = ["SessionAccount", "RepeatedCall", "ServerConnection", "ClientConnection", "NOT_ONE_FRAME",
           "served_optional_ops"]
