"""What the model command checks a network's outputs against, on this host: onnxruntime's
run of the same file (agreement and onnxruntime's own latency), and, for a quantized network,
the float network it was quantized from (``--reference model_fp32.onnx``: the quantization
error of kernelrpc's int8 outputs, beside that of onnxruntime's int8 outputs)."""
from __future__ import annotations

import statistics
import time

import numpy as np

#: onnxruntime's timed runs on this host (after one untimed run)
REFERENCE_RUNS = 10


def _session(model, threads: int):
    from .relay.testing import onnxruntime_session

    return onnxruntime_session(model, max(threads, 0))


def onnxruntime_reference(model, feeds: dict, threads: int):
    """onnxruntime's outputs for ``feeds`` and its latency on this host (``{"outputs",
    "seconds", "threads"}``), or why there are none."""
    try:
        session = _session(model, threads)
    except ImportError:
        return "onnxruntime is not installed here"
    outputs = session.run(None, feeds)
    seconds = []
    for _ in range(REFERENCE_RUNS):
        start = time.perf_counter()
        session.run(None, feeds)
        seconds.append(time.perf_counter() - start)
    return {"outputs": outputs, "seconds": seconds, "threads": threads}


def _error(got, ref) -> dict:
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    scale = float(np.abs(ref).max()) or 1.0
    entry = {"max_abs_error": float(np.abs(got - ref).max()),
             "relative": float(np.abs(got - ref).max()) / scale}
    if ref.ndim == 2 and ref.shape[1] >= 5:
        entry["top5_match"] = bool((np.argsort(-got, axis=1)[:, :5] ==
                                    np.argsort(-ref, axis=1)[:, :5]).all())
    if ref.ndim >= 2 and ref.shape[-1] >= 2:
        entry["top1_agreement"] = float((got.argmax(-1) == ref.argmax(-1)).mean())
    return entry


def agreement(outputs, expect) -> dict:
    """kernelrpc's ``outputs`` against onnxruntime's (``expect``, or why there are none)."""
    if isinstance(expect, str):
        return {"checked": False, "why": expect}
    return {"checked": True, "outputs": [_error(g, r) for g, r in zip(outputs, expect["outputs"])],
            "host_latency": {"median_s": statistics.median(expect["seconds"]),
                             "runs": len(expect["seconds"]), "threads": expect["threads"]}}


def agreement_lines(check: dict) -> list[str]:
    if not check["checked"]:
        return [f"onnxruntime  not compared: {check['why']}"]
    latency = check["host_latency"]
    threads = latency["threads"] or "its default"
    lines = [f"onnxruntime  {latency['median_s'] * 1e3:.3f} ms on this host (median of "
             f"{latency['runs']} runs, {threads} thread(s)): the host's, not the board's"]
    for k, entry in enumerate(check["outputs"]):
        top5 = "" if "top5_match" not in entry else \
            f", top-5 {'matches' if entry['top5_match'] else 'DIFFERS'}"
        lines.append(f"onnxruntime  output {k}: max error {entry['max_abs_error']:.3g} "
                     f"({entry['relative']:.2g} of its scale){top5}")
    return lines


def float_outputs(path, feeds: dict, threads: int):
    """The float network's outputs on ``feeds`` (onnxruntime on this host): ``path`` must take
    the quantized model's inputs (:func:`quantization_error` checks its outputs)."""
    from .relay.errors import ModelError
    from .relay.frontend import onnx_model

    reference = onnx_model.load(path)
    graph_inputs = {i.name for i in reference.graph.input} - \
        {t.name for t in reference.graph.initializer}
    if graph_inputs != set(feeds):
        raise ModelError(f"--reference {path}: its inputs {sorted(graph_inputs)} are not the "
                         f"model's {sorted(feeds)}")
    try:
        session = _session(reference, threads)
    except ImportError:
        raise ModelError("--reference needs onnxruntime to run the float network: "
                         "pip install onnxruntime") from None
    return session.run(None, feeds)


def quantization_error(path, outputs, floats, expect) -> dict:
    """kernelrpc's ``outputs`` (and onnxruntime's, from ``expect``, when there) against the
    float network's; an output whose shape differs from the float one's is an error."""
    from .relay.errors import ModelError

    if len(floats) != len(outputs):
        raise ModelError(f"--reference {path} has {len(floats)} outputs, the model "
                         f"{len(outputs)}")
    report = {"reference": str(path), "outputs": []}
    theirs = expect["outputs"] if isinstance(expect, dict) else [None] * len(outputs)
    for k, (got, ort_got, ref) in enumerate(zip(outputs, theirs, floats)):
        if np.shape(got) != np.shape(ref):
            raise ModelError(f"--reference {path}: output {k} is {list(np.shape(ref))}, the "
                             f"model's {list(np.shape(got))}")
        entry = {"kernelrpc": _error(got, ref)}
        if ort_got is not None:
            entry["onnxruntime"] = _error(ort_got, ref)
        report["outputs"].append(entry)
    return report


def quantization_lines(report: dict) -> list[str]:
    lines = []
    for k, entry in enumerate(report["outputs"]):
        def words(e):
            top1 = "" if "top1_agreement" not in e else \
                f", top-1 agrees in {e['top1_agreement']:.0%} of rows"
            return f"max error {e['max_abs_error']:.3g} ({e['relative']:.2g} of its scale){top1}"
        line = f"float32      output {k} vs {report['reference']}: kernelrpc {words(entry['kernelrpc'])}"
        if "onnxruntime" in entry:
            line += f"; onnxruntime's {words(entry['onnxruntime'])}"
        lines.append(line)
    return lines
