"""Pass infrastructure: named function passes run under a PassContext (as in TVM)."""
from __future__ import annotations

import sys

#: config key -> (type, default)
CONFIG_OPTIONS = {
    "print_ir_after_each": (bool, False),
    "disable_vectorize": (bool, False),
    "unroll_max_extent": (int, 128),
    "tir.instrument_bound_checkers": (bool, False),
}


class PassConfigError(ValueError):
    """An unknown PassContext option or a value of the wrong type."""


class PassContext:
    """``with PassContext(opt_level=3, config={"print_ir_after_each": True}): lower(...)``.

    ``opt_level`` skips passes whose level is higher; ``disabled_pass`` skips passes by name.
    """

    _stack: list = []

    def __init__(self, opt_level: int = 2, config: dict | None = None,
                 disabled_pass=None, out=None):
        if not isinstance(opt_level, int) or not 0 <= opt_level <= 3:
            raise PassConfigError(f"opt_level must be 0..3, got {opt_level!r}")
        self.opt_level = opt_level
        self.config = {}
        for key, value in (config or {}).items():
            if key not in CONFIG_OPTIONS:
                raise PassConfigError(f"unknown PassContext option {key!r}; "
                                      f"known: {sorted(CONFIG_OPTIONS)}")
            kind = CONFIG_OPTIONS[key][0]
            if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                raise PassConfigError(f"option {key} must be {kind.__name__}")
            self.config[key] = value
        self.disabled_pass = set(disabled_pass or ())
        self.out = out

    def get(self, key: str):
        return self.config.get(key, CONFIG_OPTIONS[key][1])

    def __enter__(self) -> "PassContext":
        PassContext._stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        PassContext._stack.pop()

    @staticmethod
    def current() -> "PassContext":
        return PassContext._stack[-1] if PassContext._stack else PassContext()


class Pass:
    """A named ``PrimFunc -> PrimFunc`` transformation; ``enabled_by`` names a boolean config
    option without which the pass does not run."""

    def __init__(self, name: str, fn, opt_level: int = 0, enabled_by: str | None = None):
        self.name, self.fn, self.opt_level = name, fn, opt_level
        self.enabled_by = enabled_by

    def __call__(self, func, ctx: PassContext | None = None):
        ctx = ctx or PassContext.current()
        return self.fn(func, ctx)

    def __repr__(self):
        return f"Pass({self.name}, opt_level={self.opt_level})"


def run_passes(func, passes, ctx: PassContext):
    for p in passes:
        if p.opt_level > ctx.opt_level or p.name in ctx.disabled_pass:
            continue
        if p.enabled_by is not None and not ctx.get(p.enabled_by):
            continue
        func = p(func, ctx)
        if ctx.get("print_ir_after_each"):
            out = ctx.out or sys.stdout
            print(f"# After {p.name}:\n{func}\n", file=out)
    return func
