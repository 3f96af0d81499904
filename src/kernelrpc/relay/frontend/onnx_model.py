"""Reading an ONNX file into what the importer needs, with every outside value checked.

``onnx`` is an optional dependency (``pip install 'kernelrpc[onnx]'``); it is imported here
only, when a model is imported.
"""
from __future__ import annotations

import math
import os

import numpy as np

from ..errors import MissingShapeError, ModelError
from ..ir import DTYPES

#: opsets the importer is written and tested for
MIN_OPSET, MAX_OPSET = 9, 18
#: the narrow float types held and computed in float32 (each of their values is a float32
#: value): a float16 or bfloat16 weight is widened at import, a Cast to them is a cast to
#: float32; a float16 input or output of the graph keeps its dtype at the network's boundary
#: (:func:`boundary_dtype`), a bfloat16 one is refused (:func:`check_io_dtypes`)
WIDENED = ("float16", "bfloat16")
#: largest initializer accepted, and the whole model's weights (bytes)
MAX_TENSOR_BYTES = 4 << 30
MAX_NODES = 100_000
#: nodes of subgraphs converted in one import (both branches of each If, a Loop's or Scan's
#: body once per iteration it is unrolled)
MAX_SUBGRAPH_NODES = 20_000


def require_onnx():
    try:
        import onnx
    except ImportError:
        raise ModelError("importing an ONNX model needs the onnx package: "
                         "pip install 'kernelrpc[onnx]'") from None
    return onnx


def load(model):
    """An ``onnx.ModelProto`` from a proto, a path or bytes; malformed files are ModelErrors."""
    onnx = require_onnx()
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto):
        return check_io_dtypes(model)
    try:
        if isinstance(model, (bytes, bytearray)):
            return check_io_dtypes(onnx.load_from_string(bytes(model)))
        if isinstance(model, (str, os.PathLike)):
            return check_io_dtypes(onnx.load(os.fspath(model)))
    except FileNotFoundError:
        raise ModelError(f"no model file {model}") from None
    except (DecodeError, RuntimeError, ValueError, OSError) as exc:
        what = "the model" if isinstance(model, (bytes, bytearray)) else str(model)
        raise ModelError(f"{what} is not a readable ONNX file: {exc}") from None
    raise TypeError(f"from_onnx: expected an onnx.ModelProto, a path or bytes, got "
                    f"{type(model).__name__}")


def check_io_dtypes(model):
    """The model, unless an input or output of its graph is bfloat16, a type that neither the
    runtime's tensors nor numpy hold."""
    weights = {init.name for init in model.graph.initializer}      # listed as inputs too
    inputs = [info for info in model.graph.input if info.name not in weights]
    narrow = [f"{what} {info.name!r} is bfloat16"
              for what, infos in (("input", inputs), ("output", model.graph.output))
              for info in infos
              if _onnx_dtype(info.type.tensor_type.elem_type) == "bfloat16"]
    if narrow:
        raise ModelError(
            f"{'; '.join(narrow)}: kernelrpc's tensors have no bfloat16 dtype (numpy has none "
            "to feed or read it); bfloat16 weights are widened to float32 at import, so give "
            "the model float32 (or float16) inputs and outputs: a Cast after each input and "
            "before each output")
    return model


def _onnx_dtype(elem_type: int) -> str | None:
    """numpy's name of an ONNX element type, None for an unknown or unset one."""
    onnx = require_onnx()
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError, ValueError):
        return None


def with_functions_inlined(model):
    """The model with its local functions (``model.functions``: what an exporter writes for a
    module kept whole) replaced by their nodes at every call, in subgraphs too; a model without
    any is returned as it is. The nodes that inlining makes are counted first (functions
    calling functions multiply them), at most MAX_NODES."""
    if not model.functions:
        return model
    from onnx import inliner

    count = _inlined_size(model)
    if count > MAX_NODES:
        raise ModelError(f"the model's local functions inlined come to more than {MAX_NODES} "
                         "nodes")
    try:
        return inliner.inline_local_functions(model)
    except (RuntimeError, ValueError) as exc:     # the inliner's failed checks
        raise ModelError(f"the model's local functions cannot be inlined: {exc}") from None


def _inlined_size(model) -> int:
    """The nodes of the model once its local functions are inlined (subgraphs' included),
    counted up to MAX_NODES + 1; a function that calls itself is a ModelError."""
    functions = {(f.domain, f.name): f for f in model.functions}
    sizes: dict = {}

    def size_of(nodes, calling) -> int:
        total = 0
        for node in nodes:
            key = (node.domain, node.op_type)
            if key in functions:
                if key in calling:
                    raise ModelError(f"local function {key[1]!r} calls itself")
                if key not in sizes:
                    sizes[key] = size_of(functions[key].node, calling | {key})
                total += sizes[key]
            else:
                total += 1
            for attr in node.attribute:
                for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    total += size_of(sub.node, calling)
            if total > MAX_NODES:
                return MAX_NODES + 1
        return total
    return size_of(model.graph.node, frozenset())


