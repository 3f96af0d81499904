"""The operators of the network graph (TVM's ``relay.op``)."""
from . import elemwise, nn, transform  # noqa: F401  (each registers its operators)
from .registry import OPS, OpDef, get, node_flops

__all__ = ["OPS", "OpDef", "get", "node_flops"]
