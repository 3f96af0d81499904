"""The simplifier's block rule: ``(g*outer + small) // c == outer // (c/g)`` and
``(g*outer + small) % c == g*(outer % (c/g)) + small`` when ``g`` divides ``c`` and
``0 <= small < g`` (a tile of output channels inside one group of a grouped convolution).
Checked against Python's integers at every point of the loop ranges."""
from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from kernelrpc.compiler.expr import Add, FloorDiv, FloorMod, IntImm, Mul, Sub, Var
from kernelrpc.compiler.lower.arith import simplify

OPS = {Add: lambda a, b: a + b, Sub: lambda a, b: a - b, Mul: lambda a, b: a * b,
       FloorDiv: lambda a, b: a // b, FloorMod: lambda a, b: a % b}


def _value(expr, env):
    """Exact integer value of an index expression (no wrap: the ranges are small)."""
    if isinstance(expr, IntImm):
        return expr.value
    if isinstance(expr, Var):
        return env[expr]
    return OPS[type(expr)](_value(expr.a, env), _value(expr.b, env))


@settings(max_examples=300, deadline=None)
@given(tile=st.sampled_from([2, 3, 4, 8, 16]), group=st.integers(1, 24),
       outer_extent=st.integers(1, 12), inner_extent=st.integers(1, 17),
       offset=st.integers(-40, 40), scale=st.sampled_from([1, 2, 3]))
def test_block_rule_matches_integer_arithmetic(tile, group, outer_extent, inner_extent, offset,
                                                scale):
    c = tile * group * scale
    fo, fi = Var("fo", "int32"), Var("fi", "int32")
    ranges = {fo: (0, outer_extent - 1), fi: (0, inner_extent - 1)}
    dividend = fo * (tile * scale) + fi + offset
    for op, py in ((FloorDiv, lambda a: a // c), (FloorMod, lambda a: a % c)):
        simplified = simplify(op(dividend, IntImm(c, "int32")), ranges)
        for a, b in itertools.product(range(outer_extent), range(inner_extent)):
            expect = py(a * tile * scale + b + offset)
            assert _value(simplified, {fo: a, fi: b}) == expect, (op.__name__, simplified, a, b)


def test_a_tile_inside_a_group_loses_its_inner_index():
    fo, fi = Var("fo", "int32"), Var("fi", "int32")
    out = simplify(FloorDiv(fo * 8 + fi, IntImm(136, "int32")), {fo: (0, 67), fi: (0, 7)})
    assert "fi" not in str(out) and "17" in str(out)
