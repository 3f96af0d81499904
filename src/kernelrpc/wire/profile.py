"""The packed time_evaluator result (docs/protocol.md section 5.3): what a TIME_EVALUATOR_PACKED
function returns, a bytes value the client decodes into the same
:class:`~kernelrpc.runtime.profile.ProfileResult` a JSON result gives. The codec of
runtime/profile.py's result and runtime/conditions.py's dict, beside the frames
(:mod:`.protocol`) that carry it; the server encodes, the client decodes."""
from __future__ import annotations

import functools
import struct

from ..errors import ProtocolError
from ..runtime.conditions import MAX_CPU_NUMBER, MAX_CPUS, MAX_THREADS
from ..runtime.profile import MAX_RESULTS, ProfileResult

_PROFILE_HEAD = struct.Struct("<QI")    # number, repeat
_MAX_NUMBER = (1 << 63) - 1         # min_repeat_ms may grow number past the 2^31 a request allows
_MAX_TIME = 1.7976931348623157e308      # the largest finite double: ``r <= _MAX_TIME`` is False for inf and NaN
#: The conditions' fixed part: wall_s, own_cpu_s, other_cpu_s, other_load, the lowest and highest
#: freq_mhz, clock_tick_s (NaN for null), preempted (-1 for null), the number of cpus and threads.
_CONDITIONS = struct.Struct("<7dqHH")
_CONDITIONS_COUNTS = struct.Struct("<HH")
_CONDITIONS_COUNTS_AT = _CONDITIONS.size - _CONDITIONS_COUNTS.size
_THREAD = struct.Struct("<Iid")         # tid, cpu (-1 for null), cpu_s
_NO_THREADS = 0xFFFF                    # the thread count of ``"threads": null``
_NAN = float("nan")


def encode_profile(number: int, results, conditions: dict | None) -> bytes:
    """What a TIME_EVALUATOR_PACKED function returns (a bytes value, docs/protocol.md section
    5.3): ``u64 number, u32 repeat``, the repeat times as little-endian doubles, then, unless
    ``conditions`` is None, the conditions dict (runtime/conditions.py) in binary. The function
    name and the module's target are left out: the client has them."""
    n = len(results)
    if conditions is None:
        return struct.pack(f"<QI{n}d", number, n, *results)
    c = conditions
    cpus = c["cpus"]
    threads = c["threads"]
    freq = c["freq_mhz"] or (_NAN, _NAN)
    values = [number, n, *results, c["wall_s"], _or_nan(c["own_cpu_s"]), _or_nan(c["other_cpu_s"]),
              _or_nan(c["other_load"]), freq[0], freq[1], _or_nan(c["clock_tick_s"]),
              -1 if c["preempted"] is None else c["preempted"], len(cpus),
              _NO_THREADS if threads is None else len(threads), *cpus]
    for t in threads or ():
        values += (t["tid"], -1 if t["cpu"] is None else t["cpu"], t["cpu_s"])
    shape = (n, len(cpus), len(threads or ()))
    packer = _PROFILE_SHAPES.get(shape)
    if packer is None:
        if len(_PROFILE_SHAPES) >= _MAX_PROFILE_SHAPES:
            _PROFILE_SHAPES.clear()
        packer = _PROFILE_SHAPES[shape] = struct.Struct(f"<QI{n}d7dqHH{shape[1]}I{'Iid' * shape[2]}").pack
    try:
        return packer(*values)
    except struct.error as exc:
        raise ValueError(f"time_evaluator result out of the packed form's range: {exc}") from None


#: The packers of the shapes of results encoded so far, (repeats, CPUs, threads) -> Struct.pack: a
#: server's results mostly have one shape, and a format string parsed anew costs more than the packing.
_PROFILE_SHAPES: dict = {}
_MAX_PROFILE_SHAPES = 64


def _or_nan(value):
    return _NAN if value is None else value


def decode_profile(data, target: dict, function: str):
    """The ProfileResult that :func:`encode_profile` packed, with the module's ``target`` and the
    ``function`` name the client asked for; every count, length, number and time is checked
    (docs/protocol.md section 5.3), failures are ProtocolError: the conditions' lengths and
    counts here, their values when ``ProfileResult.conditions`` is first read."""
    if type(data) is not bytes:
        raise ProtocolError(f"packed time_evaluator result: expected bytes, got {type(data).__name__}")
    head = _PROFILE_HEAD.size
    if len(data) < head:
        raise ProtocolError(f"packed time_evaluator result: {len(data)} bytes, shorter than its header")
    number, repeat = _PROFILE_HEAD.unpack_from(data)
    if not 1 <= number <= _MAX_NUMBER or not 1 <= repeat <= MAX_RESULTS:
        raise ProtocolError(f"packed time_evaluator result: number={number} repeat={repeat} "
                            f"outside [1, {_MAX_NUMBER}] and [1, {MAX_RESULTS}]")
    end = head + 8 * repeat
    if len(data) < end:
        raise ProtocolError(f"packed time_evaluator result: {repeat} repeats need {end} bytes, "
                            f"got {len(data)}")
    results = struct.unpack_from(f"<{repeat}d", data, head)
    if not all(0.0 <= r <= _MAX_TIME for r in results):
        raise ProtocolError("packed time_evaluator result: the times must be finite and non-negative")
    result = ProfileResult(results, number, target, function)
    if len(data) != end:
        ncpus = _conditions_counts(data, end)
        result.decode_conditions_later(functools.partial(_decode_conditions, data, end, ncpus))
    return result


