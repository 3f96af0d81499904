"""float32 exp, log, tanh, erf as vector polynomials, and pow by small constants: error bounds
in ULP against numpy's float64 over the whole float32 range, and IEEE special values.

Built for the host, for ``-mcpu=haswell`` (AVX2 with FMA) and ``-mcpu=x86-64`` (SSE2: no FMA,
``llvm.fmuladd`` is a multiply and an add), scalar and vectorized, and run here.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd, te

#: the bounds docs/compiler.md states (largest error measured over every 61st float32: exp
#: 1.00, log 0.81, tanh 1.30, erf 1.09 ULP)
BOUNDS = {"exp": 1.5, "log": 1.0, "tanh": 1.5, "erf": 1.5, "sigmoid": 2.5}
FUNCTIONS = {"exp": te.exp, "log": te.log, "tanh": te.tanh, "erf": te.erf,
             "sigmoid": lambda v: 1.0 / (1.0 + te.exp(-v))}
_erf = np.frompyfunc(math.erf, 1, 1)
REFERENCES = {"exp": np.exp, "log": np.log, "tanh": np.tanh,
              "erf": lambda v: _erf(v).astype(np.float64),
              "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v))}
#: below this, relay's sigmoid, 1 / (1 + exp(-x)), is 0 (exp(-x) is inf) where the true
#: value is a float32 below 3e-39
SIGMOID_ZERO = -88.72284
SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e-40, -1e-40,
                    1.1754942e-38, 88.72283, 88.72284, 89.0, 1e30, -87.33654, -87.33655,
                    -103.27893, -103.97208, -104.0, -1e30, 0.625, -0.625, 0.927734375, 4.0,
                    -4.0, 9.0, 3.4028235e38, -3.4028235e38, 1.0, -1.0], np.float32)


def _cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f
                         if line.startswith("flags")), set())
    except OSError:
        return set()


TARGETS = {"host": ("llvm", 16), "sse2": ("llvm -mcpu=x86-64", 4),
           "haswell": ("llvm -mcpu=haswell", 8)}


def _runnable(name: str):
    if name == "haswell" and not {"avx2", "fma"} <= _cpu_flags():
        pytest.skip("this host cannot run AVX2/FMA code")
    return TARGETS[name]


def samples() -> np.ndarray:
    """Every 65521st float32 bit pattern (both signs, subnormals, inf, NaN), a dense grid
    of [-110, 110] where the functions change, the subnormals, and :data:`SPECIAL`."""
    patterns = np.arange(0, 1 << 32, 65521, dtype=np.uint64).astype(np.uint32).view(np.float32)
    dense = np.linspace(-110, 110, 400_003, dtype=np.float32)
    subnormal = np.arange(1, 1 << 23, 4099, dtype=np.uint32).view(np.float32)
    return np.concatenate([patterns, dense, subnormal, -subnormal, SPECIAL])


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in units of the float32 spacing at |ref| (one step below a power of two)."""
    _, e = np.frexp(np.abs(ref))
    return np.abs(got.astype(np.float64) - ref) / np.ldexp(1.0, np.maximum(e - 24, -149))


def build_unary(fn, target: str, lanes: int, dtype: str = "float32", n=None):
    n = te.var("n") if n is None else n
    A = te.placeholder((n,), name="A", dtype=dtype)
    B = te.compute((n,), lambda i: fn(A[i]), name="B")
    s = te.create_schedule(B.op)
    if lanes > 1:
        _, inner = s[B].split(B.op.axis[0], factor=lanes)
        s[B].vectorize(inner)
    return kernelrpc.build(s, [A, B], target=target, name="f")


def run(module, x: np.ndarray) -> np.ndarray:
    dev = kernelrpc.cpu(0)
    out = nd.empty(x.shape, str(x.dtype), dev)
    module(nd.array(x, dev), out)
    return out.numpy()


def check(name: str, x: np.ndarray, got: np.ndarray, ref: np.ndarray, bound: float) -> None:
    """Within ``bound`` ULP where the rounded reference is finite; elsewhere (inf, NaN) and at
    zero results exactly the rounded reference, its sign included."""
    with np.errstate(over="ignore"):
        ref32 = ref.astype(np.float32)
    finite = np.isfinite(ref32) & (ref32 != 0)
    errors = ulp_error(got[finite], ref[finite])
    worst = int(np.argmax(errors))
    assert errors[worst] <= bound, (
        f"{name}({x[finite][worst]!r}) = {got[finite][worst]!r}, numpy {ref[finite][worst]!r}: "
        f"{errors[worst]:.2f} ULP > {bound}")
    rest = ~finite
    same = (got[rest] == ref32[rest]) & (np.signbit(got[rest]) == np.signbit(ref32[rest]))
    same |= np.isnan(got[rest]) & np.isnan(ref32[rest])
    assert same.all(), f"{name}: {x[rest][~same][:8]} -> {got[rest][~same][:8]}, " \
                       f"numpy {ref32[rest][~same][:8]}"


@pytest.fixture(scope="module")
def inputs():
    x = samples()
    with np.errstate(all="ignore"):
        refs = {name: ref(x.astype(np.float64)) for name, ref in REFERENCES.items()}
    return x, refs


