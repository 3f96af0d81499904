"""Expressions of the loop IR -> LLVM IR instructions (scalar and explicit vector).

Float arithmetic carries the ``contract`` flag so that LLVM fuses a multiply
feeding an add into one FMA. Integer arithmetic wraps (no ``nsw``: an int8 sum that
overflows must give numpy's answer, not poison), except inside the index of a load or a
store (``MemoryCodegen.index``): an index that wrapped would be out of bounds, so its signed
adds and multiplies are ``nsw`` and LLVM folds their sign extension into the addressing
(without it a convolution's unrolled register tile spent three integer instructions on the
address of each weight it broadcast). Integer constants are folded here, reduced to their
dtype, so that unrolled loops give SROA constant offsets into local accumulators.
"""
from __future__ import annotations

from contextlib import contextmanager

from .. import expr as E
from .. import ir
from ..expr import dtype_element, dtype_lanes, is_float, parse_dtype, with_lanes
from .emitter import CodegenError, FunctionBuilder, ModuleBuilder, Value, join_div
from .llvm_types import float_literal, int_literal, is_signed, llvm_type, scalar_type
from .memory_codegen import MemoryCodegen
from .vector_math import VectorMath, approximates, constant_exponent

#: intrinsic -> LLVM intrinsic (vector forms are legalized by LLVM, to libm calls if need be);
#: float32 exp, log, tanh and erf are polynomials instead (``vector_math``)
_MATH = {"exp": "exp", "exp2": "exp2", "exp10": "exp10", "log": "log", "log2": "log2",
         "log10": "log10", "sqrt": "sqrt", "tanh": "tanh", "sinh": "sinh", "cosh": "cosh",
         "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos",
         "atan": "atan", "atan2": "atan2", "fabs": "fabs", "floor": "floor", "ceil": "ceil",
         "round": "nearbyint", "nearbyint": "nearbyint", "trunc": "trunc", "pow": "pow",
         "fma": "fma", "copysign": "copysign"}
#: intrinsic -> C math library function (float name, double name): no LLVM intrinsic exists,
#: so vectors call it lane by lane
_LIBM = {"erf": ("erff", "erf"), "log1p": ("log1pf", "log1p"), "hypot": ("hypotf", "hypot"),
         "nextafter": ("nextafterf", "nextafter")}
_INT_CMP = {E.EQ: "eq", E.NE: "ne", E.LT: "slt", E.LE: "sle", E.GT: "sgt", E.GE: "sge"}
_FLOAT_CMP = {E.EQ: "oeq", E.NE: "une", E.LT: "olt", E.LE: "ole", E.GT: "ogt", E.GE: "oge"}
_FLOAT_OPS = {E.Add: "fadd", E.Sub: "fsub", E.Mul: "fmul", E.Div: "fdiv", E.Mod: "frem"}


def _intrinsic_suffix(dtype: str) -> str:
    lanes = dtype_lanes(dtype)
    code, bits, _ = parse_dtype(dtype)
    elem = f"f{bits}" if code == "float" else f"i{bits}"
    return elem if lanes == 1 else f"v{lanes}{elem}"


def _loads_memory(node) -> bool:
    found = []
    ir.post_order_visit(node, lambda n: found.append(n) if isinstance(n, ir.Load) else None)
    return bool(found)


def _extension(dtype: str) -> str:
    """How the C ABIs pass an integer narrower than a register: extended by its signedness."""
    if dtype in ("int8", "int16", "int32"):
        return "signext"
    if dtype in ("uint8", "uint16"):
        return "zeroext"
    return ""


def _c_param(type_: str, dtype: str) -> str:
    extension = _extension(dtype)
    return f"{type_} {extension}" if extension else type_


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _fold_int(op, a: int, b: int):
    if op is E.Add:
        return a + b
    if op is E.Sub:
        return a - b
    if op is E.Mul:
        return a * b
    if op is E.Min:
        return min(a, b)
    if op is E.Max:
        return max(a, b)
    if b == 0:
        return None
    if op is E.FloorDiv:
        return a // b
    if op is E.FloorMod:
        return a % b
    if op is E.Div:
        return _trunc_div(a, b)
    if op is E.Mod:
        return a - b * _trunc_div(a, b)
    return None


