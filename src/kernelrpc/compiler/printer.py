"""Text form of the IR, in the style of TVM's ``lower(..., simple_mode=True)``.

Distinct variables that share a name print as ``y``, ``y_1``, ... so the text is
unambiguous.
"""
from __future__ import annotations

from .expr import (BinaryOp, Call, Cast, FloatImm, FloorDiv, FloorMod, IntImm, Let, Max, Min, Not,
                   PrimExpr, Select, Var, dtype_element, dtype_lanes, is_bool)
from .ir import (Allocate, AssertStmt, Broadcast, Buffer, BufferPointer, Evaluate, ExternCall,
                 For, IfThenElse, LetStmt, Load, Prefetch, PrimFunc, Ramp, SeqStmt, Store)

_SUFFIX = {"float32": "f32", "float64": "f64", "float16": "f16", "int64": "i64", "int8": "i8",
           "int16": "i16", "uint8": "u8"}


def _fmt_float(v: float) -> str:
    if v != v or v in (float("inf"), float("-inf")):
        return repr(v)
    if v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return repr(v)


def _suffix(dtype: str) -> str:
    elem = dtype_element(dtype)
    lanes = dtype_lanes(dtype)
    return _SUFFIX.get(elem, elem) + (f"x{lanes}" if lanes > 1 else "")


def _paren(text: str) -> str:
    return text if text.startswith("(") and text.endswith(")") else f"({text})"


class Printer:
    def __init__(self):
        self.names: dict = {}
        self.taken: set = set()

    def var(self, v: Var) -> str:
        name = self.names.get(id(v))
        if name is None:
            name, k = v.name, 1
            while name in self.taken:
                name = f"{v.name}_{k}"
                k += 1
            self.names[id(v)] = name
            self.taken.add(name)
        return name

    def shape(self, shape) -> str:
        return "[" + ", ".join(self.expr(d) if isinstance(d, PrimExpr) else str(d)
                               for d in shape) + "]"

    def expr(self, e) -> str:
        if isinstance(e, Var):
            return self.var(e)
        if isinstance(e, IntImm):
            if is_bool(e.dtype):
                return "True" if e.value else "False"
            return str(e.value) if e.dtype == "int32" else f"{e.value}{_suffix(e.dtype)}"
        if isinstance(e, FloatImm):
            return f"{_fmt_float(e.value)}{_suffix(e.dtype)}"
        for cls in type(e).__mro__:
            form = _EXPR_FORMS.get(cls)
            if form is not None:
                return form(self, e)
        to_str = getattr(e, "to_str", None)     # tensor-language nodes
        if to_str is not None:
            return to_str(self)
        return f"<{type(e).__name__}>"

    def _lines(self, s, ind: str, out: list) -> None:
        if s is None:
            return
        if isinstance(s, SeqStmt):
            for x in s.seq:
                self._lines(x, ind, out)
        elif isinstance(s, Store):
            out.append(f"{ind}{s.buffer.name}[{self.expr(s.index)}] = {self.expr(s.value)}")
        elif isinstance(s, For):
            kind = "" if s.kind == "serial" else f' "{s.kind}"'
            rng = f"{self.expr(s.min)}, {self.expr(s.extent)}"
            out.append(f"{ind}for ({self.var(s.var)}: {s.var.dtype}, {rng}){kind} {{")
            self._lines(s.body, ind + "  ", out)
            out.append(f"{ind}}}")
        elif isinstance(s, Allocate):
            b = s.buffer
            out.append(f"{ind}allocate({b.name}: Pointer({b.scope} {b.dtype}), {b.dtype}, "
                       f"{self.shape(b.shape)}), storage_scope = {b.scope};")
            self._lines(s.body, ind, out)
        elif isinstance(s, IfThenElse):
            out.append(f"{ind}if {_paren(self.expr(s.condition))} {{")
            self._lines(s.then_case, ind + "  ", out)
            if s.else_case is not None:
                out.append(f"{ind}}} else {{")
                self._lines(s.else_case, ind + "  ", out)
            out.append(f"{ind}}}")
        elif isinstance(s, LetStmt):
            out.append(f"{ind}let {self.var(s.var)}: {s.var.dtype} = {self.expr(s.value)}")
            self._lines(s.body, ind, out)
        elif isinstance(s, Evaluate):
            out.append(f"{ind}{self.expr(s.value)}")
        elif isinstance(s, Prefetch):
            out.append(f"{ind}prefetch({s.buffer.name}[{self.expr(s.index)}])")
        elif isinstance(s, AssertStmt):
            out.append(f"{ind}assert({self.expr(s.condition)}, {s.message!r})")
            self._lines(s.body, ind, out)
        else:
            out.append(f"{ind}<{type(s).__name__}>")

    def stmt(self, s, indent: str = "") -> str:
        out: list = []
        self._lines(s, indent, out)
        return "\n".join(out)

    def func(self, f: PrimFunc) -> str:
        params = ", ".join(f"{p.name}: handle" if isinstance(p, Buffer)
                           else f"{self.var(p)}: {p.dtype}" for p in f.params)
        attrs = ", ".join(f'"{k}": ' + (f'"{v}"' if isinstance(v, str) else repr(v))
                          for k, v in f.attrs.items())
        buffers = ",\n             ".join(
            f"{p.name}: Buffer({p.name}: Pointer({p.dtype}), {p.dtype}, {self.shape(p.shape)}, [])"
            for p in f.params if isinstance(p, Buffer))
        lines = [f"@{f.name} = primfn({params}) -> ()",
                 f"  attr = {{{attrs}}}",
                 f"  buffers = {{{buffers}}} {{"]
        self._lines(f.body, "  ", lines)
        lines.append("}")
        return "\n".join(lines)


def _binary(p: "Printer", e) -> str:
    sep = e.symbol if e.symbol in "*/" else f" {e.symbol} "
    return f"({p.expr(e.a)}{sep}{p.expr(e.b)})"


def _call_form(p: "Printer", e) -> str:
    return f"{e.op}({', '.join(p.expr(a) for a in e.args)})"


def _extern_form(p: "Printer", e) -> str:
    return f"call_extern({e.dtype}, {e.name!r}" + "".join(f", {p.expr(a)}" for a in e.args) + ")"


#: the text of each expression class (the nearest class in an expression's MRO applies)
_EXPR_FORMS = {
    **dict.fromkeys((FloorDiv, FloorMod, Min, Max),
                    lambda p, e: f"{e.symbol}({p.expr(e.a)}, {p.expr(e.b)})"),
    BinaryOp: _binary,
    Not: lambda p, e: f"!{p.expr(e.a)}",
    Select: lambda p, e: (f"select({p.expr(e.condition)}, {p.expr(e.true_value)}, "
                          f"{p.expr(e.false_value)})"),
    Cast: lambda p, e: f"{e.dtype}({p.expr(e.value)})",
    Call: _call_form,
    Let: lambda p, e: f"(let {p.var(e.var)} = {p.expr(e.value)} in {p.expr(e.body)})",
    Ramp: lambda p, e: f"ramp({p.expr(e.base)}, {p.expr(e.stride)}, {e.lanes})",
    Broadcast: lambda p, e: f"broadcast({p.expr(e.value)}, {e.lanes})",
    Load: lambda p, e: f"{e.buffer.name}[{p.expr(e.index)}]",
    BufferPointer: lambda p, e: f"&{e.buffer.name}[{p.expr(e.offset)}]",
    ExternCall: _extern_form,
}
