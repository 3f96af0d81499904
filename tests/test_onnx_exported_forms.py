"""Graph fragments written the way exporters write them, checked against onnxruntime: a
BERT-style input block (token embeddings looked up at run time, positions from Range over the
input's length, the attention mask turned into an additive bias, class-token pooling) and a
byte classifier whose one-hot comes from Equal against Range."""
import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto  # noqa: E402
from onnx_check import N, check_graph, rand  # noqa: E402

RNG = np.random.default_rng(31)


def _i64(value):
    return np.asarray(value, np.int64)


def test_bert_style_embeddings_mask_and_class_token():
    seq, hidden, vocab = 7, 8, 30
    nodes = [N("Shape", ["ids"], ["shape"]), N("Gather", ["shape", "one"], ["length"]),
             N("Range", ["zero", "length", "one"], ["positions"]),
             N("Unsqueeze", ["positions", "ax0"], ["positions2"]),
             N("Expand", ["positions2", "shape"], ["pos_ids"]),
             N("Gather", ["words", "ids"], ["w"]), N("Gather", ["places", "pos_ids"], ["p"]),
             N("Add", ["w", "p"], ["emb"]),
             N("Unsqueeze", ["mask", "ax12"], ["m4"]),
             N("Cast", ["m4"], ["mf"], to=TensorProto.FLOAT),
             N("Sub", ["onef", "mf"], ["inv"]), N("Mul", ["inv", "big"], ["bias"]),
             N("Transpose", ["emb"], ["embT"], perm=[0, 2, 1]),
             N("MatMul", ["emb", "embT"], ["s"]), N("Unsqueeze", ["s", "ax1"], ["s4"]),
             N("Add", ["s4", "bias"], ["scores"]), N("Softmax", ["scores"], ["att"], axis=-1),
             N("Squeeze", ["att", "ax1"], ["att3"]), N("MatMul", ["att3", "emb"], ["ctx"]),
             N("Gather", ["ctx", "zero"], ["cls"], axis=1)]
    inits = {"words": rand(RNG, vocab, hidden), "places": rand(RNG, seq, hidden), "zero": _i64(0),
             "one": _i64(1), "ax0": _i64([0]), "ax1": _i64([1]), "ax12": _i64([1, 2]),
             "onef": np.asarray(1.0, np.float32), "big": np.asarray(-1e4, np.float32)}
    mask = np.ones((2, seq), np.int64)
    mask[1, 4:] = 0
    check_graph(nodes, {"ids": RNG.integers(0, vocab, (2, seq)).astype(np.int64), "mask": mask},
          ["cls"], inits=inits, opset=13)


def test_byte_classifier_one_hot_by_equal():
    nodes = [N("Unsqueeze", ["bytes", "ax"], ["b3"]), N("Range", ["zero", "n", "one"], ["r"]),
             N("Equal", ["b3", "r"], ["hot"]), N("Cast", ["hot"], ["x"], to=TensorProto.FLOAT),
             N("ReduceMean", ["x"], ["hist"], axes=[1], keepdims=0),
             N("MatMul", ["hist", "w"], ["y"])]
    inits = {"ax": _i64([-1]), "zero": _i64(0), "n": _i64(256), "one": _i64(1),
             "w": rand(RNG, 256, 5)}
    check_graph(nodes, {"bytes": RNG.integers(0, 256, (3, 64)).astype(np.int64)}, inits=inits)
