"""A kernel's large intermediate buffers come from the module runtime's pool of freed blocks:
called again in a device server's session, the kernels touch pages already mapped (no page
fault per page per call, as when glibc gives a session thread's freed blocks back to the
system: 3,500 faults and 5 of 17 ms a ResNet-18 run before the pool), and each call still
computes its result."""
import numpy as np

import kernelrpc
from kernelrpc import nd, rpc, te

SIZES = [1 << 18, 3 << 18, 1 << 20, 5 << 17]       # 1-4 MiB a buffer: above the stack's 64 KiB


def kernel(n: int, name: str):
    """``d = 2(a + rev a) + 2(rev a + a)`` through two intermediates of ``n`` floats."""
    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="B")
    c = te.compute((n,), lambda i: b[i] + b[n - 1 - i], name="C")
    d = te.compute((n,), lambda i: c[i] + c[n - 1 - i], name="D")
    return kernelrpc.build(te.create_schedule(d.op), [a, d], name=name)


def minor_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def test_kernels_called_again_in_a_session_reuse_their_buffers(server, tmp_path):
    rng = np.random.default_rng(0)
    with rpc.connect(server.host, server.port, key="dev") as sess:
        dev = sess.cpu(0)
        calls = []
        for k, n in enumerate(SIZES):
            path = kernel(n, f"k{k}").export_library(tmp_path / f"k{k}.so")
            sess.upload(str(path))
            a = rng.standard_normal(n).astype("float32")
            calls.append((sess.load_module(path.name)[f"k{k}"], nd.array(a, dev),
                          nd.empty((n,), "float32", dev), a))
        for f, a, d, _ in calls:
            f(a, d)                                     # the first calls fill the pool
        before = minor_faults(sess.info["pid"])
        for _ in range(10):
            for f, a, d, _ in calls:
                f(a, d)
        faults = minor_faults(sess.info["pid"]) - before
        for _, _, d, a in calls:
            np.testing.assert_allclose(d.numpy(), 4 * (a + a[::-1]), rtol=1e-5, atol=1e-5)
    pages = sum(SIZES) * 4 * 2 // 4096
    assert faults < pages, f"{faults} page faults in 10 rounds (the buffers are {pages} pages)"
