"""float32 exp, log, tanh and erf as polynomials in plain LLVM IR, and pow by a small constant.

LLVM lowers ``llvm.exp.v16f32`` (and ``tanh``, ``log``, ``erff``) to one libm call per lane;
these approximations are ordinary vector arithmetic instead, so they run at the width the
kernel was vectorized for (scalar included) on every target. Multiply-adds are
``llvm.fmuladd``: one FMA where the target has it, a multiply and an add where it does not
(SSE2, VFP), and the error bounds in docs/compiler.md hold for both.

Sources of the constants and range reductions: Cephes' ``expf``, ``logf`` and ``tanhf``
(S. L. Moshier); N. Juffa's faithfully rounded ``erff`` (the scheme of ARM optimized-routines'
``erff``, and of Apple MLX's and PyTorch's Metal erf). Special values keep IEEE semantics:
NaN in gives NaN out, exp overflows to inf and underflows through the subnormals to 0,
log(0) = -inf, log(x < 0) = NaN, tanh and erf saturate to +-1.
"""
from __future__ import annotations

from .. import expr as E
from .. import ir
from ..expr import dtype_element, dtype_lanes, is_float
from .emitter import FunctionBuilder, ModuleBuilder, Value
from .llvm_types import float_literal, llvm_type

#: the functions approximated here, for float32 (float16 and float64 keep LLVM's intrinsics/libm)
APPROXIMATED = ("exp", "log", "tanh", "erf")
#: ... and those approximated in scalar code too: a C library's scalar expf and logf (glibc's,
#: table-driven) are faster than these polynomials, its tanhf and erff are slower
SCALAR_APPROXIMATED = ("tanh", "erf")
#: pow(x, c) for these constant exponents becomes multiplications (and a sqrt for +-0.5)
CONSTANT_EXPONENTS = (-4, -3, -2, -1, -0.5, 0, 0.5, 1, 2, 3, 4)

_LOG2E = 1.44269504088896341
_EXP_LN2_HI, _EXP_LN2_LO = 0.693359375, -2.12194440e-4   # ln 2 = HI + LO; n * HI is exact
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)
#: exp's argument range: below, the result is 0 even when rounded up; above, it is inf
_EXP_MIN, _EXP_MAX = -104.0, 89.0
_ROUND_MAGIC = 12582912.0      # 1.5 * 2**23: adding it rounds |v| < 2**22 to an integer
_ROUND_MAGIC_BITS = 0x4B400000  # its bits: the sum's bits less these are the integer
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
             1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
             3.3333331174e-1)
_SQRT_HALF = 0.707106781186547524
_FLT_MIN = 1.17549435082228750797e-38
_TANH_SMALL = 0.625
#: tanh(10) rounds to 1, and exp(20) is a normal float
_TANH_SATURATED = 10.0
_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
              -3.33332819422e-1)
#: erf below 475/512: x + x P(x^2); from there to 4: 1 - exp(-a + a Q(a)); beyond: 1
_ERF_SMALL, _ERF_SATURATED = 0.927734375, 4.0
_ERF_SMALL_POLY = (-5.96761703e-4, 4.99119423e-3, -2.67681349e-2, 1.12819925e-1,
                   -3.76125336e-1, 1.28379166e-1)
_ERF_LARGE_POLY = (-1.72853470e-5, 3.83197126e-4, -3.88396438e-3, 2.42546219e-2,
                   -1.06777877e-1, -6.34846687e-1, -1.28717512e-1)


def approximates(op: str, dtype: str) -> bool:
    if op not in APPROXIMATED or dtype_element(dtype) != "float32":
        return False
    return dtype_lanes(dtype) > 1 or op in SCALAR_APPROXIMATED