def default_opset(model) -> int:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    raise ModelError("the model imports no version of the default ONNX operator set")


def check_opset(opset: int) -> None:
    if opset < MIN_OPSET:
        raise ModelError(f"the model uses ONNX opset {opset}; kernelrpc imports opsets "
                         f"{MIN_OPSET} and newer (convert it with "
                         f"onnx.version_converter.convert_version(model, {MAX_OPSET}))")


def operator_version_known(op_type: str, opset: int, since: int) -> bool:
    """Whether the definition of ``op_type`` in ``opset`` is one its converter (registered
    from opset ``since``) implements. The converters follow the definitions of opsets 9 to 18
    and those they are registered for; a newer version is the same operator when ONNX changed
    only its types: the same inputs, outputs and text, and no attribute taken away (one it
    added is refused when set, as every attribute a converter does not read)."""
    if opset <= MAX_OPSET:
        return True
    from onnx import defs

    try:
        current = defs.get_schema(op_type, opset)
    except defs.SchemaError:
        return False
    written = _first_schema(defs, op_type, max(MAX_OPSET, since), opset)
    return current.since_version == written.since_version or _same_operator(written, current)


def _first_schema(defs, op_type: str, start: int, opset: int):
    """The schema of ``op_type`` in opset ``start``, or, for an operator newer than that, its
    first version (the one a converter registered for every opset was written for)."""
    for version in range(start, opset):
        try:
            return defs.get_schema(op_type, version)
        except defs.SchemaError:
            continue
    return defs.get_schema(op_type, opset)


def _same_operator(old, new) -> bool:
    def params(formals):
        return [(f.name, f.option) for f in formals]
    return (params(old.inputs) == params(new.inputs)
            and params(old.outputs) == params(new.outputs)
            and " ".join(old.doc.split()) == " ".join(new.doc.split())
            and all(name in new.attributes and new.attributes[name].type == attr.type
                    for name, attr in old.attributes.items()))


def tensor_value(proto, where: str) -> np.ndarray:
    onnx = require_onnx()
    from onnx import numpy_helper

    if proto.data_location == onnx.TensorProto.EXTERNAL:
        raise ModelError(f"{where}: weights stored outside the file (external data) must be "
                         "loaded first: onnx.load(path, load_external_data=True)")
    dims = list(proto.dims)
    if any(d < 0 for d in dims):
        raise ModelError(f"{where}: negative dimension in {dims}")
    itemsize = np.dtype(elem_dtype(proto.data_type, where)).itemsize
    if int(np.prod(dims, dtype=np.float64)) * itemsize > MAX_TENSOR_BYTES:
        raise ModelError(f"{where}: tensor of shape {dims} is larger than {MAX_TENSOR_BYTES} bytes")
    try:
        value = numpy_helper.to_array(proto)
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelError(f"{where}: tensor data is malformed: {exc}") from None
    return value.astype(np.float32) if value.dtype.name in WIDENED else value


def elem_dtype(elem_type: int, where: str) -> str:
    """The dtype kernelrpc holds an ONNX element type in: its own, float32 for float16 and
    bfloat16."""
    dtype = _onnx_dtype(elem_type) if elem_type else None
    if dtype is None:
        raise ModelError(f"{where}: unknown element type {elem_type}")
    if dtype in WIDENED:
        return "float32"
    if dtype not in DTYPES:
        raise ModelError(f"{where}: dtype {dtype} is not supported")
    return dtype


def boundary_dtype(value_info, computed: str) -> str:
    """The dtype of a graph input or output at the network's boundary: float16 for a float16
    one (the network casts it to and from the float32 it computes in, ``computed``),
    else ``computed``."""
    if _onnx_dtype(value_info.type.tensor_type.elem_type) == "float16":
        return "float16"
    return computed


def input_dtype(value_info, default) -> str:
    """The input's dtype: the model's, else ``default`` (a dtype, or a dict by input name)."""
    elem = value_info.type.tensor_type.elem_type
    if elem:
        return elem_dtype(elem, f"input {value_info.name!r}")
    return default.get(value_info.name, "float32") if isinstance(default, dict) else default


def const_input_values(graph, const_inputs: dict, shape: dict, dtype) -> dict:
    """Each of ``const_inputs`` (input name -> value) as an array of the input's dtype and
    shape; a name that is no input, a value the dtype does not hold exactly, or one of
    another shape is a ModelError."""
    initialized = {init.name for init in graph.initializer}
    inputs = {i.name: i for i in graph.input if i.name not in initialized}
    values = {}
    for name, value in const_inputs.items():
        if name not in inputs:
            raise ModelError(f"const_inputs names {name!r}, which is not an input of the model "
                             f"(inputs: {', '.join(map(repr, inputs)) or 'none'})")
        if name in shape:
            raise ModelError(f"input {name!r} is given both a shape and a constant value")
        info = inputs[name]
        computed = input_dtype(info, dtype)
        want = boundary_dtype(info, computed)
        try:
            given = np.asarray(value)
            array = given.astype(want)
        except (TypeError, ValueError):
            raise ModelError(f"const_inputs[{name!r}] = {value!r} is not a {want} value") from None
        if given.dtype.kind not in "biuf" or not np.array_equal(array, given):
            raise ModelError(f"const_inputs[{name!r}] = {value!r} is not exactly a {want} value")
        values[name] = _shaped(info, array.astype(computed))
    return values


