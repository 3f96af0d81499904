"""What a board's measurement needs before anyone trusts it: its latency percentiles, and the
flags that say why not (emulated, hot, throttled, disturbed).

Works on the plain dicts the device reports (``runtime.device_info.board_report``), so a
result read back from the database is judged the same way as a fresh one.
"""
from __future__ import annotations

import math

EMULATED = "emulated: not the board's speed"
HOT_C = 80.0
"""A board at or above this temperature (°C) is flagged hot: most boards' CPUs start to lower
their clock between 80 and 85 °C."""


def percentiles(samples: list[float], points=(50, 90, 99)) -> dict[str, float]:
    """``{"p50": ..., "p90": ..., "p99": ...}`` of ``samples`` (linear between the closest
    ranks, as numpy's default)."""
    ordered = sorted(samples)
    if not ordered or not all(math.isfinite(s) for s in ordered):
        raise ValueError("percentiles need at least one finite sample")
    out = {}
    for p in points:
        rank = (len(ordered) - 1) * p / 100
        low = math.floor(rank)
        high = min(low + 1, len(ordered) - 1)
        out[f"p{p}"] = ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
    return out


def flags(facts: dict, before: dict, after: dict, disturbed: list[str] = ()) -> list[str]:
    """Why this board's timings may not be its normal speed; empty when nothing says so."""
    out = [EMULATED] if facts.get("emulated") else []
    hottest = max((s.get("temp_c") for s in (before, after) if isinstance(s.get("temp_c"), (int, float))),
                  default=None)
    if hottest is not None and hottest >= HOT_C:
        out.append(f"hot: {hottest:.0f} °C")
    now = sorted({name for s in (before, after) for name in s.get("throttled_now", ())})
    if now:
        out.append(f"throttled: {', '.join(now)}")
    events = [s.get("throttle_events") for s in (before, after)]
    if all(isinstance(e, int) for e in events) and events[1] > events[0]:
        out.append(f"throttled: {events[1] - events[0]} thermal throttling events during the run")
    out += [f"disturbed: {reason}" for reason in disturbed]
    return out


def state_text(state: dict) -> str:
    """One line of a board's state (what /sys exposed), for the board's table."""
    parts = []
    if "governor" in state:
        parts.append(f"governor {state['governor']}")
    if "cur_mhz" in state:
        low, high = state["cur_mhz"]
        parts.append(f"{low:.0f}" + (f"-{high:.0f}" if high != low else "") + " MHz"
                     + (f" (range {state.get('min_mhz', 0):.0f}-{state['max_mhz']:.0f})" if "max_mhz" in state else ""))
    if "temp_c" in state:
        parts.append(f"{state['temp_c']:.1f} °C")
    if state.get("throttled_now"):
        parts.append("throttled now: " + ", ".join(state["throttled_now"]))
    if state.get("throttled_since_boot"):
        parts.append("throttled since boot: " + ", ".join(state["throttled_since_boot"]))
    if "throttle_events" in state:
        parts.append(f"{state['throttle_events']} throttling events since boot")
    return "; ".join(parts) or "no frequency, temperature or throttling exposed"
