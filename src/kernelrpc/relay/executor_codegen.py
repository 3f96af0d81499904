"""C source of a network's entry points, compiled for the target by the module's toolchain.

``default_run`` calls the network's kernels in order over the planned buffers, with no Python
between them; ``default_profile`` does the same ``number`` times and adds up each kernel's
nanoseconds (CLOCK_MONOTONIC around every call); ``default_load_params`` copies the weights
the module carries (an ``.incbin`` of the params file, in read-only data) into the params
tensor, and ``default_set_param`` overwrites a slice of it (``set_input`` of a weight).
"""
from __future__ import annotations

from ..runtime import calling_convention as convention


def _pointer(loc, ninputs: int) -> str:
    if loc.kind == "input":
        return f"(char *)args[{loc.index}]"
    if loc.kind == "output":
        return f"(char *)args[{ninputs + loc.index}]"
    return f"{'P' if loc.kind == 'param' else 'W'} + {loc.index}"


def entry_source(calls, ninputs: int, noutputs: int, params_bytes: int) -> str:
    """``calls``: a :class:`~kernelrpc.runtime.calling_convention.KernelCall` per kernel call,
    in order."""
    symbols = sorted({call.symbol for call in calls})
    arg = convention.run_arguments(ninputs, noutputs)
    lines = ["#include <stdint.h>", "#include <string.h>", "#include <time.h>", "",
             '#define KRPC_EXPORT __attribute__((visibility("default")))', ""]
    lines += [f"extern int32_t {s}(void **args);" for s in symbols]
    lines += ["extern const unsigned char __kernelrpc_params_blob[];", "",
              "static int64_t krpc_now_ns(void) {",
              "    struct timespec t;",
              "    clock_gettime(CLOCK_MONOTONIC, &t);",
              "    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;",
              "}", "",
              "static inline int32_t krpc_network(void **args, int64_t *times) {",
              f"    char *P = (char *)args[{arg['params']}];",
              f"    char *W = (char *)args[{arg['workspace']}];",
              "    int32_t rc;",
              "    int64_t t0 = 0;",
              "    (void)P; (void)W; (void)t0;"]
    for k, call in enumerate(calls):
        pointers = ", ".join(_pointer(loc, ninputs) for loc in call.locations)
        lines += ["    {",
                  f"        void *a[] = {{{pointers}}};",
                  "        if (times) t0 = krpc_now_ns();",
                  f"        rc = {call.symbol}(a);",
                  "        if (rc) return rc;",
                  f"        if (times) times[{k}] += krpc_now_ns() - t0;",
                  "    }"]
    lines += ["    return 0;", "}", "",
              f"KRPC_EXPORT int32_t {convention.symbol(convention.RUN)}(void **args) {{",
              "    return krpc_network(args, 0);", "}", "",
              f"KRPC_EXPORT int32_t {convention.symbol(convention.PROFILE)}(void **args) {{",
              f"    int64_t *times = (int64_t *)args[{arg['times']}];",
              f"    int64_t number = *(const int64_t *)args[{arg['number']}];",
              f"    memset(times, 0, sizeof(int64_t) * {max(len(calls), 1)});",
              "    for (int64_t i = 0; i < number; ++i) {",
              "        int32_t rc = krpc_network(args, times);",
              "        if (rc) return rc;",
              "    }",
              "    return 0;", "}", "",
              f"KRPC_EXPORT int32_t {convention.symbol(convention.LOAD_PARAMS)}(void **args) {{",
              f"    memcpy(args[0], __kernelrpc_params_blob, {params_bytes});",
              "    return 0;", "}", "",
              f"KRPC_EXPORT int32_t {convention.symbol(convention.SET_PARAM)}(void **args) {{",
              "    int64_t n = *(const int64_t *)args[2];",
              "    int64_t offset = *(const int64_t *)args[3];",
              f"    if (n < 0 || offset < 0 || offset > {params_bytes} || "
              f"n > {params_bytes} - offset) return {convention.ERR_RANGE};",
              "    memcpy((char *)args[0] + offset, args[1], (size_t)n);",
              "    return 0;", "}", ""]
    return "\n".join(lines)


def params_source(blob_path: str) -> str:
    """The weights as read-only data of the module (the assembler includes the file)."""
    path = str(blob_path).replace("\\", "\\\\").replace('"', '\\"')
    return ("/* the network's weights, included by the assembler */\n"
            "__asm__(\".section .rodata.kernelrpc_params,\\\"a\\\"\\n\"\n"
            "        \".balign 64\\n\"\n"
            "        \".globl __kernelrpc_params_blob\\n\"\n"
            "        \".hidden __kernelrpc_params_blob\\n\"\n"
            "        \"__kernelrpc_params_blob:\\n\"\n"
            f"        \".incbin \\\"{path}\\\"\\n\"\n"
            "        \".byte 0\\n\"\n"
            "        \".previous\\n\");\n")