def _bad_conditions(problem: str) -> ProtocolError:
    return ProtocolError(f"packed time_evaluator result: conditions {problem}")


def _conditions_counts(data: bytes, offset: int) -> int:
    """The conditions' number of CPUs, their counts of CPUs and threads checked against the limits
    and against the length of ``data``: what :func:`decode_profile` checks when the reply arrives,
    before it keeps the bytes for :func:`_decode_conditions`."""
    max_cpus, max_threads = MAX_CPUS, MAX_THREADS
    if len(data) < offset + _CONDITIONS.size:
        raise _bad_conditions(f"cut short: {len(data) - offset} bytes, the fixed part takes "
                              f"{_CONDITIONS.size}")
    ncpus, nthreads = _CONDITIONS_COUNTS.unpack_from(data, offset + _CONDITIONS_COUNTS_AT)
    if nthreads == _NO_THREADS:
        nthreads = 0
    if not 1 <= ncpus <= max_cpus or nthreads > max_threads:
        raise _bad_conditions(f"list {ncpus} CPUs and {nthreads} threads; at most {max_cpus} (at "
                              f"least one) and {max_threads}")
    size = _CONDITIONS.size + 4 * ncpus + _THREAD.size * nthreads
    if len(data) - offset != size:
        raise _bad_conditions(f"of {ncpus} CPUs and {nthreads} threads take {size} bytes, "
                              f"got {len(data) - offset}")
    return ncpus


def _decode_conditions(data: bytes, offset: int, ncpus: int) -> dict:
    """The conditions dict at ``offset``, whose lengths and counts :func:`_conditions_counts`
    checked, every value checked (a ProtocolError otherwise); called when
    ``ProfileResult.conditions`` is first read."""
    (wall, own, other, load, freq_low, freq_high, tick, preempted, _,
     nthreads) = _CONDITIONS.unpack_from(data, offset)
    threads_null = nthreads == _NO_THREADS
    offset += _CONDITIONS.size
    cpus = list(struct.unpack_from(f"<{ncpus}I", data, offset))
    if max(cpus) >= MAX_CPU_NUMBER:
        raise _bad_conditions(f"name CPU {max(cpus)}, beyond {MAX_CPU_NUMBER - 1}")
    if not 0.0 <= wall <= _MAX_TIME:
        raise _bad_conditions("'wall_s' must be a finite number >= 0")
    if not ((own != own or 0.0 <= own <= _MAX_TIME) and (other != other or 0.0 <= other <= _MAX_TIME)
            and (load != load or 0.0 <= load <= _MAX_TIME) and (tick != tick or 0.0 <= tick <= _MAX_TIME)):
        name = next(name for name, v in (("own_cpu_s", own), ("other_cpu_s", other),
                                         ("other_load", load), ("clock_tick_s", tick))
                    if v == v and not 0.0 <= v <= _MAX_TIME)
        raise _bad_conditions(f"{name!r} must be a finite number >= 0 or null")   # NaN stands for null
    if freq_low != freq_low and freq_high != freq_high:
        freq = None
    elif 0.0 <= freq_low <= _MAX_TIME and 0.0 <= freq_high <= _MAX_TIME:
        freq = [freq_low, freq_high]
    else:
        raise _bad_conditions("'freq_mhz' must be two finite numbers >= 0 or null")
    if preempted < -1:
        raise _bad_conditions("'preempted' must be an integer >= 0 or null")
    threads = None if threads_null else []
    for tid, cpu, seconds in _THREAD.iter_unpack(data[offset + 4 * ncpus:]):
        if not -1 <= cpu < MAX_CPU_NUMBER or not 0.0 <= seconds <= _MAX_TIME:
            raise _bad_conditions(f"of thread {tid}: its CPU must be a CPU number or null and its "
                                  "time a finite number >= 0")
        threads.append({"tid": tid, "cpu": None if cpu == -1 else cpu, "cpu_s": seconds})
    return {"wall_s": wall, "cpus": cpus, "own_cpu_s": None if own != own else own,
            "other_cpu_s": None if other != other else other,
            "other_load": None if load != load else load,
            "preempted": None if preempted == -1 else preempted, "freq_mhz": freq, "threads": threads,
            "clock_tick_s": None if tick != tick else tick}
