"""Text building blocks for LLVM IR: SSA values, basic blocks, functions, module."""
from __future__ import annotations

from math import gcd


class CodegenError(RuntimeError):
    """The loop IR holds something the LLVM backend cannot translate, or LLVM rejected it."""


class Value:
    """An LLVM operand: ``type`` and its spelling ``ref`` (an SSA name or a literal).

    ``const`` holds the Python value of a scalar constant (else None); ``div`` is
    a known divisor of an integer value (0 for the constant 0), used for alignment.
    """

    __slots__ = ("type", "ref", "const", "div")

    def __init__(self, type_: str, ref: str, const=None, div: int = 1):
        self.type = type_
        self.ref = ref
        self.const = const
        self.div = div

    def __str__(self):
        return f"{self.type} {self.ref}"

    def __repr__(self):
        return f"Value({self.type} {self.ref})"


def join_div(a: int, b: int) -> int:
    """Divisor known for a + b given divisors of a and b."""
    return gcd(a, b)


def alignment(div: int, elem_bytes: int, base_align: int = 64) -> int:
    """Byte alignment of ``base + index * elem_bytes`` when ``index`` is a multiple of ``div``."""
    if div == 0:
        return base_align
    offset = div * elem_bytes
    return min(base_align, offset & -offset)


class FunctionBuilder:
    """One LLVM function being written: entry-block allocas plus a list of blocks."""

    def __init__(self, header: str):
        self.header = header
        self.entry: list[str] = []
        self.lines: list[str] = []
        self.block = "body"
        self._counter = 0

    def tmp(self, hint: str = "t") -> str:
        """A fresh SSA name ``%<hint>.<n>``; parameters never contain a dot, so never clash."""
        return "%" + self.label(hint)

    def label(self, hint: str) -> str:
        self._counter += 1
        return f"{_identifier(hint)}.{self._counter}"

    def emit(self, text: str) -> None:
        self.lines.append("  " + text)

    def assign(self, type_: str, text: str, hint: str = "t", div: int = 1) -> Value:
        name = self.tmp(hint)
        self.emit(f"{name} = {text}")
        return Value(type_, name, div=div)

    def alloca(self, type_: str, count: int = 1, align: int = 64, hint: str = "buf") -> Value:
        """An alloca in the entry block, so that SROA/mem2reg can promote it."""
        name = self.tmp(hint)
        size = f", i64 {count}" if count != 1 else ""
        self.entry.append(f"  {name} = alloca {type_}{size}, align {align}")
        return Value("ptr", name)

    def start_block(self, label: str) -> None:
        self.lines.append(f"{label}:")
        self.block = label

    def branch(self, label: str) -> None:
        self.emit(f"br label %{label}")

    def text(self) -> str:
        return "\n".join([f"{self.header} {{", "entry:", *self.entry, "  br label %body",
                          "body:", *self.lines, "}"])


def _identifier(hint: str) -> str:
    cleaned = "".join(ch if ch.isalnum() or ch in "_." else "_" for ch in hint)
    return cleaned[:40] or "v"


class ModuleBuilder:
    """Declarations and functions of one LLVM module.

    ``size_type`` is the target's ``size_t`` / pointer-sized integer (``i32`` on 32-bit
    targets), for C library calls and pointer-slot alignment; ``masked_loads`` the element
    widths (bits) the target loads under a mask in one instruction (None: every width).
    """

    def __init__(self, size_type: str = "i64", masked_loads: frozenset | None = None):
        self.size_type = size_type
        self.masked_loads = masked_loads
        self.pointer_bytes = int(size_type[1:]) // 8
        self.declarations: dict[str, str] = {}
        self.functions: list[str] = []
        self._names: set[str] = set()

    def declare(self, name: str, text: str) -> None:
        self.declarations.setdefault(name, text)

    def unique(self, name: str) -> str:
        candidate, n = name, 0
        while candidate in self._names:
            n += 1
            candidate = f"{name}.{n}"
        self._names.add(candidate)
        return candidate

    def text(self) -> str:
        return "\n".join([*self.declarations.values(), "", *self.functions, ""])
