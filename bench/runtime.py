"""Local runtime figures, each next to a reference measured in the same run.

    PYTHONPATH=src python bench/runtime.py [--parallel-launch]

* call overhead of a checked kernel call (``mod["addone"](a, b)``) against the same symbol called
  through bare ctypes with pre-packed arguments, and against Apache TVM 0.27 calling its own
  compiled addone (if apache-tvm is installed);
* what time_evaluator reports per call (native timing loop) against timing the same calls from a
  Python loop with time.perf_counter;
* host copy bandwidth of ``nd.array(ndarray)`` and ``Tensor.numpy()`` against ``numpy.copy``, and
  ``tvm.runtime.tensor(ndarray)`` (if installed);
* elementwise math on a float32[197, 1024] tensor at 1 thread (exp, log, tanh, erf, sigmoid,
  x**3: the compiler's vector polynomials), built vectorized for the host and for
  ``-mcpu=haswell`` (AVX2, if the host runs it), against numpy and onnxruntime (if installed).
* the cost of a parallel region on the module thread pool, next to a serial call of the same
  kernel (``--parallel-launch``: this table alone). A kernel with an (almost) empty parallel loop
  is timed with the module's native loop (``time_evaluator``), with the pool at 1 thread (no
  launch: runs inline) and at all cores; the difference is the launch + join overhead per region.
  A second figure is the first call after the pool has gone to sleep (wake-up latency, ctypes call
  included), and a third the CPU time the process uses in the 0.3 s after a launch (the workers
  spin briefly, then sleep: an idle pool should cost next to nothing). Reference: the same kernel
  dispatched to 2 Python threads (ThreadPoolExecutor; ctypes drops the GIL), the alternative the
  module pool replaces.
"""
from __future__ import annotations

import argparse
import ctypes
import resource
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fixtures.build import build_fixture_module  # noqa: E402

import kernelrpc  # noqa: E402
from kernelrpc import nd, runtime, te  # noqa: E402

#: name -> (te body, numpy function or None, ONNX operator, its exponent input or None)
MATH = {"exp": (lambda v, te: te.exp(v), np.exp, "Exp", None),
        "log": (lambda v, te: te.log(v), np.log, "Log", None),
        "tanh": (lambda v, te: te.tanh(v), np.tanh, "Tanh", None),
        "erf": (lambda v, te: te.erf(v), None, "Erf", None),
        "sigmoid": (lambda v, te: 1.0 / (1.0 + te.exp(-v)),
                    lambda x: 1.0 / (1.0 + np.exp(-x)), "Sigmoid", None),
        "pow 3": (lambda v, te: te.power(v, 3.0), lambda x: np.power(x, 3), "Pow", 3.0)}
MATH_SHAPE = (197, 1024)


