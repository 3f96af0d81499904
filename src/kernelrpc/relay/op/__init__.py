"""The operators of the network graph (TVM's ``relay.op``)."""
from . import activation, elemwise, index, nn, norm, reduce, transform  # noqa: F401 (they register)
from . import dynamic, recurrent  # noqa: F401  (they register)
from .registry import OPS, OpDef, get, node_flops

__all__ = ["OPS", "OpDef", "get", "node_flops"]
