"""The ONNX importer's converter table: each converter registered for the opsets from which it
implements its operator, the newest one not newer than the model's opset chosen."""
import pytest

pytest.importorskip("onnx")

from kernelrpc.relay.frontend import onnx_common  # noqa: E402
from kernelrpc.relay.frontend.onnx_common import converter, find_converter  # noqa: E402


@pytest.fixture
def table(monkeypatch):
    monkeypatch.setattr(onnx_common, "CONVERTERS", {})
    return onnx_common.CONVERTERS


def test_the_newest_registration_not_newer_than_the_opset_converts(table):
    @converter("Op")
    def old(ctx, args, attrs):
        return []

    @converter("Op", since=13)
    def new(ctx, args, attrs):
        return []

    assert find_converter("Op", 9) == (1, old)
    assert find_converter("Op", 12) == (1, old)
    assert find_converter("Op", 13) == (13, new)
    assert find_converter("Op", 21) == (13, new)
    assert find_converter("Other", 13) is None


def test_an_operator_first_converted_from_a_later_opset_is_absent_before(table):
    @converter("Late", since=20)
    def late(ctx, args, attrs):
        return []

    assert find_converter("Late", 19) is None
    assert find_converter("Late", 20) == (20, late)


def test_two_converters_of_one_version_are_a_programming_error(table):
    converter("Op", since=11)(lambda ctx, args, attrs: [])
    with pytest.raises(ValueError, match="two converters of Op since opset 11"):
        converter("Op", since=11)(lambda ctx, args, attrs: [])


def test_the_shipped_table_has_the_versioned_forms():
    assert find_converter("Squeeze", 11)[0] == 1 and find_converter("Squeeze", 13)[0] == 13
    assert find_converter("Split", 18)[0] == 18 and find_converter("Slice", 9)[0] == 1
    assert find_converter("ReduceSum", 13)[0] == 13 and find_converter("ReduceMean", 13)[0] == 1
