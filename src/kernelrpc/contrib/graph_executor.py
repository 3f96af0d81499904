"""TVM's ``tvm.contrib.graph_executor``: run a network module built by ``relay.build``.

    m = graph_executor.GraphModule(lib["default"](dev))
    m.set_input("input", x); m.run(); y = m.get_output(0).numpy()

The executor works the same on a local module and on one loaded on a remote device; running
the network is one native call on the device (docs/models.md).
"""
from __future__ import annotations

from ..runtime.graph_executor import GraphExecutor, GraphExecutorFactory

__all__ = ["GraphModule", "create"]


class GraphModule:
    """TVM's wrapper of a graph executor: every method (``set_input``, ``run``, ``get_output``,
    ``benchmark``...) is the executor's, forwarded."""

    def __init__(self, module):
        if isinstance(module, GraphExecutorFactory):
            module = module()
        if not isinstance(module, GraphExecutor):
            raise TypeError("GraphModule takes lib['default'](dev), the graph executor of a "
                            f"network module; got {type(module).__name__}")
        self.module = module

    def __getattr__(self, name):
        return getattr(self.module, name)

    def __dir__(self):
        return sorted({*super().__dir__(), *dir(self.module)})

    def __repr__(self) -> str:
        return f"<GraphModule {self.module.input_names} on {self.module.device}>"


def create(graph_json_str, libmod, device) -> GraphModule:
    """TVM's ``graph_executor.create(graph_json, lib, dev)``; the graph must be the module's."""
    import json

    mine = (libmod.metadata or {}).get("graph")
    theirs = json.loads(graph_json_str) if isinstance(graph_json_str, str) else graph_json_str
    if mine is None:
        raise ValueError("the module is not a network module (relay.build writes those)")
    if theirs != mine:
        raise ValueError("the graph JSON is not the one the module was built with")
    return GraphModule(libmod["default"](device))
