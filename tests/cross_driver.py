"""Runs on the emulated device (stdlib only): load modules with kernelrpc.runtime, run them.

Reads a JSON job on stdin: ``{"kernels": [{"module": path, "function": name,
"args": [{"dtype", "shape", "input": path | null, "output": path | null}]}]}``.
For each kernel: fill the tensors from the input files, call the function, write
the outputs; call it again with the pool at 1 thread and report whether the
outputs were identical; time it with the native loop (and with the cache flush
preprocessor; without it, all repeats are one call of the module's
``__kernelrpc_time_repeats``). Prints one JSON result document.
"""
import json
import platform
import sys

from kernelrpc import runtime


def run(kernel):
    module = runtime.load_module(kernel["module"])
    dev = runtime.cpu(0)
    tensors = []
    for arg in kernel["args"]:
        tensor = runtime.empty(arg["shape"], arg["dtype"], dev)
        if arg["input"]:
            with open(arg["input"], "rb") as f:
                tensor.copyfrom(f.read())
        tensors.append(tensor)
    function = module[kernel["function"]]
    threads = module.set_num_threads(0)
    function(*tensors)
    outputs = [bytes(t.buffer) for t in tensors]
    for arg, data in zip(kernel["args"], outputs):
        if arg["output"]:
            with open(arg["output"], "wb") as f:
                f.write(data)
    module.set_num_threads(1)
    function(*tensors)
    same_serial = all(bytes(t.buffer) == data for t, data in zip(tensors, outputs))
    module.set_num_threads(0)
    timer = module.time_evaluator(kernel["function"], dev, number=3, repeat=2)
    flushed = module.time_evaluator(kernel["function"], dev, number=1, repeat=2,
                                    f_preproc="cache_flush_cpu_non_first_arg")
    return {"threads": threads, "same_serial": same_serial,
            "seconds": timer(*tensors).mean, "flushed_seconds": flushed(*tensors).mean,
            "native_cache_flush": module.has_cache_flush, "target": module.target,
            "repeats_in_one_call": timer.per_batch_reason is None}


def main():
    job = json.load(sys.stdin)
    results = [run(kernel) for kernel in job["kernels"]]
    json.dump({"machine": platform.machine(), "results": results}, sys.stdout)


if __name__ == "__main__":
    main()