def _shaped(info, array):
    """``array`` in the input's shape: its own when the model gives none or the ranks agree
    (the model's fixed dimensions must match), else reshaped to the model's fully fixed shape
    of the same size (a scalar for a ``[1]`` input)."""
    ttype = info.type.tensor_type
    if not ttype.HasField("shape"):
        return array
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
            for d in ttype.shape.dim]
    if None not in dims and math.prod(dims) == array.size and len(dims) != array.ndim:
        return array.reshape(dims)
    if len(dims) != array.ndim or any(d is not None and d != s for d, s in zip(dims, array.shape)):
        shown = [d if d is not None else "?" for d in dims]
        raise ModelError(f"input {info.name!r} has shape {shown} in the model, the constant "
                         f"given has shape {list(array.shape)}")
    return array


def input_shape(value_info, given) -> tuple:
    """The static shape of a graph input: ``given`` (from ``shape=``) or the model's own."""
    name = value_info.name
    ttype = value_info.type.tensor_type
    dims = list(ttype.shape.dim) if ttype.HasField("shape") else None
    if given is not None:
        try:
            shape = tuple(int(d) for d in given)
        except (TypeError, ValueError):
            raise ModelError(f"shape of input {name!r} must be a sequence of integers, "
                             f"got {given!r}") from None
        if any(d <= 0 for d in shape):
            raise ModelError(f"shape of input {name!r} must be positive, got {list(shape)}")
        if dims is not None:
            if len(dims) != len(shape):
                raise ModelError(f"input {name!r} has {len(dims)} dimensions in the model, the "
                                 f"shape given has {len(shape)}")
            for k, (d, s) in enumerate(zip(dims, shape)):
                if d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != s:
                    raise ModelError(f"input {name!r}: dimension {k} is {d.dim_value} in the "
                                     f"model, the shape given says {s}")
        return shape
    if dims is None:
        raise MissingShapeError(f"input {name!r} has no shape in the model: give it, e.g. "
                                f"from_onnx(model, shape={{{name!r}: (1, 3, 224, 224)}})")
    shape = []
    for k, d in enumerate(dims):
        if not d.HasField("dim_value") or d.dim_value <= 0:
            label = d.dim_param or "?"
            raise MissingShapeError(
                f"input {name!r} has a dynamic dimension {k} ({label!r}): give its shape, e.g. "
                f"from_onnx(model, shape={{{name!r}: (...)}}) (python -m kernelrpc.model: "
                f"--input {name}=1,3,224,224)")
        shape.append(int(d.dim_value))
    return tuple(shape)


def check_node_form(node, opset: int, where: str) -> None:
    """The node has the inputs, outputs and attribute types its operator's ONNX schema
    defines (the counts, every required input and attribute present, each attribute of its
    declared type), so that no converter meets a node of another shape."""
    from onnx import defs

    try:
        schema = defs.get_schema(node.op_type, opset)
    except defs.SchemaError:
        raise ModelError(f"{where}: ONNX opset {opset} defines no operator {node.op_type}") from None
    count = len(node.input)
    if not schema.min_input <= count <= schema.max_input:
        raise ModelError(f"{where}: {node.op_type} takes {schema.min_input} to "
                         f"{schema.max_input} inputs, the node has {count}")
    if not schema.min_output <= len(node.output) <= schema.max_output:
        raise ModelError(f"{where}: {node.op_type} has {schema.min_output} to "
                         f"{schema.max_output} outputs, the node {len(node.output)}")
    single = defs.OpSchema.FormalParameterOption.Single
    for k, formal in enumerate(schema.inputs[:count]):
        if formal.option == single and not node.input[k]:
            raise ModelError(f"{where}: required input {k} ({formal.name}) is missing")
    seen = set()
    for attr in node.attribute:
        if attr.name in seen:
            raise ModelError(f"{where}: attribute {attr.name!r} appears twice")
        seen.add(attr.name)
        spec = schema.attributes.get(attr.name)
        if spec is not None and attr.type != spec.type:
            raise ModelError(f"{where}: attribute {attr.name!r} is of type {attr.type}, "
                             f"{node.op_type} defines type {int(spec.type)}")
    for name, spec in schema.attributes.items():
        if spec.required and name not in seen:
            raise ModelError(f"{where}: required attribute {name!r} is missing")
