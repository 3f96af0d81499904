"""A damaged model file is a ModelError, never another exception: the importer's reading of
every length, shape, attribute and tensor from the file is checked (hypothesis mutates the
bytes of a small valid network, and the attributes of its nodes)."""
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402
from onnx import helper  # noqa: E402

from kernelrpc import relay  # noqa: E402
from kernelrpc.relay import ModelError  # noqa: E402
from kernelrpc.relay.testing import resnet18  # noqa: E402

MODEL = resnet18(size=16, width=0.125, classes=4)
BYTES = MODEL.SerializeToString()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(BYTES) - 1), st.integers(0, 255)),
                min_size=1, max_size=8))
def test_mutated_bytes_import_or_raise_a_model_error(edits):
    data = bytearray(BYTES)
    for offset, value in edits:
        data[offset] = value
    try:
        relay.frontend.from_onnx(bytes(data))
    except ModelError:
        pass


ATTRS = st.one_of(st.integers(-3, 9), st.lists(st.integers(-3, 9), max_size=6),
                  st.floats(allow_nan=True, allow_infinity=True, width=32), st.text(max_size=8))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(MODEL.graph.node) - 1),
       st.sampled_from(["kernel_shape", "strides", "pads", "group", "dilations", "auto_pad",
                        "axis", "perm", "alpha", "ceil_mode", "epsilon", "transB"]),
       ATTRS)
def test_attribute_values_from_the_file_are_checked(index, name, value):
    model = onnx.ModelProto()
    model.CopyFrom(MODEL)
    node = model.graph.node[index]
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    kind = onnx.AttributeProto.INTS if value == [] else None
    node.attribute.extend(kept + [helper.make_attribute(name, value, attr_type=kind)])
    try:
        mod, params = relay.frontend.from_onnx(model)
    except ModelError:
        return
    assert all(isinstance(v, np.ndarray) for v in params.values())
    assert all(d > 0 for n in mod["main"].topo() for d in n.shape)