@pytest.mark.parametrize("target_name", sorted(TARGETS))
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_error_bound_and_special_values_over_the_float32_range(inputs, target_name, name):
    target, lanes = _runnable(target_name)
    x, refs = inputs
    ref = refs[name]
    if name == "sigmoid":
        # 1 / (1 + exp(-x)) is 0 once exp(-x) overflows, short of the subnormals
        ref = np.where(x < SIGMOID_ZERO, 0.0, ref)
    for width in (1, lanes):
        got = run(build_unary(FUNCTIONS[name], target, width), x)
        check(f"{name} x{width} [{target}]", x, got, ref, BOUNDS[name])


def test_ieee_special_values_named_by_the_standard():
    x = np.array([89.0, -104.0, -103.0, -np.inf, np.inf, 0.0, -0.0, -1.0, 20.0, -20.0, np.nan],
                 np.float32)
    got = {name: run(build_unary(FUNCTIONS[name], "llvm", 16), x) for name in FUNCTIONS}
    assert got["exp"][0] == np.inf and got["exp"][1] == 0.0
    assert got["exp"][2] == np.float32(np.exp(-103.0)) and 0 < got["exp"][2] < 1.2e-38
    assert got["exp"][3] == 0.0 and got["exp"][4] == np.inf
    assert got["log"][5] == -np.inf and got["log"][6] == -np.inf and np.isnan(got["log"][7])
    assert got["log"][4] == np.inf and np.isnan(got["log"][3])
    assert list(got["tanh"][[3, 4, 8, 9]]) == [-1.0, 1.0, 1.0, -1.0]
    assert list(got["erf"][[3, 4, 8, 9]]) == [-1.0, 1.0, 1.0, -1.0]
    for name in ("tanh", "erf"):
        assert np.signbit(got[name][6]) and got[name][6] == 0
    for name in FUNCTIONS:
        assert np.isnan(got[name][10]), name


@pytest.mark.parametrize("target_name", sorted(TARGETS))
def test_exp_of_a_normal_result_is_exp_bit_for_bit(monkeypatch, target_name):
    """tanh's and erf's exp (``exp_normal``: no clamps, one power of two) is the general exp
    wherever 2^round(x / ln 2) is a normal float, NaN included."""
    from kernelrpc.compiler.codegen.vector_math import VectorMath

    target, lanes = _runnable(target_name)
    bits = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([np.linspace(-87.6, 88.3, 200_003, dtype=np.float32),
                        bits[np.abs(bits) <= 87.6], np.float32([np.nan, -0.0])])
    general = run(build_unary(te.exp, target, lanes), x)
    monkeypatch.setattr(VectorMath, "exp", VectorMath.exp_normal)
    normal = run(build_unary(te.exp, target, lanes), x)
    assert np.isnan(normal[-2]) and np.isnan(general[-2])
    assert np.array_equal(normal[:-2].view(np.uint32), general[:-2].view(np.uint32))
    assert np.array_equal(normal[-1:], [1.0])


def test_vector_math_calls_no_library_function():
    """The point of the approximations: no call per lane left in the vectorized code (a
    vectorized loop's scalar tail calls the C library's expf and logf, faster in scalar code)."""
    for name in ("exp", "log", "tanh", "erf"):
        source = build_unary(FUNCTIONS[name], "llvm", 16, n=1024).get_source("asm")
        assert "call" not in source.split("__kernelrpc_fn_f:", 1)[1].split(".Lfunc_end")[0], name


#: pow(x, c) expanded: float32 computes in float64 and rounds once (within 0.5 ULP, and a
#: hair for the double rounding); float64 multiplies in float64, (1 / x)^|c| below 0
EXPONENTS = (2, 3, 4, -1, -2, -3, -4, 0.5, -0.5, 1, 0)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pow_by_small_constant_is_multiplications(inputs, dtype):
    with np.errstate(invalid="ignore"):          # signalling NaNs among the samples
        x = inputs[0].astype(dtype)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -2.0, 1e-20, -1e-20]
                        + ([1e200, -1e-200, 1e-310] if dtype == "float64" else []), dtype)
    x = np.concatenate([x, specials, np.random.default_rng(5).uniform(-100, 100, 100_000)
                        .astype(dtype)])
    for exponent in EXPONENTS:
        module = build_unary(lambda v: te.power(v, exponent), "llvm", 8, dtype)
        assert "pow" not in module.get_source("ll"), exponent
        got = run(module, x)
        with np.errstate(all="ignore"):
            # an array of exponents: C's pow (numpy takes a scalar 0.5 for sqrt, -0 -> -0)
            ref = np.power(x.astype(np.float64), np.full(x.shape, float(exponent)))
        if dtype == "float32":
            check(f"pow(x, {exponent})", x, got, ref, 0.501)
            continue
        finite = np.isfinite(ref) & (np.abs(ref) >= np.finfo(np.float64).tiny)
        relative = np.abs(got[finite] - ref[finite]) / np.abs(ref[finite])
        assert relative.max() <= (2 * abs(exponent) + 2) * 2.0 ** -53, (exponent, relative.max())
        rest = ~finite & (ref == 0) | ~np.isfinite(ref)
        same = ((got[rest] == ref[rest]) & (np.signbit(got[rest]) == np.signbit(ref[rest]))
                | np.isnan(got[rest]) & np.isnan(ref[rest]))
        assert same.all(), (exponent, x[rest][~same], got[rest][~same])


def test_pow_by_other_exponents_keeps_the_library_call():
    module = build_unary(lambda v: te.power(v, 2.5), "llvm", 8)
    assert "pow" in module.get_source("ll")
    x = np.array([0.5, 2.0, 9.0], np.float32)
    np.testing.assert_allclose(run(module, x), np.power(x, 2.5), rtol=1e-6)
