"""The device record a server behind a proxy sends in its handshake key, and its checks.

A server registered with a tracker sends its record (``runtime.device_info.describe()``) in
UPDATE_INFO itself.  A server behind a proxy has only its handshake key to speak with, so it
appends the record as one more ``-name=value`` option::

    server:rpi4 -protocol=kernelrpc/1 -device=eNqrVspMUbJSUEos...

The value is the compact JSON, zlib-compressed and base64url-encoded without padding: one
token with no spaces or ``=``, so TVM's proxy (which takes the first word of the key) and
kernelrpc proxies that predate it ignore it, and every client still reads the key within
its 4096-byte bound.  Our proxy decodes it with :func:`decode`, which bounds and checks
everything (:data:`FIELDS`) before the record goes to the tracker.

Stdlib only: the device server imports it.
"""
from __future__ import annotations

import base64
import binascii
import json
import logging

log = logging.getLogger(__name__)

OPTION = "device"
MAX_OPTION_CHARS = 2048
"""Bound on the encoded value: with the rest of the key it stays far below the 4096-byte key bound."""
MAX_RECORD_BYTES = 8192
"""Bound on the decompressed JSON (a record is 1-2 KB; this stops a compression bomb)."""

# field -> (type, bound): the longest text, the most list items, or the largest integer
FIELDS = {
    "machine": (str, 64), "system": (str, 64), "python": (str, 32), "cpu_model": (str, 200),
    "target": (str, 1024), "cpu": (str, 64), "kernel_machine": (str, 64),
    "cpus": (int, 1 << 16), "features": (list, 256), "cpuinfo_foreign": (bool, None),
}
REQUIRED = ("machine", "target")
MAX_FEATURE_CHARS = 64
_BASE64URL = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


class BadRecord(ValueError):
    """A ``-device=`` value that cannot be used; the message says why."""


def encode(record: dict) -> str:
    """The ``-device=`` value for ``record``; without ``features`` if the whole one is too long
    (``target`` names the features code generation uses).  Raises BadRecord if even that is."""
    import zlib    # here: a Python built without zlib still serves, without the record (key_option)

    check(record)       # what the proxy would refuse is not sent
    for candidate in (record, {k: v for k, v in record.items() if k != "features"}):
        text = json.dumps(candidate, separators=(",", ":"), sort_keys=True).encode()
        value = base64.urlsafe_b64encode(zlib.compress(text, 9)).rstrip(b"=").decode()
        if len(value) <= MAX_OPTION_CHARS and len(text) <= MAX_RECORD_BYTES:
            if candidate is not record:
                log.info("device record sent without its %d CPU features (too long for the key)",
                         len(record.get("features", ())))
            return value
    raise BadRecord(f"the device record is too long for the key ({MAX_OPTION_CHARS} characters, "
                    f"{MAX_RECORD_BYTES} bytes of JSON) even without its features")


def key_option(record: dict) -> str:
    """``" -device=VALUE"`` to append to a ``server:`` key, or ``""`` (logged) if it cannot be sent."""
    try:
        return f" -{OPTION}={encode(record)}"
    except (BadRecord, ImportError, TypeError, ValueError) as exc:
        log.warning("the proxy will not learn this device's record: %s", exc)
        return ""


def shorten(key: str) -> str:
    """``key`` for a log line: a ``-device=`` value is cut to its start and its length."""
    head = f" -{OPTION}="
    before, sep, rest = key.partition(head)
    if not sep or len(rest) <= 24:
        return key
    value, space, after = rest.partition(" ")
    return f"{before}{head}{value[:16]}...({len(value)} chars){space}{after}"


def decode(value: str) -> tuple[dict, list[str]]:
    """The checked record in a ``-device=`` value, and the names of unknown fields left out
    (the first 16).

    Raises BadRecord when the value is not base64url, not zlib, longer than its bounds, not a
    JSON object, misses ``machine`` or ``target``, or has a known field of the wrong type or size.
    """
    import zlib

    if len(value) > MAX_OPTION_CHARS:
        raise BadRecord(f"-{OPTION}= is {len(value)} characters, the limit is {MAX_OPTION_CHARS}")
    if not _BASE64URL.issuperset(value):
        raise BadRecord(f"-{OPTION}= has characters outside base64url")
    try:
        packed = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        inflater = zlib.decompressobj()
        text = inflater.decompress(packed, MAX_RECORD_BYTES + 1)
    except (binascii.Error, ValueError, zlib.error) as exc:
        raise BadRecord(f"-{OPTION}= is not base64url-encoded zlib data ({exc})") from None
    if len(text) > MAX_RECORD_BYTES or inflater.unconsumed_tail:
        raise BadRecord(f"-{OPTION}= expands to more than {MAX_RECORD_BYTES} bytes")
    if not inflater.eof:
        raise BadRecord(f"-{OPTION}= is truncated zlib data")
    try:
        record = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:      # deep nesting: RecursionError
        raise BadRecord(f"-{OPTION}= is not JSON ({exc})") from None
    return check(record)


def check(record) -> tuple[dict, list[str]]:
    """``record`` with its known fields checked (see :func:`decode`), and the unknown names."""
    if not isinstance(record, dict):
        raise BadRecord(f"the device record is a JSON {type(record).__name__}, not an object")
    missing = [name for name in REQUIRED if name not in record]
    if missing:
        raise BadRecord(f"the device record has no {' or '.join(missing)}")
    out, unknown = {}, []
    for name, value in record.items():
        if name not in FIELDS:
            if len(unknown) < 16:
                unknown.append(name[:64])
            continue
        kind, bound = FIELDS[name]
        if type(value) is not kind:
            raise BadRecord(f"device field {name!r} is {type(value).__name__}, not {kind.__name__}")
        if kind is str and (len(value) > bound or not value.isprintable()):
            raise BadRecord(f"device field {name!r} is longer than {bound} characters or unprintable")
        if kind is int and not 0 < value <= bound:
            raise BadRecord(f"device field {name!r} is {value}, outside [1, {bound}]")
        if kind is list and (len(value) > bound or not all(
                type(f) is str and 0 < len(f) <= MAX_FEATURE_CHARS and f.isprintable() for f in value)):
            raise BadRecord(f"device field {name!r} is not a list of at most {bound} short names")
        out[name] = value
    return out, sorted(unknown)
