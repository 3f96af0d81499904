"""Typed errors a user can act on.

Every failure that crosses the network derives from :class:`RPCError`, so
``except kernelrpc.RPCError`` catches all of them; the subclasses say what went
wrong and what to try next.
"""
from __future__ import annotations


class RPCError(Exception):
    """Base class of every error raised by kernelrpc's networking code."""


class ProtocolError(RPCError):
    """The peer sent bytes that do not follow the protocol (bad magic, bad length, bad message)."""


class VersionMismatch(ProtocolError):
    """The peer speaks another session protocol or another version of ours."""

    def __init__(self, message: str, *, ours: str = "", theirs: str = ""):
        super().__init__(message)
        self.ours = ours
        self.theirs = theirs


class HandshakeError(RPCError):
    """The connection handshake failed (key mismatch, duplicate key, not an RPC peer)."""


class AuthenticationError(RPCError):
    """The peer or the service could not prove it knows the shared auth token (or has none)."""


class ConnectionLost(RPCError):
    """The connection closed or broke in the middle of an exchange."""


class RemoteError(RPCError):
    """An exception raised on the device, with its type name and traceback text."""

    def __init__(self, type_name: str, message: str, traceback_text: str = ""):
        self.type_name = type_name
        self.remote_message = message
        self.traceback_text = traceback_text
        text = f"{type_name}: {message}"
        if traceback_text:
            text += "\n\nRemote traceback:\n" + traceback_text.rstrip()
        super().__init__(text)


class AllocationFailed(RemoteError):
    """A tensor that ``empty()`` allocated without waiting for the server's reply (a pipelined
    allocation) could not be allocated on the device; raised by the first request that uses it,
    with the allocation's own error in the message and traceback."""


class ServerCrashed(RPCError):
    """The session's child process died (signal or exit code) before it answered."""

    def __init__(self, message: str, *, signal: int | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.signal = signal
        self.exit_code = exit_code


class SessionTimeout(RPCError):
    """The session outlived its ``session_timeout`` and the server ended it."""


class TrackerError(RPCError):
    """The tracker refused a request or answered something unexpected."""


class QueueTimeout(TrackerError):
    """No server for the requested key became free within the request's timeout."""


class ConnectTimeout(RPCError):
    """Connecting to a tracker, proxy or server did not finish in time."""


class ModuleError(ValueError):
    """A file is not a loadable kernelrpc module (bad metadata, newer format, missing symbol)."""


#: What the compiler's kernels mean by their non-zero return codes.
KERNEL_ERROR_CODES = {
    2: "out of memory",
    3: "index out of bounds (a tir.instrument_bound_checkers check failed)",
}


class KernelError(RuntimeError):
    """A kernel function returned a non-zero error code."""

    def __init__(self, function: str, code: int):
        meaning = KERNEL_ERROR_CODES.get(code)
        super().__init__(f"kernel function {function!r} failed with error code {code}"
                         + (f": {meaning}" if meaning else ""))
        self.function = function
        self.code = code


class GraphInputError(ValueError):
    """A value given to a network (``set_input``) has an unknown name or the wrong shape or
    dtype; the message says what the network expects."""


class NetworkTooLarge(MemoryError):
    """A network's tensors (inputs, outputs, weights, activations) do not fit in what the device
    allows; the message gives each part's size and the device's own refusal."""
