"""InterleaveStores: unrolled strided vector stores that fill one run become one store of
their values interleaved, computing what the stores did one by one."""
import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, te
from kernelrpc.compiler import interp, ir
from kernelrpc.compiler.expr import const
from kernelrpc.compiler.lower import PassContext
from kernelrpc.compiler.lower.interleave import interleave_func


def _quads(channels: int, pixels: int, lanes: int, dtype: str = "uint8"):
    """``out[c4][p][i] = data[4*c4 + i][p]`` (an int8 layer's quads of channels), vectors of
    ``lanes`` pixels, the quad's bytes unrolled."""
    data = te.placeholder((channels, pixels), name="data", dtype=dtype)
    out = te.compute((channels // 4, pixels, 4), lambda c4, p, i: data[c4 * 4 + i, p],
                     name="quads")
    s = te.create_schedule(out.op)
    c4, p, i = s[out].op.axis
    s[out].vectorize(s[out].split(p, factor=lanes)[1])
    s[out].unroll(i)
    return s, [data, out]


def _calls(func, op: str) -> int:
    found = []
    ir.post_order_visit(func.body, lambda n: found.append(n) if getattr(n, "op", None) == op
                        else None)
    return len(found)


def _run(s, args, data, shape, disabled=()):
    with PassContext(opt_level=3, disabled_pass=disabled):
        func = te.lower(s, args, name="quads")
        module = kernelrpc.build(s, args, target="llvm", name="quads")
    out = nd.empty(shape, data.dtype)
    module["quads"](nd.array(data), out)
    return func, out.numpy()


@pytest.mark.parametrize("dtype, lanes, pixels", [("uint8", 16, 64), ("uint8", 16, 56),
                                                   ("int8", 8, 40), ("float32", 4, 12),
                                                   ("int32", 16, 7)])
def test_quads_interleave_computes_the_stores_one_by_one(dtype, lanes, pixels):
    """With the pass, a vector loop's four strided stores are one interleaved store (the
    tail of a split that does not divide the row too, where it is a vector loop of its own);
    without it (the general path) each is a scatter. Both compute numpy's transpose."""
    channels = 8
    data = (np.arange(channels * pixels) % 251 - 100).astype(dtype).reshape(channels, pixels)
    expect = data.reshape(channels // 4, 4, pixels).transpose(0, 2, 1)
    s, args = _quads(channels, pixels, lanes, dtype)
    fast, got = _run(s, args, data, expect.shape)
    s, args = _quads(channels, pixels, lanes, dtype)
    general, reference = _run(s, args, data, expect.shape, disabled=("InterleaveStores",))
    assert _calls(fast, "interleave") >= 1 and _calls(general, "interleave") == 0
    np.testing.assert_array_equal(got, expect)
    np.testing.assert_array_equal(reference, expect)


def test_interpreter_runs_the_interleave():
    data = np.arange(8 * 32, dtype="uint8").reshape(8, 32)
    s, args = _quads(8, 32, 16)
    func = te.lower(s, args, name="quads")
    out = np.zeros((2, 32, 4), "uint8")
    interp.run(func, data, out)
    np.testing.assert_array_equal(out, data.reshape(2, 4, 32).transpose(0, 2, 1))


def test_stores_that_read_their_buffer_or_leave_gaps_stay_apart():
    """A store whose value reads the buffer it stores to (a later store would see the earlier
    one's result) or calls a C function, and stores whose offsets do not fill the run, are
    not merged."""
    buf, src = ir.Buffer("buf", (64,)), ir.Buffer("src", (64,))

    def store(buffer, base, value):
        return ir.Store(buffer, value, ir.Ramp(const(base), const(2), 8))

    def load(buffer, base):
        return ir.Load(buffer, ir.Ramp(const(base), const(1), 8))

    cases = {
        "reads itself": [store(buf, 0, load(src, 0)), store(buf, 1, load(buf, 0))],
        "gap": [store(buf, 0, load(src, 0)), store(buf, 3, load(src, 8))],
        "calls C": [store(buf, 0, load(src, 0)),
                    store(buf, 1, ir.Broadcast(ir.call_extern("float32", "next_value"), 8))],
        "merged": [store(buf, 0, load(src, 0)), store(buf, 1, load(src, 8))],
    }
    for name, stmts in cases.items():
        func = ir.PrimFunc("f", [buf, src], ir.SeqStmt(stmts))
        assert _calls(interleave_func(func), "interleave") == (name == "merged"), name
