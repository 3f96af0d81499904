"""Every board of some keys at once (``python -m kernelrpc.model NET --all-devices``).

The tracker's summary says how many servers each key has; that many requests, each held
until all are granted, give one session per board (a server with a session running is handed
to nobody else). The boards are grouped by the target they build for, the network is built
once per group, and every board is measured in its own thread, in its own session, at the same
time. A board that fails (it left, it crashed) is reported as such; the others go on.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging

from .errors import TrackerError
from .rpc.tracker_client import count_servers

log = logging.getLogger(__name__)

MAX_KEYS = 64
MAX_BOARDS = 256


@dataclasses.dataclass
class Board:
    key: str
    remote: object

    @property
    def address(self) -> str:
        return getattr(self.remote, "address", "?")


def keys_of(text: str) -> list[str]:
    """``"rpi4,rpi5"`` -> ``["rpi4", "rpi5"]`` (each once, in order)."""
    keys = list(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    if not keys:
        raise ValueError("--key: give one device key or several separated by commas")
    if len(keys) > MAX_KEYS:
        raise ValueError(f"--key: at most {MAX_KEYS} keys, got {len(keys)}")
    return keys


@contextlib.contextmanager
def open_boards(tracker, keys: list[str], *, session_timeout: float = 0,
                request_timeout: float | None = None):
    """A session with every board of ``keys`` (a list of :class:`Board`), all closed on exit."""
    counts = count_servers(tracker.summary())
    missing = [k for k in keys if not counts.get(k)]
    if missing:
        raise TrackerError(f"no server has key{'s' * (len(missing) > 1)} {', '.join(map(repr, missing))} "
                           f"at tracker {tracker.where}; keys with servers: "
                           f"{', '.join(sorted(counts)) or 'none'}")
    boards: list[Board] = []
    try:
        for key in keys:
            for _ in range(min(counts[key], MAX_BOARDS - len(boards))):
                remote = tracker.request(key, session_timeout=session_timeout, timeout=request_timeout)
                if any(b.remote.address == remote.address for b in boards):   # a server of several slots
                    remote.close()
                    continue
                boards.append(Board(key, remote))
        yield boards
    finally:
        for board in boards:
            board.remote.close()


def measure_all(boards: list[Board], target_of, build, measure) -> list[tuple[Board, object]]:
    """``measure(board, build(target, index, count))`` on every board at once, with one
    ``build`` per distinct ``target_of(board)``: ``(board, result or the exception)`` per board."""
    groups: dict = {}
    outcomes = []
    for board in boards:
        try:
            groups.setdefault(target_of(board), []).append(board)
        except Exception as exc:  # noqa: BLE001 - a board gone before it said its target
            log.debug("board %s failed", board.address, exc_info=True)
            outcomes.append((board, exc))
    artifacts = {target: build(target, i, len(groups)) for i, target in enumerate(groups)}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(boards) or 1) as pool:
        futures = [(board, pool.submit(measure, board, artifacts[target]))
                   for target, group in groups.items() for board in group]
    for board, future in futures:
        try:
            outcomes.append((board, future.result()))
        except Exception as exc:  # noqa: BLE001 - one board's failure is its row, not the run's end
            log.debug("board %s failed", board.address, exc_info=True)
            outcomes.append((board, exc))
    return outcomes


def comparison(boards: list[dict]):
    """The boards side by side (a ``display.Table``): what each is and its latency."""
    from .display import Table, format_time

    rows = [[b["board"], b.get("key", ""), b["facts"].get("cpu_model") or b["facts"].get("machine", "?"),
             b["facts"].get("cpus", "?"), format_time(b["p50"]), format_time(b["p90"]), format_time(b["p99"]),
             f"{b['peak_rss_bytes'] / 1e6:.1f}" if b.get("peak_rss_bytes") else "-",
             "; ".join(b["flags"]) or "-"] for b in boards]
    return Table(["board", "key", "cpu", "cores", "p50", "p90", "p99", "peak MB", "flags"], rows,
                 title=f"{len(boards)} board{'s' * (len(boards) != 1)} side by side:")
