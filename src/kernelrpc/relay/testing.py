"""Networks for tests and benchmarks (TVM's ``relay.testing``), as ONNX models: built in code
with ``onnx.helper`` and seeded random weights (:func:`resnet18`, :func:`mobilenet_v2` at any
width and input size), or the small networks the onnx wheel ships for its own tests
(``onnx/backend/test/data/light``) with their constant weights replaced by seeded random ones
(:func:`light_model`). Nothing is downloaded. Needs ``onnx`` (``kernelrpc[onnx]``).
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from .frontend.onnx_model import require_onnx

onnx = require_onnx()
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

log = logging.getLogger(__name__)

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_names() -> list[str]:
    return sorted(p.stem[len("light_"):] for p in LIGHT.glob("light_*.onnx"))


def _random_weight(rng, shape, dtype):
    shape = tuple(int(d) for d in shape)
    if len(shape) <= 1:
        return rng.uniform(0.5, 1.5, shape).astype(dtype)        # BN scale/var stay positive
    fan_in = math.prod(shape[1:]) if len(shape) == 4 else shape[-1] if len(shape) == 2 else \
        math.prod(shape[1:])
    return (rng.standard_normal(shape) * math.sqrt(1.0 / max(fan_in, 1))).astype(dtype)


def light_model(name: str, seed: int = 0):
    """The onnx wheel's ``light_<name>`` network with seeded random weights (initializers)."""
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"))
    rng = np.random.default_rng(seed)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    kept = []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = numpy_helper.to_array(inits[node.input[0]])
            value = node.attribute[0].t if node.attribute else None
            dtype = numpy_helper.to_array(value).dtype if value is not None else np.float32
            graph.initializer.append(numpy_helper.from_array(
                _random_weight(rng, shape, dtype), node.output[0]))
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for node in graph.node for name in node.input}
    for init in list(graph.initializer):
        if init.name not in used:
            graph.initializer.remove(init)
    initialized = {i.name for i in graph.initializer}
    for info in list(graph.input):
        if info.name in initialized or info.name not in used:
            graph.input.remove(info)
    return model