class VectorMath:
    """Emits the approximations for one float32 type (scalar or ``float32xN``) into ``fn``."""

    def __init__(self, module: ModuleBuilder, fn: FunctionBuilder, dtype: str):
        self.module = module
        self.fn = fn
        self.lanes = dtype_lanes(dtype)
        self.ty = llvm_type(dtype)
        self.ity = self._vector("i32")
        self.bty = self._vector("i1")
        self.suffix = "f32" if self.lanes == 1 else f"v{self.lanes}f32"

    def _vector(self, elem: str) -> str:
        return elem if self.lanes == 1 else f"<{self.lanes} x {elem}>"

    def emit(self, op: str, x: Value) -> Value:
        return getattr(self, op)(x)

    # ------------------------------------------------------------------ building blocks

    def f(self, value: float) -> Value:
        literal = float_literal(value, "float32")
        if self.lanes == 1:
            return Value("float", literal)
        return Value(self.ty, "<" + ", ".join([f"float {literal}"] * self.lanes) + ">")

    def i(self, value: int) -> Value:
        if self.lanes == 1:
            return Value("i32", str(value))
        return Value(self.ity, "<" + ", ".join([f"i32 {value}"] * self.lanes) + ">")

    def op(self, name: str, a: Value, b: Value) -> Value:
        return self.fn.assign(a.type, f"{name} {a}, {b.ref}", hint="vm")

    def cmp(self, pred: str, a: Value, b: Value) -> Value:
        kind = "icmp" if a.type == self.ity else "fcmp"
        return self.fn.assign(self.bty, f"{kind} {pred} {a}, {b.ref}", hint="vm")

    def select(self, cond: Value, a: Value, b: Value) -> Value:
        return self.fn.assign(a.type, f"select {cond}, {a}, {b}", hint="vm")

    def cast(self, name: str, value: Value, to: str) -> Value:
        return self.fn.assign(to, f"{name} {value} to {to}", hint="vm")

    def call(self, name: str, *args: Value) -> Value:
        full = f"llvm.{name}.{self.suffix}"
        params = ", ".join([self.ty] * len(args))
        self.module.declare(full, f"declare {self.ty} @{full}({params})")
        return self.fn.assign(self.ty, f"call {self.ty} @{full}({', '.join(map(str, args))})",
                              hint="vm")

    def fma(self, a: Value, b: Value, c: Value) -> Value:
        return self.call("fmuladd", a, b, c)

    def horner(self, x: Value, coefficients) -> Value:
        """``c0 * x^(n-1) + ... + c(n-1)``: coefficients from the highest degree down."""
        acc = self.f(coefficients[0])
        for c in coefficients[1:]:
            acc = self.fma(acc, x, self.f(c))
        return acc

    def estrin(self, x: Value, coefficients) -> Value:
        """The same polynomial as :meth:`horner` with a shorter dependency chain: pairs of
        terms first, then pairs of pairs in x^2, x^4, ... (the chain limits a scalar loop)."""
        terms = [self.f(c) for c in reversed(coefficients)]
        power = x
        while len(terms) > 1:
            paired = [self.fma(terms[k + 1], power, terms[k]) for k in range(0, len(terms) - 1, 2)]
            terms = paired + terms[len(terms) - len(terms) % 2:]
            if len(terms) > 1:
                power = self.op("fmul", power, power)
        return terms[0]

    # ------------------------------------------------------------------ functions

    def exp(self, x: Value) -> Value:
        """Cephes expf: n = round(x / ln 2), exp(r) on |r| <= ln2/2, times 2^n in two halves
        (each a normal float) so that results round once into the subnormals or to inf.
        The clamps let NaN through, and every later step keeps it."""
        clamped = self.select(self.cmp("ogt", x, self.f(_EXP_MAX)), self.f(_EXP_MAX), x)
        clamped = self.select(self.cmp("olt", clamped, self.f(_EXP_MIN)), self.f(_EXP_MIN),
                              clamped)
        y, shifted = self._exp_reduced(clamped, _ROUND_MAGIC)
        n = self.op("sub", shifted, self.i(_ROUND_MAGIC_BITS))
        half = self.op("ashr", n, self.i(1))
        for part in (half, self.op("sub", n, half)):
            biased = self.op("shl", self.op("add", part, self.i(127)), self.i(23))
            y = self.op("fmul", y, self.cast("bitcast", biased, self.ty))
        return y

    def exp_normal(self, x: Value) -> Value:
        """:meth:`exp` of an x where 2^n is a normal float (-87.6 <= x <= 88.3, or NaN),
        without the clamps or the second power of two: 127 added to the rounding constant
        makes the rounded sum's low bits n + 127, which shifted left by 23 are 2^n."""
        y, shifted = self._exp_reduced(x, _ROUND_MAGIC + 127)
        return self.op("fmul", y, self.cast("bitcast", self.op("shl", shifted, self.i(23)),
                                            self.ty))

    def _exp_reduced(self, x: Value, magic: float) -> tuple[Value, Value]:
        """exp(x - n ln 2) and the bits of ``x / ln 2 + magic``, whose low bits are n (plus
        what ``magic`` adds to the rounding constant)."""
        shifted = self.fma(x, self.f(_LOG2E), self.f(magic))
        nf = self.op("fsub", shifted, self.f(magic))
        r = self.fma(nf, self.f(-_EXP_LN2_HI), x)
        r = self.fma(nf, self.f(-_EXP_LN2_LO), r)
        p = self.estrin(r, _EXP_POLY)
        y = self.fma(p, self.op("fmul", r, r), r)
        return self.op("fadd", y, self.f(1.0)), self.cast("bitcast", shifted, self.ity)

    def log(self, x: Value) -> Value:
        """Cephes logf: x = m * 2^e with m in [sqrt(1/2), sqrt(2)), log(m) by a polynomial in
        m - 1, plus e * ln 2 in two parts. Subnormals are scaled by 2^23 first."""
        subnormal = self.cmp("olt", x, self.f(_FLT_MIN))
        scaled = self.select(subnormal, self.op("fmul", x, self.f(2.0 ** 23)), x)
        bits = self.cast("bitcast", scaled, self.ity)
        exponent = self.op("sub", self.op("lshr", bits, self.i(23)), self.i(126))
        exponent = self.op("sub", exponent, self.select(subnormal, self.i(23), self.i(0)))
        mantissa_bits = self.op("or", self.op("and", bits, self.i(0x007FFFFF)), self.i(0x3F000000))
        m = self.cast("bitcast", mantissa_bits, self.ty)                  # in [0.5, 1)
        low = self.cmp("olt", m, self.f(_SQRT_HALF))
        exponent = self.op("sub", exponent, self.cast("zext", low, self.ity))
        m = self.op("fadd", self.op("fsub", m, self.f(1.0)),
                    self.select(low, m, self.f(0.0)))                      # exact: 2m-1 or m-1
        e = self.cast("sitofp", exponent, self.ty)
        z = self.op("fmul", m, m)
        y = self.op("fmul", self.op("fmul", self.estrin(m, _LOG_POLY), m), z)
        y = self.fma(e, self.f(_EXP_LN2_LO), y)
        y = self.fma(z, self.f(-0.5), y)
        result = self.fma(e, self.f(_EXP_LN2_HI), self.op("fadd", m, y))
        inf = self.f(float("inf"))
        result = self.select(self.cmp("oeq", x, inf), inf, result)
        result = self.select(self.cmp("oeq", x, self.f(0.0)), self.f(float("-inf")), result)
        return self.select(self.cmp("ult", x, self.f(0.0)), self.f(float("nan")), result)

    def tanh(self, x: Value) -> Value:
        """Cephes tanhf: x + x^3 P(x^2) below 0.625, else 1 - 2 / (exp(2|x|) + 1) with x's sign."""
        a = self.call("fabs", x)
        z = self.op("fmul", x, x)
        small = self.fma(self.op("fmul", self.horner(z, _TANH_POLY), z), x, x)
        saturated = self.select(self.cmp("ogt", a, self.f(_TANH_SATURATED)),
                                self.f(_TANH_SATURATED), a)
        e = self.exp_normal(self.op("fadd", saturated, saturated))
        large = self.op("fsub", self.f(1.0),
                        self.op("fdiv", self.f(2.0), self.op("fadd", e, self.f(1.0))))
        result = self.select(self.cmp("olt", a, self.f(_TANH_SMALL)), small, large)
        return self.call("copysign", result, x)          # and tanh(-0) = -0

    def erf(self, x: Value) -> Value:
        """N. Juffa's erff: x + x P(x^2) below 0.9277, else 1 - exp(-a + a Q(a)) with x's
        sign (Q's four high terms by Estrin); |x| >= 4 gives +-1."""
        z = self.op("fmul", x, x)
        small = self.fma(self.horner(z, _ERF_SMALL_POLY), x, x)
        a = self.call("fabs", x)
        a = self.select(self.cmp("ogt", a, self.f(_ERF_SATURATED)), self.f(_ERF_SATURATED), a)
        q = _ERF_LARGE_POLY
        high = self.fma(self.f(q[0]), a, self.f(q[1]))
        mid = self.fma(self.f(q[2]), a, self.f(q[3]))
        r = self.fma(high, self.op("fmul", a, a), mid)
        for c in q[4:]:
            r = self.fma(r, a, self.f(c))
        r = self.fma(r, a, self.op("fsub", self.f(-0.0), a))
        tail = self.exp_normal(r)                  # r in [-18, -1.6]
        large = self.call("copysign", self.op("fsub", self.f(1.0), tail), x)
        return self.select(self.cmp("olt", self.call("fabs", x), self.f(_ERF_SMALL)), small, large)


def constant_exponent(node) -> float | None:
    """The exponent of ``pow`` when it is a constant this module expands (else None)."""
    while isinstance(node, ir.Broadcast) or (isinstance(node, E.Cast) and is_float(node.dtype)):
        node = node.value
    if isinstance(node, (E.FloatImm, E.IntImm)) and node.value in CONSTANT_EXPONENTS:
        return float(node.value)
    return None
