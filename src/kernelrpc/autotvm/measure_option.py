"""Where and how a tuner measures: ``measure_option(builder=LocalBuilder(), runner=RPCRunner(...))``."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class LocalBuilder:
    """Builds on this host: ``executor`` is any ``concurrent.futures.Executor`` (None: a process
    pool over the cores this process may use, or a Dask cluster's ``get_executor()``)."""

    executor: object = None


@dataclasses.dataclass
class RPCRunner:
    """Runs on the devices of ``key`` at the tracker ``host:port`` (every free one at once);
    a board that goes away is waited for up to ``board_wait`` seconds while none is left."""

    key: str
    host: str
    port: int
    number: int = 3
    repeat: int = 3
    min_repeat_ms: float = 0
    timeout: float = 60.0
    session_timeout: float = 600.0
    max_devices: int | None = None
    priority: int = 1
    rtol: float = 1e-4
    atol: float = 1e-4
    board_wait: float = 120.0


def measure_option(builder=None, runner=None) -> dict:
    if not isinstance(runner, RPCRunner):
        raise TypeError("measure_option needs runner=autotvm.RPCRunner(key, host, port, ...)")
    return {"builder": builder or LocalBuilder(), "runner": runner}