def model_input(model, batch: int | None = None, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for info in model.graph.input:
        dims = [d.dim_value for d in info.type.tensor_type.shape.dim]
        if batch is not None:
            dims[0] = batch
        out[info.name] = rng.standard_normal(dims).astype(np.float32)
    return out


def set_batch(model, batch: int):
    """The model with its first input's and outputs' batch dimension made ``batch``."""
    for info in list(model.graph.input) + list(model.graph.output):
        dims = info.type.tensor_type.shape.dim
        if dims:
            dims[0].dim_value = batch
    return model


#: onnxruntime's session option for exact uint8 x int8 sums on x86 hosts without VNNI, where its
#: default kernels (``vpmaddubsw``) saturate each pair of products in int16 and its results
#: depend on the host; kernelrpc's int8 layers compute the exact sums on every target, as
#: onnxruntime does on VNNI, AMX and Arm hosts, where the option changes nothing
EXACT_INT8_OPTION = ("session.x64quantprecision", "1")


def onnxruntime_session(model, threads: int = 1):
    """onnxruntime's CPU session of ``model`` with ``threads`` intra-op threads (0: its
    default, every core; one inter-op thread) and exact int8 sums (:data:`EXACT_INT8_OPTION`),
    as the benches, the tests and the model command compare against it. Where onnxruntime
    cannot build the exact form (its uint8 weights for a QLinearMatMul of uint8 x int8 have no
    kernel), its default session, with a warning."""
    import onnxruntime as ort

    def session(exact: bool):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        if exact:
            options.add_session_config_entry(*EXACT_INT8_OPTION)
        return ort.InferenceSession(model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"])
    try:
        return session(exact=True)
    except ort.capi.onnxruntime_pybind11_state.NotImplemented as e:
        log.warning("onnxruntime's default int8 sums (it cannot build %s=%s: %s)",
                    *EXACT_INT8_OPTION, str(e).splitlines()[0])
        return session(exact=False)


def onnxruntime_outputs(model, feeds: dict, threads: int = 1) -> list:
    return onnxruntime_session(model, threads).run(None, feeds)


# ---------------------------------------------------------------------- networks built in code

class Builder:
    """A little graph builder: ``b.conv(x, 16, 3, stride=2)`` adds nodes and seeded weights."""

    def __init__(self, seed: int = 0, opset: int = 13):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.count, self.opset = [], [], 0, opset

    def name(self, kind: str) -> str:
        self.count += 1
        return f"{kind}{self.count}"

    def weight(self, shape, scale=None, positive=False) -> str:
        name = self.name("w")
        if positive:
            value = self.rng.uniform(0.5, 1.5, shape)
        else:
            fan = math.prod(shape[1:]) if len(shape) > 1 else 1
            value = self.rng.standard_normal(shape) * (scale or math.sqrt(2.0 / fan))
        self.inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def op(self, op_type: str, inputs, **attrs) -> str:
        out = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=out, **attrs))
        return out

    def conv(self, x, cin, cout, k, stride=1, groups=1, bias=True, pad=None):
        pad = k // 2 if pad is None else pad
        inputs = [x, self.weight((cout, cin // groups, k, k))]
        if bias:
            inputs.append(self.weight((cout,), scale=0.1))
        return self.op("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[pad] * 4, group=groups)

    def bn(self, x, c):
        return self.op("BatchNormalization", [x, self.weight((c,), positive=True),
                                              self.weight((c,), scale=0.1),
                                              self.weight((c,), scale=0.1),
                                              self.weight((c,), positive=True)], epsilon=1e-5)

    def model(self, inputs: dict, outputs: list):
        graph = helper.make_graph(
            self.nodes, "net",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 8
        return model


def mobilenet_v2(batch=1, size=64, width=0.5, classes=100, seed=0):
    """MobileNet-v2's structure (inverted residuals, depthwise 3x3, ReLU6 as Clip) at a reduced
    width and input size, so that tests build it in seconds."""
    b = Builder(seed)

    def ch(c):
        return max(8, int(c * width + 4) // 8 * 8)
    x = b.op("Clip", [b.bn(b.conv("input", 3, ch(32), 3, stride=2, bias=False), ch(32)),
                      b.const(0.0), b.const(6.0)])
    cin = ch(32)
    settings = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 2, 2), (6, 96, 1, 1),
                (6, 160, 2, 2), (6, 320, 1, 1)]
    for t, c, n, s in settings:
        cout = ch(c)
        for i in range(n):
            stride = s if i == 0 else 1
            hidden = cin * t
            y = x
            if t != 1:
                y = b.op("Clip", [b.bn(b.conv(y, cin, hidden, 1, bias=False), hidden),
                                  b.const(0.0), b.const(6.0)])
            y = b.op("Clip", [b.bn(b.conv(y, hidden, hidden, 3, stride=stride, groups=hidden,
                                          bias=False), hidden), b.const(0.0), b.const(6.0)])
            y = b.bn(b.conv(y, hidden, cout, 1, bias=False), cout)
            x = b.op("Add", [x, y]) if stride == 1 and cin == cout else y
            cin = cout
    x = b.op("Clip", [b.bn(b.conv(x, cin, 1280 // 4, 1, bias=False), 1280 // 4),
                      b.const(0.0), b.const(6.0)])
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    x = b.op("Gemm", [x, b.weight((classes, 1280 // 4), scale=0.05), b.weight((classes,), 0.1)],
             transB=1)
    return b.model({"input": [batch, 3, size, size]}, [x])


def _const(self, value):
    """A constant: an integer array keeps its dtype (shapes, indices), anything else float32."""
    name = self.name("c")
    value = np.asarray(value)
    if value.dtype.kind != "i":
        value = value.astype(np.float32)
    self.inits.append(numpy_helper.from_array(value, name))
    return name


Builder.const = _const


def resnet18(batch=1, size=64, width=0.25, classes=100, seed=0):
    """ResNet-18's structure (basic blocks, strided 1x1 shortcuts) at a reduced width and size."""
    b = Builder(seed)
    c = int(64 * width)
    x = b.op("Relu", [b.bn(b.conv("input", 3, c, 7, stride=2, bias=False), c)])
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = c
    for stage, blocks in enumerate([2, 2, 2, 2]):
        cout = c * 2 ** stage
        for i in range(blocks):
            stride = 2 if stage > 0 and i == 0 else 1
            y = b.op("Relu", [b.bn(b.conv(x, cin, cout, 3, stride=stride, bias=False), cout)])
            y = b.bn(b.conv(y, cout, cout, 3, bias=False), cout)
            short = x if stride == 1 and cin == cout else \
                b.bn(b.conv(x, cin, cout, 1, stride=stride, bias=False, pad=0), cout)
            x = b.op("Relu", [b.op("Add", [y, short])])
            cin = cout
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    x = b.op("Gemm", [x, b.weight((classes, cin), scale=0.1), b.weight((classes,), 0.1)],
             transB=1)
    return b.model({"input": [batch, 3, size, size]}, [x])


# ---------------------------------------------------------------------- transformers

def transformer(kind: str = "bert", seq: int = 128, width: int = 256, heads: int = 4,
                layers: int = 2, ffn: int = 4, classes: int = 100, seed: int = 0):
    """A transformer written the way torch exports one at opset 17 (MatMul + Add, Reshape and
    Transpose into heads, Softmax, LayerNormalization, GELU), with seeded random weights.

    ``kind``: ``"bert"`` (an encoder over ``seq`` tokens' embeddings, input ``[1, seq, width]``,
    GELU by Erf), ``"vit"`` (16x16 patches of a 224x224 image, a class token: ``seq`` is 197,
    GELU by Erf, the class token's row pooled and classified), ``"gpt2"`` (a decoder block:
    a causal mask added to the scores, GELU by Tanh and Pow)."""
    if kind not in ("bert", "vit", "gpt2"):
        raise ValueError(f"transformer kind {kind!r}: bert, vit or gpt2")
    if width % heads:
        raise ValueError(f"width {width} is not a multiple of {heads} heads")
    b = Builder(seed, opset=17)
    if kind == "vit":
        seq, patches = 197, 196
        x = b.conv("image", 3, width, 16, stride=16, pad=0)
        x = b.op("Reshape", [x, b.const(np.array([1, width, patches], np.int64))])
        x = b.op("Transpose", [x], perm=[0, 2, 1])
        x = b.op("Concat", [b.weight((1, 1, width), scale=0.02), x], axis=1)
        x = b.op("Add", [x, b.weight((1, seq, width), scale=0.02)])
        inputs = {"image": [1, 3, 224, 224]}
    else:
        x = "tokens"
        inputs = {"tokens": [1, seq, width]}
    mask = None
    if kind == "gpt2":
        causal = np.triu(np.full((seq, seq), -1e4, np.float32), 1)
        mask = b.const(causal.reshape(1, 1, seq, seq))
    for _ in range(layers):
        x = _transformer_layer(b, x, seq, width, heads, ffn, mask, tanh_gelu=kind == "gpt2")
    if kind == "vit":
        x = b.op("Slice", [x, b.const(np.array([0], np.int64)), b.const(np.array([1], np.int64)),
                           b.const(np.array([1], np.int64))])
        x = b.op("Reshape", [x, b.const(np.array([1, width], np.int64))])
        x = b.op("Add", [b.op("MatMul", [x, b.weight((width, classes), scale=0.05)]),
                         b.weight((classes,), scale=0.02)])
    return b.model(inputs, [x])


def _dense(b, x, n_in, n_out):
    return b.op("Add", [b.op("MatMul", [x, b.weight((n_in, n_out), scale=1 / math.sqrt(n_in))]),
                        b.weight((n_out,), scale=0.02)])


def _layer_norm(b, x, width):
    return b.op("LayerNormalization", [x, b.weight((width,), positive=True),
                                       b.weight((width,), scale=0.02)], axis=-1, epsilon=1e-5)


def _gelu(b, x, tanh: bool):
    half = b.const(np.array(0.5, np.float32))
    one = b.const(np.array(1.0, np.float32))
    if tanh:           # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = b.op("Pow", [x, b.const(np.array(3.0, np.float32))])
        inner = b.op("Add", [x, b.op("Mul", [cube, b.const(np.array(0.044715, np.float32))])])
        inner = b.op("Mul", [inner, b.const(np.array(math.sqrt(2 / math.pi), np.float32))])
        t = b.op("Tanh", [inner])
    else:              # 0.5 x (1 + erf(x / sqrt(2)))
        t = b.op("Erf", [b.op("Div", [x, b.const(np.array(math.sqrt(2), np.float32))])])
    return b.op("Mul", [b.op("Mul", [x, half]), b.op("Add", [t, one])])


def _transformer_layer(b, x, seq, width, heads, ffn, mask, tanh_gelu):
    head = width // heads
    split = b.const(np.array([1, seq, heads, head], np.int64))

    def heads_of(t, perm):
        return b.op("Transpose", [b.op("Reshape", [t, split])], perm=perm)
    q = heads_of(_dense(b, x, width, width), [0, 2, 1, 3])
    k = heads_of(_dense(b, x, width, width), [0, 2, 3, 1])
    v = heads_of(_dense(b, x, width, width), [0, 2, 1, 3])
    scores = b.op("Mul", [b.op("MatMul", [q, k]),
                          b.const(np.array(1 / math.sqrt(head), np.float32))])
    if mask is not None:
        scores = b.op("Add", [scores, mask])
    context = b.op("MatMul", [b.op("Softmax", [scores], axis=-1), v])
    context = b.op("Reshape", [b.op("Transpose", [context], perm=[0, 2, 1, 3]),
                               b.const(np.array([1, seq, width], np.int64))])
    x = _layer_norm(b, b.op("Add", [x, _dense(b, context, width, width)]), width)
    hidden = _gelu(b, _dense(b, x, width, ffn * width), tanh_gelu)
    return _layer_norm(b, b.op("Add", [x, _dense(b, hidden, ffn * width, width)]), width)