class ExprCodegen(MemoryCodegen):
    """Translates expressions inside one function; ``env`` maps Vars and Buffers to Values."""

    def __init__(self, module: ModuleBuilder, fn: FunctionBuilder):
        self.module = module
        self.fn = fn
        self.env: dict = {}
        self.mask: Value | None = None  # lanes a vector load may touch (inside a Select)

    @contextmanager
    def bound(self, key, value: Value):
        """Bind a Var or Buffer for the duration of a scope (restoring any outer binding)."""
        missing = object()
        outer = self.env.get(key, missing)
        self.env[key] = value
        try:
            yield
        finally:
            if outer is missing:
                del self.env[key]
            else:
                self.env[key] = outer

    # ------------------------------------------------------------------ constants

    def const(self, value, dtype: str) -> Value:
        lanes = dtype_lanes(dtype)
        elem = dtype_element(dtype)
        if is_float(elem):
            scalar = float_literal(float(value), elem)
            folded = float(value)
        else:
            folded = E.wrap_int(int(value), elem)
            scalar = int_literal(folded, elem)
        if lanes == 1:
            div = abs(folded) if not is_float(elem) else 1
            return Value(llvm_type(elem), scalar, const=folded, div=div)
        ty = scalar_type(elem)
        return Value(llvm_type(dtype), "<" + ", ".join([f"{ty} {scalar}"] * lanes) + ">")

    # ------------------------------------------------------------------ dispatch

    def __call__(self, node) -> Value:
        method = getattr(self, "visit_" + type(node).__name__, None)
        if method is None:
            raise CodegenError(f"cannot generate code for expression {type(node).__name__}")
        return method(node)

    def visit_IntImm(self, node):
        return self.const(node.value, node.dtype)

    def visit_FloatImm(self, node):
        return self.const(node.value, node.dtype)

    def visit_Var(self, node):
        try:
            return self.env[node]
        except KeyError:
            raise CodegenError(f"variable {node.name} is used outside its scope") from None

    def visit_Let(self, node):
        with self.bound(node.var, self(node.value)):
            return self(node.body)

    # ------------------------------------------------------------------ arithmetic

    def _binary(self, node):
        op = type(node)
        dtype = node.a.dtype
        a, b = self(node.a), self(node.b)
        if is_float(dtype):
            return self._float_binary(op, dtype, a, b)
        return self._int_binary(op, dtype, a, b)

    visit_Add = visit_Sub = visit_Mul = visit_Div = visit_Mod = _binary
    visit_FloorDiv = visit_FloorMod = visit_Min = visit_Max = _binary

    def _float_binary(self, op, dtype, a, b):
        ty = llvm_type(dtype)
        if op in _FLOAT_OPS:
            return self.fn.assign(ty, f"{_FLOAT_OPS[op]} contract {ty} {a.ref}, {b.ref}")
        if op in (E.Min, E.Max):
            pred = "olt" if op is E.Min else "ogt"
            cond = self.fn.assign(self._bool_type(dtype), f"fcmp {pred} {ty} {a.ref}, {b.ref}")
            return self.fn.assign(ty, f"select {cond}, {a}, {b}")
        if op is E.FloorDiv:
            q = self.fn.assign(ty, f"fdiv {ty} {a.ref}, {b.ref}")
            return self._call_intrinsic("floor", dtype, [q])
        if op is E.FloorMod:
            quotient = self.fn.assign(ty, f"fdiv {ty} {a.ref}, {b.ref}")
            q = self._call_intrinsic("floor", dtype, [quotient])
            p = self.fn.assign(ty, f"fmul {ty} {q.ref}, {b.ref}")
            return self.fn.assign(ty, f"fsub {ty} {a.ref}, {p.ref}")
        raise CodegenError(f"float operator {op.__name__} is not supported")

    def _int_binary(self, op, dtype, a, b):
        if a.const is not None and b.const is not None:
            folded = _fold_int(op, a.const, b.const)
            if folded is not None:
                return self.const(folded, dtype)
        if b.const == 0 and op in (E.Div, E.Mod, E.FloorDiv, E.FloorMod):
            raise CodegenError(f"integer division by zero ({op.__name__} of {dtype}): "
                               "undefined on the machine")
        simple = self._simplify(op, dtype, a, b)
        if simple is not None:
            return simple
        ty = llvm_type(dtype)
        signed = is_signed(dtype)
        nsw = " nsw" if self.in_index and signed else ""
        if op is E.Add:
            return self.fn.assign(ty, f"add{nsw} {ty} {a.ref}, {b.ref}", div=join_div(a.div, b.div))
        if op is E.Sub:
            return self.fn.assign(ty, f"sub{nsw} {ty} {a.ref}, {b.ref}", div=join_div(a.div, b.div))
        if op is E.Mul:
            return self.fn.assign(ty, f"mul{nsw} {ty} {a.ref}, {b.ref}", div=a.div * b.div)
        if op in (E.Min, E.Max):
            name = ("s" if signed else "u") + ("min" if op is E.Min else "max")
            return self._call_intrinsic(name, dtype, [a, b])
        if op is E.Div:
            return self.fn.assign(ty, f"{'s' if signed else 'u'}div {ty} {a.ref}, {b.ref}")
        if op is E.Mod:
            return self.fn.assign(ty, f"{'s' if signed else 'u'}rem {ty} {a.ref}, {b.ref}")
        if op in (E.FloorDiv, E.FloorMod):
            return self._floor_divmod(op, dtype, a, b, signed)
        raise CodegenError(f"integer operator {op.__name__} is not supported")

    def _simplify(self, op, dtype, a, b):
        if op is E.Add and a.const == 0:
            return b
        if op in (E.Add, E.Sub) and b.const == 0:
            return a
        if op is E.Mul:
            if a.const == 1:
                return b
            if b.const == 1:
                return a
            if a.const == 0 or b.const == 0:
                return self.const(0, dtype)
        if op in (E.FloorDiv, E.Div) and b.const == 1:
            return a
        return None

    def _floor_divmod(self, op, dtype, a, b, signed):
        ty = llvm_type(dtype)
        if not signed:
            return self.fn.assign(ty, f"{'udiv' if op is E.FloorDiv else 'urem'} {ty} {a.ref}, "
                                      f"{b.ref}")
        c = b.const
        if c is not None and c > 0 and c & (c - 1) == 0:
            shift = c.bit_length() - 1
            if op is E.FloorDiv:
                return self.fn.assign(ty, f"ashr {ty} {a.ref}, {self.const(shift, dtype).ref}")
            return self.fn.assign(ty, f"and {ty} {a.ref}, {self.const(c - 1, dtype).ref}")
        bool_ty = self._bool_type(dtype)
        zero = self.const(0, dtype).ref
        q = self.fn.assign(ty, f"sdiv {ty} {a.ref}, {b.ref}")
        r = self.fn.assign(ty, f"srem {ty} {a.ref}, {b.ref}")
        r_neg = self.fn.assign(bool_ty, f"icmp slt {ty} {r.ref}, {zero}")
        if c is not None and c > 0:
            adjust = r_neg
        else:
            r_nz = self.fn.assign(bool_ty, f"icmp ne {ty} {r.ref}, {zero}")
            b_neg = self.fn.assign(bool_ty, f"icmp slt {ty} {b.ref}, {zero}")
            differ = self.fn.assign(bool_ty, f"xor {r_neg}, {b_neg.ref}")
            adjust = self.fn.assign(bool_ty, f"and {r_nz}, {differ.ref}")
        if op is E.FloorDiv:
            step = self.fn.assign(ty, f"zext {adjust} to {ty}")
            return self.fn.assign(ty, f"sub {ty} {q.ref}, {step.ref}")
        fix = self.fn.assign(ty, f"select {adjust}, {b}, {ty} {zero}")
        return self.fn.assign(ty, f"add {ty} {r.ref}, {fix.ref}")

    @staticmethod
    def _bool_type(dtype: str) -> str:
        lanes = dtype_lanes(dtype)
        return "i1" if lanes == 1 else f"<{lanes} x i1>"

    # ------------------------------------------------------------------ logic

    def _compare(self, node):
        dtype = node.a.dtype
        a, b = self(node.a), self(node.b)
        ty = llvm_type(dtype)
        if is_float(dtype):
            return self.fn.assign(self._bool_type(dtype),
                                  f"fcmp {_FLOAT_CMP[type(node)]} {ty} {a.ref}, {b.ref}")
        pred = _INT_CMP[type(node)]
        if not is_signed(dtype) and pred[0] == "s":
            pred = "u" + pred[1:]
        if a.const is not None and b.const is not None:
            result = {"eq": a.const == b.const, "ne": a.const != b.const}.get(pred)
            if result is None:
                result = {"lt": a.const < b.const, "le": a.const <= b.const,
                          "gt": a.const > b.const, "ge": a.const >= b.const}[pred[1:]]
            return self.const(int(result), "bool")
        return self.fn.assign(self._bool_type(dtype), f"icmp {pred} {ty} {a.ref}, {b.ref}")

    visit_EQ = visit_NE = visit_LT = visit_LE = visit_GT = visit_GE = _compare

    def visit_And(self, node):
        return self._logic("and", node)

    def visit_Or(self, node):
        return self._logic("or", node)

    def _logic(self, opname, node):
        a, b = self(node.a), self(node.b)
        if a.const is not None and b.const is not None:
            value = (a.const and b.const) if opname == "and" else (a.const or b.const)
            return self.const(int(bool(value)), "bool")
        return self.fn.assign(a.type, f"{opname} {a}, {b.ref}")

    def visit_Not(self, node):
        a = self(node.a)
        if a.const is not None:
            return self.const(int(not a.const), "bool")
        ones = self.const(1, node.dtype).ref
        return self.fn.assign(a.type, f"xor {a}, {ones}")

    def visit_Select(self, node):
        """``select`` without touching memory the condition rules out.

        ``if_then_else`` guards loads that would be out of bounds (padding, tails), so a
        branch that loads is never evaluated where it is not selected: with a scalar
        condition it becomes control flow, with a vector condition its vector loads are
        masked (``llvm.masked.load`` / ``llvm.masked.gather``).
        """
        cond = self(node.condition)
        if cond.const is not None:
            return self(node.true_value) if cond.const else self(node.false_value)
        if not (_loads_memory(node.true_value) or _loads_memory(node.false_value)):
            t, f = self(node.true_value), self(node.false_value)
            return self.fn.assign(t.type, f"select {cond}, {t}, {f}", div=join_div(t.div, f.div))
        if cond.type == "i1":
            return self._branchy_select(cond, node)
        ones = self.const(1, node.condition.dtype).ref
        inverse = self.fn.assign(cond.type, f"xor {cond}, {ones}")
        t = self._with_mask(cond, node.true_value)
        f = self._with_mask(inverse, node.false_value)
        return self.fn.assign(t.type, f"select {cond}, {t}, {f}")

    def _with_mask(self, mask: Value, node) -> Value:
        outer = self.mask
        if outer is not None:
            mask = self.fn.assign(mask.type, f"and {mask}, {outer.ref}")
        self.mask = mask
        try:
            return self(node)
        finally:
            self.mask = outer

    def _branchy_select(self, cond: Value, node) -> Value:
        then_l, else_l, join_l = (self.fn.label(h) for h in ("sel.t", "sel.f", "sel.end"))
        self.fn.emit(f"br {cond}, label %{then_l}, label %{else_l}")
        self.fn.start_block(then_l)
        t = self(node.true_value)
        t_end = self.fn.block
        self.fn.branch(join_l)
        self.fn.start_block(else_l)
        f = self(node.false_value)
        f_end = self.fn.block
        self.fn.branch(join_l)
        self.fn.start_block(join_l)
        return self.fn.assign(t.type, f"phi {t.type} [ {t.ref}, %{t_end} ], [ {f.ref}, %{f_end} ]",
                              div=join_div(t.div, f.div))

    # ------------------------------------------------------------------ casts and calls

    def visit_Cast(self, node):
        rounded = node.value
        if isinstance(rounded, E.Call) and rounded.op in ("nearbyint", "round") and \
                dtype_element(node.dtype) == "int32" and \
                dtype_element(rounded.dtype) in ("float32", "float64"):
            return self._rounded_to_int(node.dtype, self(rounded.args[0]), rounded.dtype)
        value = self(node.value)
        src, dst = node.value.dtype, node.dtype
        if value.const is not None:
            if is_float(dst):
                return self.const(float(value.const), dst)
            if parse_dtype(dst)[0] == "bool":
                return self.const(int(value.const != 0), dst)
            if not is_float(src):
                return self.const(int(value.const), dst)
        return self.cast(value, src, dst)

    def _rounded_to_int(self, dtype: str, value: Value, source_dtype: str) -> Value:
        """``int32(nearbyint(x))`` in one step, ``llvm.lrint`` (both round to nearest in the
        current mode, ties to even): x86's ``cvtps2dq`` where ``nearbyint`` then the cast took
        ``vrndscaleps`` and ``cvttps2dq``, RISC-V's ``fcvt.l.s`` where it called ``nearbyintf``
        lane by lane (every int8 layer's output stage rounds so)."""
        ty = llvm_type(dtype)
        name = f"llvm.lrint.{_intrinsic_suffix(dtype)}.{_intrinsic_suffix(source_dtype)}"
        self.module.declare(name, f"declare {ty} @{name}({value.type})")
        return self.fn.assign(ty, f"call {ty} @{name}({value})")

    def cast(self, value: Value, src: str, dst: str) -> Value:
        if src == dst:
            return value
        s_code, s_bits, _ = parse_dtype(src)
        d_code, d_bits, _ = parse_dtype(dst)
        ty = llvm_type(dst)
        if d_code == "bool":
            if s_code == "float":
                zero = self.const(0.0, src).ref
                return self.fn.assign(ty, f"fcmp une {value}, {zero}")
            zero = self.const(0, src).ref
            return self.fn.assign(ty, f"icmp ne {value}, {zero}")
        if s_code == "float" and d_code == "float":
            op = "fpext" if d_bits > s_bits else "fptrunc"
        elif s_code == "float":
            op = "fptosi" if d_code == "int" else "fptoui"
        elif d_code == "float":
            op = "sitofp" if s_code == "int" else "uitofp"
        elif d_bits == s_bits:
            return Value(ty, value.ref, value.const, value.div)
        elif d_bits < s_bits:
            op = "trunc"
        else:
            op = "sext" if s_code == "int" else "zext"
        return self.fn.assign(ty, f"{op} {value} to {ty}", div=value.div if op == "sext" else 1)

    def visit_Call(self, node):
        args = [self(a) for a in node.args]
        op = node.op
        if op == "reinterpret":
            return self.fn.assign(llvm_type(node.dtype),
                                  f"bitcast {args[0]} to {llvm_type(node.dtype)}")
        if op.startswith("llvm."):
            ty = llvm_type(node.dtype)
            self.module.declare(op, f"declare {ty} @{op}({', '.join(a.type for a in args)})")
            return self.fn.assign(ty, f"call {ty} @{op}({', '.join(map(str, args))})")
        if approximates(op, node.dtype):
            return VectorMath(self.module, self.fn, node.dtype).emit(op, args[0])
        if op == "pow" and is_float(node.dtype):
            exponent = constant_exponent(node.args[1])
            if exponent is not None:
                return self._constant_power(node.dtype, args[0], exponent)
        if op in _MATH:
            return self._call_intrinsic(_MATH[op], node.dtype, args)
        if op in _LIBM:
            return self._call_libm(_LIBM[op], node.dtype, args)
        ty = llvm_type(node.dtype)
        if op == "fmod":
            return self.fn.assign(ty, f"frem {ty} {args[0].ref}, {args[1].ref}")
        if op == "ldexp":
            full = (f"llvm.ldexp.{_intrinsic_suffix(node.dtype)}."
                    f"{_intrinsic_suffix(node.args[1].dtype)}")
            self.module.declare(full, f"declare {ty} @{full}({ty}, {args[1].type})")
            return self.fn.assign(ty, f"call {ty} @{full}({args[0]}, {args[1]})")
        if op in ("clz", "popcount"):
            name = "ctlz" if op == "clz" else "ctpop"
            full = f"llvm.{name}.{_intrinsic_suffix(node.dtype)}"
            extra = ", i1" if op == "clz" else ""
            self.module.declare(full, f"declare {ty} @{full}({ty}{extra})")
            flag = ", i1 false" if op == "clz" else ""
            return self.fn.assign(ty, f"call {ty} @{full}({args[0]}{flag})")
        if op == "interleave":
            return self.interleave(node.dtype, args)
        if op == "all_lanes":
            lanes = dtype_lanes(node.args[0].dtype)
            full = f"llvm.vector.reduce.and.v{lanes}i1"
            self.module.declare(full, f"declare i1 @{full}(<{lanes} x i1>)")
            return self.fn.assign("i1", f"call i1 @{full}({args[0]})")
        if op in ("isnan", "isinf", "isfinite"):
            x, src = args[0], node.args[0].dtype
            bool_ty = self._bool_type(src)
            if op == "isnan":
                return self.fn.assign(bool_ty, f"fcmp uno {x}, {x.ref}")
            magnitude = self._call_intrinsic("fabs", src, [x])
            inf = self.const(float("inf"), src)
            pred = "oeq" if op == "isinf" else "one"
            return self.fn.assign(bool_ty, f"fcmp {pred} {magnitude}, {inf.ref}")
        raise CodegenError(f"unknown intrinsic {op!r}")

    def visit_BufferPointer(self, node):
        return self.address(node.buffer, self(node.offset))

    def visit_ExternCall(self, node):
        """A C function linked into the module; small integers are extended as C does."""
        args = [self(a) for a in node.args]
        params = ", ".join(_c_param(a.type, arg.dtype) for a, arg in zip(args, node.args))
        ret = "void" if node.dtype == "void" else llvm_type(node.dtype)
        extension = _extension(node.dtype)
        declaration = f"declare {extension}{' ' if extension else ''}{ret} @{node.name}({params})"
        known = self.module.declarations.get(node.name)
        if known is not None and known != declaration:
            raise CodegenError(f"call_extern {node.name} is called with two signatures: "
                               f"{known!r} and {declaration!r}")
        self.module.declare(node.name, declaration)
        call = f"call {ret} @{node.name}({', '.join(map(str, args))})"
        if node.dtype == "void":
            self.fn.emit(call)
            return Value("void", "")
        return self.fn.assign(llvm_type(node.dtype), call)

    def _call_libm(self, names, dtype: str, args):
        """A C math function, lane by lane for vectors; float16 computes in float."""
        elem = dtype_element(dtype)
        lanes = dtype_lanes(dtype)
        calc = "float64" if elem == "float64" else "float32"
        fname = names[1] if calc == "float64" else names[0]
        cty = llvm_type(calc)
        self.module.declare(fname, f"declare {cty} @{fname}({', '.join([cty] * len(args))})")

        def scalar(values):
            values = [self.cast(v, elem, calc) for v in values]
            out = self.fn.assign(cty, f"call {cty} @{fname}({', '.join(map(str, values))})")
            return self.cast(out, calc, elem)
        if lanes == 1:
            return scalar(args)
        ety = llvm_type(elem)
        result = Value(llvm_type(dtype), "poison")
        for k in range(lanes):
            lane = [self.fn.assign(ety, f"extractelement {a}, i32 {k}") for a in args]
            result = self.fn.assign(result.type, f"insertelement {result}, {scalar(lane)}, i32 {k}")
        return result

    def _constant_power(self, dtype: str, x: Value, exponent: float) -> Value:
        """pow(x, c) for the constants of ``vector_math.CONSTANT_EXPONENTS``: float16 and
        float32 compute in the next wider float (where x^4 neither overflows nor underflows)
        and round once; float64 takes (1 / x)^|n| for a negative n."""
        wider = {"float16": "float32", "float32": "float64"}.get(dtype_element(dtype))
        if wider is None:
            return self._power_steps(dtype, x, exponent)
        wide = with_lanes(wider, dtype_lanes(dtype))
        return self.cast(self._power_steps(wide, self.cast(x, dtype, wide), exponent), wide, dtype)

    def _power_steps(self, dtype: str, x: Value, exponent: float) -> Value:
        """x^n by squaring (1 / x first for a negative n); x^+-0.5 by sqrt, with pow's special
        values pow(-0, 0.5) = +0 and pow(-inf, 0.5) = +inf."""
        ty = llvm_type(dtype)
        one = self.const(1.0, dtype)
        if abs(exponent) == 0.5:
            root = self._call_intrinsic("sqrt", dtype, [x])
            root = self.fn.assign(ty, f"fadd {root}, {self.const(0.0, dtype).ref}")
            minus_inf = self.fn.assign(self._bool_type(dtype),
                                       f"fcmp oeq {x}, {self.const(float('-inf'), dtype).ref}")
            root = self.fn.assign(ty, f"select {minus_inf}, {self.const(float('inf'), dtype)}, "
                                      f"{root}")
            return self.fn.assign(ty, f"fdiv {one}, {root.ref}") if exponent < 0 else root
        base = self.fn.assign(ty, f"fdiv {one}, {x.ref}") if exponent < 0 else x
        power, n = one, int(abs(exponent))
        while n:
            if n & 1:
                power = base if power is one else self.fn.assign(ty, f"fmul {power}, {base.ref}")
            n >>= 1
            if n:
                base = self.fn.assign(ty, f"fmul {base}, {base.ref}")
        return power

    def _call_intrinsic(self, name, dtype, args):
        ty = llvm_type(dtype)
        full = f"llvm.{name}.{_intrinsic_suffix(dtype)}"
        self.module.declare(full, f"declare {ty} @{full}({', '.join([ty] * len(args))})")
        return self.fn.assign(ty, f"call {ty} @{full}({', '.join(map(str, args))})")

    # ------------------------------------------------------------------ vectors

    def splat(self, value: Value, lanes: int) -> Value:
        vty = f"<{lanes} x {value.type}>"
        if value.const is not None:
            return Value(vty, "<" + ", ".join([f"{value.type} {value.ref}"] * lanes) + ">")
        one = self.fn.assign(vty, f"insertelement {vty} poison, {value}, i32 0")
        return self.fn.assign(vty, f"shufflevector {one}, {vty} poison, "
                                   f"<{lanes} x i32> zeroinitializer")

    def interleave(self, dtype: str, parts: list) -> Value:
        """Lane ``k*l + j`` of the result is lane ``l`` of ``parts[j]`` (``k`` parts of ``L``
        lanes each): the parts concatenated pairwise, then one shuffle."""
        ways, lanes = len(parts), dtype_lanes(dtype) // len(parts)
        element = llvm_type(dtype_element(dtype))
        whole, width = self.concatenated(parts, element)
        order = ", ".join(f"i32 {j * lanes + lane}" for lane in range(lanes)
                          for j in range(ways))
        return self.fn.assign(llvm_type(dtype), f"shufflevector {whole}, <{width} x {element}> "
                                                f"poison, <{ways * lanes} x i32> <{order}>")

    def visit_Broadcast(self, node):
        return self.splat(self(node.value), node.lanes)

    def visit_Ramp(self, node):
        base, stride = self(node.base), self(node.stride)
        elem = node.base.dtype
        ty = scalar_type(elem)
        vty = llvm_type(node.dtype)
        if stride.const is not None:
            steps = Value(vty, "<" + ", ".join(
                f"{ty} {int_literal(k * stride.const, elem)}" for k in range(node.lanes)) + ">")
        else:
            iota = Value(vty, "<" + ", ".join(f"{ty} {k}" for k in range(node.lanes)) + ">")
            splat = self.splat(stride, node.lanes)
            steps = self.fn.assign(vty, f"mul {vty} {iota.ref}, {splat.ref}")
        return self.fn.assign(vty, f"add {vty} {self.splat(base, node.lanes).ref}, {steps.ref}")