def per_call_us(fn, calls: int = 20000, rounds: int = 5) -> float:
    """Median over rounds of the mean time per call, in microseconds."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def best_ms(fn, rounds: int = 5) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return min(samples)


def gib_s(mib: int, ms: float) -> str:
    return f"{mib / 1024 / (ms / 1e3):6.2f}"


def tvm_addone():
    try:
        import tvm
        from tvm import te
    except ImportError:
        return None
    a = te.placeholder((1024,), "float32", "A")
    b = te.compute((1024,), lambda i: a[i] + 1.0, name="B")
    mod = tvm.compile(te.create_prim_func([a, b]).with_attr("global_symbol", "addone"),
                      target="llvm").jit()
    return tvm, mod


def math_kernel(body, target: str, lanes: int):
    from kernelrpc import build, te

    a = te.placeholder(MATH_SHAPE, name="A")
    b = te.compute(MATH_SHAPE, lambda i, j: body(a[i, j], te), name="B")
    s = te.create_schedule(b.op)
    _, inner = s[b].split(b.op.axis[1], factor=lanes)
    s[b].vectorize(inner)
    return build(s, [a, b], target=target, name="f")


def ort_math(op: str, exponent):
    """An onnxruntime session (1 thread) of the one operator, or None without onnxruntime."""
    try:
        import onnxruntime  # noqa: F401
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    from kernelrpc.relay.testing import onnxruntime_session

    inputs, inits = ["x"], []
    if exponent is not None:
        inputs.append("p")
        inits.append(numpy_helper.from_array(np.array(exponent, np.float32), "p"))
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, MATH_SHAPE) for n in "xy"]
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"])], op, info[:1], info[1:],
                              inits)
    return onnxruntime_session(helper.make_model(graph,
                                                 opset_imports=[helper.make_opsetid("", 13)]))


def elementwise_math() -> list[tuple[str, str]]:
    from kernelrpc import te

    targets = [("host", "llvm", 16)]
    if "+avx2" in te.Target("llvm").features.split(","):
        targets.append(("haswell", "llvm -mcpu=haswell", 8))
    x = np.random.default_rng(0).standard_normal(MATH_SHAPE).astype(np.float32)
    dev = runtime.cpu(0)
    rows = []
    for name, (body, numpy_fn, op, exponent) in MATH.items():
        data = np.abs(x) + np.float32(0.01) if name == "log" else x
        a, b = nd.array(data), nd.empty(MATH_SHAPE)
        cells = []
        for _, target, lanes in targets:
            module = math_kernel(body, target, lanes)
            module.set_num_threads(1)
            cells.append(module.time_evaluator("f", dev, number=20, repeat=5)(a, b).median * 1e3)
        cells.append(per_call_us(lambda: numpy_fn(data), 20) / 1e3 if numpy_fn else None)
        session = ort_math(op, exponent)
        cells.append(per_call_us(lambda: session.run(None, {"x": data}), 20) / 1e3
                     if session else None)
        rows.append((name, "".join(f"{c:10.3f}" if c is not None else f"{'-':>10}"
                                   for c in cells)))
    header = "".join(f"{h:>10}" for h in [t[0] for t in targets] + ["numpy", "ort"])
    return header, rows


def table(title: str, rows: list[tuple[str, str]]) -> None:
    print(f"\n{title}")
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")


def parallel_launch() -> None:
    """The launch of a parallel region on the module pool, a serial call and 2 Python threads."""
    n = 64
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] + 1.0, name="B")
    s = te.create_schedule(B.op)
    s[B].parallel(B.op.axis[0])
    module = kernelrpc.build(s, [A, B], name="tiny")
    dev = kernelrpc.cpu(0)
    a, b = nd.array(np.zeros(n, np.float32), dev), nd.empty((n,), "float32", dev)
    runtime_module = module.runtime_module
    rows = []
    for threads in (1, 0):
        used = runtime_module.set_num_threads(threads)
        evaluate = module.time_evaluator("tiny", dev, number=20000, repeat=5)
        result = evaluate(a, b)
        rows.append((f"threads={used}", result.median * 1e6, result.min * 1e6))
    wake = []
    for _ in range(10):
        threading.Event().wait(0.05)  # let the workers go to sleep
        start = time.perf_counter()
        module(a, b)
        wake.append((time.perf_counter() - start) * 1e6)
    runtime_module.set_num_threads(1)
    function = module["tiny"]
    python_pool = []
    with ThreadPoolExecutor(max_workers=2) as executor:
        for _ in range(2000):
            start = time.perf_counter()
            for future in [executor.submit(function, a, b) for _ in range(2)]:
                future.result()
            python_pool.append((time.perf_counter() - start) * 1e6)
    runtime_module.set_num_threads(0)
    idle = []
    for _ in range(5):
        module(a, b)
        before = resource.getrusage(resource.RUSAGE_SELF)
        threading.Event().wait(0.3)
        after = resource.getrusage(resource.RUSAGE_SELF)
        idle.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1e3)
    print(f"{'case':<30}{'median us':>12}{'min us':>10}")
    for name, median, low in rows:
        print(f"{name + ' (per call, native loop)':<30}{median:>12.3f}{low:>10.3f}")
    print(f"{'launch overhead (all - 1)':<30}{rows[1][1] - rows[0][1]:>12.3f}")
    print(f"{'call after idle (ctypes+wake)':<30}{statistics.median(wake):>12.1f}{min(wake):>10.1f}")
    print(f"{'CPU in 0.3 s after (ms)':<30}{statistics.median(idle):>12.1f}{min(idle):>10.1f}")
    print(f"{'reference: 2 Python threads':<30}{statistics.median(python_pool):>12.1f}"
          f"{min(python_pool):>10.1f}")


def call_and_copy_tables() -> None:
    """Call overhead, per-call time and host copies, each with its references."""
    with tempfile.TemporaryDirectory() as tmp:
        mod = runtime.load_module(build_fixture_module(tmp))
    tvm_parts = tvm_addone()

    a = nd.array(np.arange(1024, dtype="float32"))
    b = nd.empty((1024,))
    addone = mod["addone"]
    packed = addone.pack((a, b))
    raw = ctypes.CDLL(mod.path)["__kernelrpc_fn_addone"]
    raw.argtypes, raw.restype = (ctypes.c_void_p,), ctypes.c_int32
    ours = per_call_us(lambda: addone(a, b))
    bare = per_call_us(lambda: raw(packed.pointer))
    rows = [("kernelrpc mod['addone'](a, b), checked", f"{ours:7.2f} us"),
            ("bare ctypes call, pre-packed (reference)", f"{bare:7.2f} us   ratio {ours / bare:.1f}x")]
    if tvm_parts:
        tvm, tmod = tvm_parts
        ta = tvm.runtime.tensor(np.arange(1024, dtype="float32"))
        tb = tvm.runtime.tensor(np.zeros(1024, "float32"))
        tfn = tmod["addone"]
        theirs = per_call_us(lambda: tfn(ta, tb))
        rows.append(("Apache TVM 0.27 f(a, b) (reference)",
                     f"{theirs:7.2f} us   ratio {ours / theirs:.1f}x"))
    table("Call overhead (addone, float32[1024])", rows)

    evaluator = mod.time_evaluator("addone", runtime.cpu(0), number=10000, repeat=5)
    native_us = evaluator(a, b).median * 1e6
    loop_us = per_call_us(lambda: addone.invoke(packed), calls=10000)
    table("Per-call time of addone", [
        ("time_evaluator (native loop), median", f"{native_us:7.3f} us"),
        ("Python loop around the call (reference)",
         f"{loop_us:7.3f} us   Python overhead excluded: {loop_us - native_us:.3f} us/call"),
    ])

    header = "size     nd.array  .numpy()  numpy.copy (ref)  nd.array/ref"
    if tvm_parts:
        header += "  tvm.runtime.tensor (ref)"
    rows = []
    for mib in (1, 16, 64):
        data = np.random.default_rng(0).random(mib << 18, dtype="float32")
        to_tensor = best_ms(lambda: nd.array(data))
        from_tensor = best_ms(nd.array(data).numpy)
        reference = best_ms(data.copy)
        line = (f"{gib_s(mib, to_tensor):>8}  {gib_s(mib, from_tensor):>8}  "
                f"{gib_s(mib, reference):>16}  {reference / to_tensor:12.2f}")
        if tvm_parts:
            line += f"  {gib_s(mib, best_ms(lambda: tvm_parts[0].runtime.tensor(data))):>24}"
        rows.append((f"{mib:2d} MiB", line))
    table(f"Host copies into and out of a tensor, GiB/s\n  {header}", rows)

    header, rows = elementwise_math()
    table(f"Elementwise math on float32[197, 1024], 1 thread, ms per call (median of 5 rounds "
          f"of 20 calls)\n  {'':<7}  {header}", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parallel-launch", action="store_true", help="only the parallel launch table")
    if not parser.parse_args().parallel_launch:
        call_and_copy_tables()
    print("\nParallel launch (an almost empty parallel loop over 64 float32)")
    parallel_launch()


if __name__ == "__main__":
    main()
