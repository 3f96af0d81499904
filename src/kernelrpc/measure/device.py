"""One device's side of a batch: a session from the tracker, reused for candidate after candidate."""
from __future__ import annotations

import logging
import socket
import time

import numpy as np

from ..errors import ConnectionLost, RemoteError, RPCError, ServerCrashed, SessionTimeout
from . import result as R

log = logging.getLogger(__name__)


class Requeue(Exception):
    """The session ended under a candidate through no fault of the candidate's: run it elsewhere.
    ``status`` is the candidate's outcome if it has been tried too often."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


class DeviceSession:
    """A session with one device server, with the batch's inputs uploaded once."""

    def __init__(self, session, inputs: list[np.ndarray], session_timeout: float) -> None:
        self.session = session
        self.address = session.address
        cpus = session.info.get("cpus")            # from the network: kept only if plausible
        self.cpus = cpus if isinstance(cpus, list) and len(cpus) <= 4096 and \
            all(type(c) is int for c in cpus) else None
        self.opened_at = time.monotonic()      # held from here: uploading inputs is not measuring
        self.dev = session.cpu(0)
        self.inputs = [session.array(a, self.dev) for a in inputs]
        self.closed_at: float | None = None
        self.deadline = self.opened_at + session_timeout if session_timeout else None
        self._outputs: dict = {}
        self.busy = 0.0
        self.count = 0

    @property
    def alive(self) -> bool:
        return not self.session.closed

    def has_time_for(self, seconds: float) -> bool:
        return self.deadline is None or time.monotonic() + seconds < self.deadline

    def close(self) -> None:
        if self.closed_at is None:
            self.closed_at = time.monotonic()
        self.session.close()

    def abort(self) -> None:
        """From another thread: break the connection, so a call waiting on the device returns now."""
        try:
            self.session._conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _output(self, index: int, record: dict):
        """A reused output tensor, refilled before every candidate so that a kernel that writes
        nothing cannot pass the check with the previous candidate's answer."""
        shape, dtype = tuple(record["shape"]), record["dtype"]
        tensor = self._outputs.get((index, shape, dtype))
        if tensor is None:
            tensor = self._outputs[(index, shape, dtype)] = self.session.empty(shape, dtype, self.dev)
        tensor.copyfrom(_poison(shape, dtype))
        return tensor

    def run(self, job, spec) -> R.MeasureResult:
        """Upload, load, check and time one built candidate; the result says how it went."""
        res = R.MeasureResult(job.index, job.name, R.RUNTIME_ERROR, device=self.address, cpus=self.cpus,
                              build_seconds=job.build.seconds, flops=spec.flops)
        start = time.monotonic()
        sock = self.session._conn.sock      # the per-candidate deadline lives on the socket
        sock.settimeout(spec.timeout)
        try:
            res.status, res.error, res.profile = self._run(job, spec)
        except socket.timeout:
            res.status, res.error = R.TIMEOUT, f"no answer from the device within {spec.timeout:g} s"
            self.session._mark_closed()
        except SessionTimeout as exc:
            if time.monotonic() - start < spec.timeout:
                raise Requeue(str(exc), R.TIMEOUT) from None
            res.status, res.error = R.TIMEOUT, str(exc)
        except ServerCrashed as exc:
            res.error = f"the candidate crashed its session: {exc}"
        except RemoteError as exc:
            res.error, res.detail = f"{exc.type_name}: {exc.remote_message}", exc.traceback_text
        except ConnectionLost as exc:
            if spec.timeout and time.monotonic() - start >= spec.timeout * 0.99:
                res.status, res.error = R.TIMEOUT, f"no answer from the device within {spec.timeout:g} s"
            else:    # the board went away (killed, rebooted, unplugged): its next session goes on
                raise Requeue(f"the device went away: {exc}", R.RUNTIME_ERROR) from None
        except (RPCError, OSError, ValueError) as exc:
            res.error = f"{type(exc).__name__}: {exc}"
        finally:
            if not self.session.closed:
                sock.settimeout(None)
        res.run_seconds = time.monotonic() - start
        self.busy += res.run_seconds
        self.count += 1
        return res

    def _run(self, job, spec):
        records = job.build.args
        n_in = len(self.inputs)
        problem = _signature_problem(records, spec.inputs)
        if problem:
            return R.RUNTIME_ERROR, problem, None
        filename = f"candidate{job.index}.so"
        self.session.upload(job.build.library, target=filename)
        module = self.session.load_module(filename)
        self.session.remove(filename)
        outputs = [self._output(i, rec) for i, rec in enumerate(records[n_in:])]
        args = [*self.inputs, *outputs]
        module[spec.name](*args)
        if spec.reference is not None:
            for i, (out, want) in enumerate(zip(outputs, spec.reference)):
                mismatch = _mismatch(out.numpy(), want, spec.rtol, spec.atol)
                if mismatch:
                    return R.WRONG_RESULT, f"output {records[n_in + i]['name']}: {mismatch}", None
        timer = module.time_evaluator(spec.name, self.dev, number=spec.number, repeat=spec.repeat,
                                      min_repeat_ms=spec.min_repeat_ms)
        return R.OK, "", timer(*args)


def _poison(shape, dtype: str) -> np.ndarray:
    dt = np.dtype(dtype)
    if dt.kind == "f":
        return np.full(shape, np.nan, dtype=dt)
    if dt.kind in "iu":
        return np.full(shape, np.iinfo(dt).max, dtype=dt)
    return np.ones(shape, dtype=dt)


def _signature_problem(records: list, inputs: list) -> str:
    if len(records) < len(inputs):
        return f"the function takes {len(records)} arguments but {len(inputs)} inputs were given"
    for rec, array in zip(records, inputs):
        if rec.get("kind") != "tensor":
            return f"argument {rec.get('name')} is a scalar; measure() passes tensors only"
        if tuple(rec["shape"]) != array.shape or np.dtype(rec["dtype"]) != array.dtype:
            return (f"argument {rec['name']} is {rec['dtype']}{list(rec['shape'])} but the input is "
                    f"{array.dtype}{list(array.shape)}")
    for rec in records[len(inputs):]:
        if rec.get("kind") != "tensor":
            return f"argument {rec.get('name')} is a scalar; measure() passes tensors only"
    return ""


def _mismatch(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str:
    if got.shape != want.shape:
        return f"shape {got.shape}, the reference's is {want.shape}"
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=False)
    if not bad.any():
        return ""
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    return (f"{int(bad.sum())} of {bad.size} elements differ from the reference (first at {where}: "
            f"{got[where]!r} vs {want[where]!r})")
