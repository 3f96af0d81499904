"""Templates and tasks: ``@autotvm.template(name)``, ``autotvm.get_config()``, ``task.create``.

A template is a function of the workload's arguments (shapes, dtypes) that asks
``autotvm.get_config()`` for its configuration, defines its knobs on it and returns
``(schedule, args)``. What ``get_config()`` returns depends on the dispatch context: the space
being recorded (``task.create``), the configuration of one candidate (a tuning trial), the best
logged configuration (``apply_history_best``) or, outside any context, the space's first choice
of every knob.
"""
from __future__ import annotations

import threading

from ..compiler.tensor import PlaceholderOp
from .space import ConfigEntity, ConfigSpace

TEMPLATES: dict[str, "Template"] = {}
_context = threading.local()


def _stack() -> list:
    if not hasattr(_context, "stack"):
        _context.stack = []
    return _context.stack


class DispatchContext:
    """Decides the configuration a template gets; a context manager pushing itself on a thread-local stack."""

    def query(self, template: "Template", args: tuple, quiet: bool = False):
        """The configuration for ``template(*args)``, or None for the template's default
        (``quiet``: the caller reports the defaults itself)."""
        raise NotImplementedError

    def __enter__(self):
        _stack().append(self)
        return self

    def __exit__(self, *exc) -> None:
        _stack().remove(self)


def current_context() -> DispatchContext | None:
    """The innermost dispatch context of this thread (``apply_history_best``...), or None."""
    stack = _stack()
    return stack[-1] if stack else None


def get_config():
    """The configuration of the template being instantiated (call it inside a template)."""
    config = getattr(_context, "current", None)
    if config is None:
        raise RuntimeError("autotvm.get_config() is called from inside a template, which is called "
                           "through its @autotvm.template wrapper or a Task")
    return config


class Template:
    """A registered schedule template; calling it instantiates it in the current dispatch context."""

    def __init__(self, name: str, func) -> None:
        self.name = name
        self.func = func
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def instantiate(self, config, args: tuple):
        """``(schedule, args)`` of the template with ``config`` (an entity or a space being recorded)."""
        previous = getattr(_context, "current", None)
        _context.current = config
        try:
            return self.func(*args)
        finally:
            _context.current = previous

    def space(self, args: tuple) -> ConfigSpace:
        space = ConfigSpace()
        self.instantiate(space, args)
        return space

    def __call__(self, *args):
        context = current_context()
        config = context.query(self, args) if context is not None else None
        if config is None:
            config = self.space(args)        # outside any context: every knob's first choice
        return self.instantiate(config, args)

    def __repr__(self) -> str:
        return f"<autotvm template {self.name!r}>"


def template(name: str):
    """Register a schedule template under ``name`` (TVM: ``@autotvm.template("task/name")``)."""
    def register(func) -> Template:
        tmpl = Template(name, func)
        TEMPLATES[name] = tmpl
        return tmpl
    return register


class Task:
    """A template with fixed arguments and target: its space, and how to check a candidate.

    ``reference(*inputs)`` returns the expected outputs (e.g. ``lambda a, b: a @ b``); ``flop``
    (per call) turns times into GFLOP/s. ``scale_atol``: where set, outputs may differ from
    the reference by that fraction of its largest magnitude (on top of the runner's ``rtol``
    and ``atol``), for an algorithm whose rounding grows with the output's scale (Winograd's).
    """

    scale_atol: float | None = None
    #: where set, ``prepare_inputs(inputs)`` gives the inputs a candidate runs on from random
    #: ones of the argument shapes (an argument that must be derived from another)
    prepare_inputs = None

    def __init__(self, tmpl: Template, args: tuple, target=None, reference=None,
                 flop: float | None = None) -> None:
        self.template = tmpl
        self.name = tmpl.name
        self.args = tuple(args)
        self.target = None if target is None else str(target)
        self.reference = reference
        self.flop = flop
        self.config_space = ConfigSpace()
        _, tensors = tmpl.instantiate(self.config_space, self.args)
        self.arg_specs = [(tuple(int(getattr(d, "value", d)) for d in t.shape), t.dtype) for t in tensors]
        self.n_inputs = next((i for i, t in enumerate(tensors) if not isinstance(t.op, PlaceholderOp)),
                             len(tensors))

    @property
    def workload(self) -> tuple:
        return (self.name, *self.args)

    def instantiate(self, config: ConfigEntity):
        return self.template.instantiate(config, self.args)

    def candidate(self, config: ConfigEntity):
        """A function building ``config``'s schedule, for ``kernelrpc.measure`` (pickled by value)."""
        func, args = self.template.func, self.args

        def build():
            return Template("candidate", func).instantiate(config, args)
        build.__name__ = f"{self.name}#{config.index}"
        return build

    def __repr__(self) -> str:
        return f"Task({self.name!r}, args={self.args}, space={len(self.config_space)})"


def create(name_or_template, args, target=None, *, reference=None, flop=None) -> Task:
    """``autotvm.task.create("name", args=(...), target="llvm")``."""
    tmpl = name_or_template
    if isinstance(name_or_template, str):
        try:
            tmpl = TEMPLATES[name_or_template]
        except KeyError:
            raise KeyError(f"no template named {name_or_template!r}; registered: "
                           f"{', '.join(sorted(TEMPLATES)) or 'none'}") from None
    return Task(tmpl, args, target, reference, flop)


#: functions ``(mod, target, params, ops) -> list[Task] | None`` that find the tunable tasks of
#: a program they know (``kernelrpc.relay`` registers its networks'); autotvm imports no front end
PROGRAM_EXTRACTORS: list = []


def extract_from_program(mod, target, params=None, ops=None) -> list[Task]:
    """The tunable tasks of a program (TVM's ``autotvm.task.extract_from_program``): for a
    network of ``kernelrpc.relay``, one task per distinct workload of its convolutions and
    dense layers (docs/models.md, "Tuning a network")."""
    for extract in PROGRAM_EXTRACTORS:
        tasks = extract(mod, target, params, ops)
        if tasks is not None:
            return tasks
    raise TypeError(f"extract_from_program takes a network (the IRModule relay.frontend.from_onnx "
                    f"returned, or its ['main']), got {type(mod).__name__}")
