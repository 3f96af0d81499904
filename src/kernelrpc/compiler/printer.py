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
        if isinstance(e, (FloorDiv, FloorMod, Min, Max)):
            return f"{e.symbol}({self.expr(e.a)}, {self.expr(e.b)})"
        if isinstance(e, BinaryOp):
            sep = e.symbol if e.symbol in "*/" else f" {e.symbol} "
            return f"({self.expr(e.a)}{sep}{self.expr(e.b)})"
        if isinstance(e, Not):
            return f"!{self.expr(e.a)}"
        if isinstance(e, Select):
            return (f"select({self.expr(e.condition)}, {self.expr(e.true_value)}, "
                    f"{self.expr(e.false_value)})")
        if isinstance(e, Cast):
            return f"{e.dtype}({self.expr(e.value)})"
        if isinstance(e, Call):
            return f"{e.op}({', '.join(self.expr(a) for a in e.args)})"
        if isinstance(e, Let):
            return f"(let {self.var(e.var)} = {self.expr(e.value)} in {self.expr(e.body)})"
        if isinstance(e, Ramp):
            return f"ramp({self.expr(e.base)}, {self.expr(e.stride)}, {e.lanes})"
        if isinstance(e, Broadcast):
            return f"broadcast({self.expr(e.value)}, {e.lanes})"
        if isinstance(e, Load):
            return f"{e.buffer.name}[{self.expr(e.index)}]"
        if isinstance(e, BufferPointer):
            return f"&{e.buffer.name}[{self.expr(e.offset)}]"
        if isinstance(e, ExternCall):
            return (f"call_extern({e.dtype}, {e.name!r}"
                    + "".join(f", {self.expr(a)}" for a in e.args) + ")")
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
