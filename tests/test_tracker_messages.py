"""Validation of tracker messages: anything a peer sends is a command or a ProtocolError."""
import pytest
from hypothesis import given, strategies as st

from kernelrpc.errors import ProtocolError
from kernelrpc.tracker import messages

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
                           lambda c: st.lists(c, max_size=5) | st.dictionaries(st.text(), c, max_size=4),
                           max_leaves=12)


@given(st.one_of(json_values, st.lists(json_values, max_size=5).map(lambda xs: [0, *xs]),
                 st.tuples(st.integers(-2, 9), st.lists(json_values, max_size=4)).map(lambda t: [t[0], *t[1]])))
def test_any_json_is_a_command_or_a_protocol_error(msg):
    try:
        messages.parse_message(msg)
    except ProtocolError as exc:
        assert str(exc)


def test_tvm_shapes_parse():
    put = messages.parse_message([3, "k", [9090, "k:0.5"], None])
    assert put == messages.Put("k", 9090, "k:0.5", None)
    assert messages.parse_message([3, "k", ["9090", "k:1"]]).port == "9090"
    assert messages.parse_message([4, "k", "", 1]) == messages.Request("k", "", 1)
    assert messages.parse_message([5, {"key": "server:k", "addr": [None, 9090]}]).info["addr"] == [None, 9090]
    assert messages.parse_message([2, "tracker:x"]) == messages.Stop("tracker:x")


@pytest.mark.parametrize("msg", [[True], [3, "k", [True, "k:1"]], [4, "k", "", True], [4, "k", "", 2 ** 40],
                                 [5, {"addr": [None, 1], "key": 5}], [-1], [3, "k", [1, "m" * 2000]]])
def test_rejected(msg):
    with pytest.raises(ProtocolError):
        messages.parse_message(msg)
