"""The device server's options (one field per command-line flag)."""
from __future__ import annotations

import dataclasses
import os

from ..wire.protocol import DEFAULT_MAX_FRAME_BYTES
from ..wire.tls import TLSConfig
from .privileges import SessionUser


@dataclasses.dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 9090
    port_end: int = 9199
    key: str = ""
    session_timeout: float = 0.0          # seconds; 0 = only the client's -timeout= applies
    max_upload_bytes: int = 1 << 30
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_tensor_bytes: int = 8 << 30       # largest single tensor a client may allocate
    max_session_bytes: int = dataclasses.field(default_factory=lambda: default_session_bytes())
    max_client_tensors: int = 1 << 16     # tensors and functions a session may hold under ids its client chose (ALLOCATE, GLOBAL_AT)
    idle_timeout: float = 600.0           # a session with no request for this long ends (0 = never)
    io_timeout: float = 30.0              # a frame or transfer stalled this long ends the session (0 = never)
    min_transfer_rate: int = 16 << 10     # bytes/s an upload or copy must keep, after io_timeout (0 = any)
    checked_tensors: bool = False         # pads around tensors, checked after each call (canary.py)
    handshake_timeout: float = 10.0       # a silent peer is dropped after this long
    max_pending: int = 256                # connections in the handshake or waiting for a slot
    max_sessions: int = 1                 # sessions at a time; more would disturb measurements
    spare_session: bool = True            # a session child forked and warmed ahead (spare.py)
    workspace_root: str | None = None     # parent of per-session temp dirs (default: system temp)
    tracker_addr: tuple[str, int] | None = None
    custom_addr: str | None = None
    through_proxy: bool = False           # --host/--port name a proxy to connect out to
    cpus: tuple[int, ...] | None = None   # --cpus: the cores the server and its sessions run on
    session_user: SessionUser | None = None  # --run-as: who session children run as (None: us)
    auth_token: bytes | None = dataclasses.field(default=None, repr=False)  # --auth-token-file
    tls: TLSConfig | None = None          # --tls-*: clients, the tracker link and the proxy link

    def confine(self) -> None:
        """Pin this process (and so every session it forks) to ``cpus``."""
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)

    def socket_timeout(self) -> float:
        """What each receive or send of a session may wait (0: forever)."""
        limits = [t for t in (self.idle_timeout, self.io_timeout) if t]
        return min(limits) if limits else 0.0

    def effective_timeout(self, client_timeout: float | None) -> float | None:
        """The session's time limit: the smaller of the client's and the server's, if any."""
        limits = [t for t in (client_timeout, self.session_timeout) if t]
        return min(limits) if limits else None


def default_session_bytes() -> int:
    """Tensor bytes one session may hold at a time by default: three quarters of the memory."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") * 3 // 4
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def parse_cpus(text: str) -> tuple[int, ...]:
    """``"0"``, ``"0,2"`` or ``"0-3,6"`` as a sorted tuple of core numbers."""
    cores: set[int] = set()
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ValueError(f"--cpus takes core numbers and ranges such as 0,2-3, got {text!r}")
        cores.update(range(int(low), int(high if sep else low) + 1))
    if not cores or len(cores) > 4096:
        raise ValueError(f"--cpus names no cores or too many: {text!r}")
    return tuple(sorted(cores))
