"""TVM's ``tvm.contrib.cc``: link objects (``BuiltModule.save("x.o")``) into a shared library.

``create_shared`` is the host C compiler driver's link, as in TVM; a module saved as an
object carries its metadata and runtime, so the linked file loads with
``kernelrpc.runtime.load_module``.
"""
from __future__ import annotations

from ..deploy.toolchain import create_shared as _create_shared

__all__ = ["create_shared"]


def create_shared(output, objects, options=None, cc=None, cwd=None, ccache_env=None):
    """Link ``objects`` (a path or a list) into the shared library ``output``.

    ``cc`` is the compiler driver (default ``$CC``, else cc/gcc/clang); ``cwd`` and
    ``ccache_env`` are TVM's and must be left unset.
    """
    if cwd is not None or ccache_env is not None:
        raise TypeError("create_shared: cwd= and ccache_env= are not supported")
    if isinstance(objects, (str, bytes)) or hasattr(objects, "__fspath__"):
        objects = [objects]
    argv = [cc] if isinstance(cc, str) else cc
    return _create_shared(output, list(objects), argv, tuple(options or ()))
