"""The device server's options (one field per command-line flag)."""
from __future__ import annotations

import dataclasses
import os

from ..rpc.protocol import DEFAULT_MAX_FRAME_BYTES


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
    handshake_timeout: float = 10.0       # a silent peer is dropped after this long
    max_pending: int = 256                # connections in the handshake or waiting for a slot
    max_sessions: int = 1                 # sessions at a time; more would disturb measurements
    workspace_root: str | None = None     # parent of per-session temp dirs (default: system temp)
    tracker_addr: tuple[str, int] | None = None
    custom_addr: str | None = None
    through_proxy: bool = False           # --host/--port name a proxy to connect out to
    cpus: tuple[int, ...] | None = None   # --cpus: the cores the server and its sessions run on

    def confine(self) -> None:
        """Pin this process (and so every session it forks) to ``cpus``."""
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)

    def effective_timeout(self, client_timeout: float | None) -> float | None:
        """The session's time limit: the smaller of the client's and the server's, if any."""
        limits = [t for t in (client_timeout, self.session_timeout) if t]
        return min(limits) if limits else None


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
