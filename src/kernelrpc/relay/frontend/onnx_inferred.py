"""ONNX's shape inference standing in for refused nodes: when a converter refuses a node, its
outputs are replaced by nodes of the shapes and dtypes inference gives, so that the rest of the
graph is still checked and every refusal is reported at once."""
from __future__ import annotations

import math

from .. import ir
from ..errors import ModelError
from .onnx_common import STAND_IN
from .onnx_model import elem_dtype, require_onnx

#: initializers up to this many elements keep their values for inference (shape arithmetic
#: reads them); larger ones (weights) are given by type and shape only
MAX_INFERENCE_VALUE = 4096


class InferredTypes:
    """Shapes and dtypes of the model's tensors by ONNX's shape inference (run once, when a
    node is first refused), the graph's inputs fixed to the shapes they are imported with:
    what the nodes that stand in for a refused node's outputs are made of."""

    def __init__(self, model, inputs):
        self._model, self._inputs = model, inputs
        self._types = None
        self.unknown: set = set()       # refused outputs whose shape inference cannot tell

    def stand_in(self, name: str):
        """A node of ``name``'s inferred static shape and dtype, or None (``name`` is then
        unknown)."""
        shape, dtype = self._infer().get(name, (None, None))
        if shape is None:
            self.unknown.add(name)
            return None
        return ir.Node(STAND_IN, (), {}, shape, dtype, name)

    def static(self, name: str):
        """``(shape, dtype)`` of the model's tensor ``name`` (in a subgraph too) when static,
        else None."""
        return self._infer().get(name)

    def _infer(self) -> dict:
        if self._types is None:
            self._types = self._run()
        return self._types

    def _run(self) -> dict:
        onnx = require_onnx()
        model = _light_copy(onnx, self._model)
        imported = {entry.domain for entry in model.opset_import}
        for domain in {node.domain for node in model.graph.node} - imported - {"ai.onnx"}:
            model.opset_import.add(domain=domain, version=1)   # its nodes are then skipped
        fixed = {node.name: node.shape for node in self._inputs}
        for info in model.graph.input:
            if info.name in fixed:
                dims = info.type.tensor_type.shape.dim
                del dims[:]
                for d in fixed[info.name]:
                    dims.add().dim_value = d
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except (onnx.shape_inference.InferenceError, ValueError):
            return {}       # the report then stops at the refused nodes, as without inference
        return _static_types(_value_infos(inferred.graph))


def _value_infos(graph) -> list:
    """The value infos of ``graph`` and of its subgraphs (If's branches, Loop's bodies)."""
    infos = list(graph.value_info) + list(graph.output)
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                infos += _value_infos(sub)
    return infos


def _static_types(infos) -> dict:
    """name -> (shape, dtype) of the value infos whose shape is static and dtype supported."""
    types = {}
    for info in infos:
        ttype = info.type.tensor_type
        if not ttype.HasField("shape") or not ttype.elem_type:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in ttype.shape.dim]
        try:
            dtype = elem_dtype(ttype.elem_type, info.name)
        except ModelError:
            continue
        if all(d >= 0 for d in dims):
            types[info.name] = (tuple(dims), dtype)
    return types


def _light_copy(onnx, model):
    """The model without its weights' values (their types and shapes are kept)."""
    copy = onnx.ModelProto()
    copy.ir_version = model.ir_version
    copy.opset_import.extend(model.opset_import)
    src, graph = model.graph, copy.graph
    for field in ("node", "input", "output", "value_info"):
        getattr(graph, field).extend(getattr(src, field))
    declared = {info.name for info in src.input}
    for init in src.initializer:
        if math.prod(init.dims) <= MAX_INFERENCE_VALUE:
            graph.initializer.append(init)
        elif init.name not in declared:
            graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type,
                                                                  list(init.dims)))
    return copy
