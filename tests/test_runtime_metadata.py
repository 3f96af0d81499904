import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelrpc.errors import ModuleError
from kernelrpc.runtime.metadata import MAX_ARGS, parse_metadata

GOOD = {
    "format": "kernelrpc.module",
    "version": 1,
    "producer": "test",
    "target": {"string": "llvm", "triple": "x86_64-unknown-linux-gnu"},
    "entry": "gemm",
    "lowered_ir": "unknown keys are ignored",
    "functions": [{
        "name": "gemm",
        "symbol": "__kernelrpc_fn_gemm",
        "args": [
            {"name": "A", "kind": "tensor", "dtype": "float32", "shape": [16, 8]},
            {"name": "alpha", "kind": "scalar", "dtype": "float64"},
        ],
    }],
}


def with_change(path: str, value):
    doc = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    elif value is DELETE:
        del node[last]
    else:
        node[last] = value
    return json.dumps(doc)


DELETE = object()


def test_good_metadata():
    meta = parse_metadata(json.dumps(GOOD).encode())
    assert meta.version == 1 and meta.entry == "gemm" and meta.target["triple"].startswith("x86")
    spec = meta.functions["gemm"]
    assert spec.symbol == "__kernelrpc_fn_gemm"
    assert [a.kind for a in spec.args] == ["tensor", "scalar"]
    assert spec.args[0].shape == (16, 8) and spec.args[1].shape is None
    assert spec.signature() == "gemm(A: float32[16, 8], alpha: float64)"
    assert meta.document["lowered_ir"] == "unknown keys are ignored"


def test_newer_version_names_both_versions():
    with pytest.raises(ModuleError, match="version 2 is newer .* supports \\(version 1\\)"):
        parse_metadata(with_change("version", 2))


@pytest.mark.parametrize("path, value, message", [
    ("format", "tvm.module", "not a kernelrpc module"),
    ("version", "1", "'version' must be a positive integer"),
    ("version", True, "'version' must be a positive integer"),
    ("version", 0, "'version' must be a positive integer"),
    ("target", "llvm", "'target' must be an object"),
    ("producer", 3, "'producer' must be a string"),
    ("entry", "nope", "'entry' 'nope' does not name a declared function"),
    ("functions", {}, "'functions' must be a list"),
    ("functions.0", "gemm", "functions\\[0\\] must be an object"),
    ("functions.0.name", "a b", "functions\\[0\\].name must be an identifier"),
    ("functions.0.name", "x" * 300, "functions\\[0\\].name must be an identifier"),
    ("functions.0.symbol", "abort", "symbol must be an identifier"),
    ("functions.0.symbol", 12, "symbol must be an identifier"),
    ("functions.0.args", None, "args of 'gemm' must be a list"),
    ("functions.0.args.0", [], "args\\[0\\] must be an object"),
    ("functions.0.args.0.kind", "pointer", "kind must be 'tensor' or 'scalar'"),
    ("functions.0.args.0.dtype", "float128", "dtype 'float128' is not one of"),
    ("functions.0.args.0.dtype", None, "dtype None is not one of"),
    ("functions.0.args.0.shape", [16, -1], "shape entries must be non-negative integers"),
    ("functions.0.args.0.shape", [16, 2.0], "shape entries must be non-negative integers"),
    ("functions.0.args.0.shape", [True], "shape entries must be non-negative integers"),
    ("functions.0.args.0.shape", "16", "shape must be a list"),
    ("functions.0.args.0.shape", [1] * 33, "shape must be a list of at most 32"),
    ("functions.0.args.0.shape", [1 << 40, 1 << 40], "implausibly large"),
    ("functions.0.args.0.name", 5, "name must be a string"),
])
def test_bad_fields_are_reported(path, value, message):
    with pytest.raises(ModuleError, match=message):
        parse_metadata(with_change(path, value))


def test_missing_functions_and_duplicates():
    with pytest.raises(ModuleError, match="'functions' must be a list"):
        parse_metadata(with_change("functions", DELETE))
    doc = copy.deepcopy(GOOD)
    doc["functions"].append(doc["functions"][0])
    with pytest.raises(ModuleError, match="declares function 'gemm' twice"):
        parse_metadata(json.dumps(doc))


def test_argument_count_limit():
    arg = {"name": "x", "kind": "scalar", "dtype": "int32"}
    assert len(parse_metadata(with_change("functions.0.args", [arg] * MAX_ARGS))
               .functions["gemm"].args) == MAX_ARGS
    with pytest.raises(ModuleError, match="257 arguments; at most 256"):
        parse_metadata(with_change("functions.0.args", [arg] * (MAX_ARGS + 1)))


@pytest.mark.parametrize("text", [b"", b"{", b"\xff\xfe", b"[1, 2]", b"null", b"[" * 100000])
def test_not_json_or_not_an_object(text):
    with pytest.raises(ModuleError):
        parse_metadata(text)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                      children, max_size=4),
    max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_give_a_module_error_or_metadata(data):
    try:
        parse_metadata(data)
    except ModuleError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["version", "entry", "target", "functions", "functions.0",
                        "functions.0.name", "functions.0.args", "functions.0.args.0",
                        "functions.0.args.0.shape", "functions.0.args.1.dtype",
                        "functions.0.args.1.kind"]), json_values)
def test_any_json_in_any_field_gives_a_module_error_or_metadata(path, value):
    try:
        parse_metadata(with_change(path, value))
    except ModuleError:
        pass
