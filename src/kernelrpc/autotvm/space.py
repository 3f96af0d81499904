"""Search spaces of schedule templates, as in AutoTVM: ``cfg.define_split``, ``cfg.define_knob``,
``cfg.define_annotate`` and ``cfg[name]`` for the chosen value.

A template runs once against a :class:`ConfigSpace` (which records every knob and hands out each
knob's first choice) and then once per candidate against a :class:`ConfigEntity` (one choice per
knob). A configuration travels and is logged as ``{name: value}``, where a split's value is its
list of factors (``[-1, 8, 4]``: outermost extent inferred), a knob's is the chosen candidate and an
annotation's is one word per axis.
"""
from __future__ import annotations

import itertools
import json
import math


def _extent(axis_or_extent) -> int:
    if isinstance(axis_or_extent, int):
        return axis_or_extent
    extent = getattr(axis_or_extent, "extent", None)
    value = getattr(extent, "value", extent)
    if not isinstance(value, int):
        raise ValueError(f"define_split needs an axis of constant extent or an int, got {axis_or_extent!r}")
    return value


class SplitEntity:
    """Factors of one split, outermost first; ``-1`` stands for whatever extent is left."""

    kind = "split"

    def __init__(self, size):
        self.size = [int(x) for x in size]

    def apply(self, sch, op, axis) -> list:
        """Split ``axis`` of stage ``op`` (a tensor or operation) into ``len(size)`` axes, outer first."""
        stage = sch[op]
        inner_axes = []
        for factor in reversed(self.size[1:]):
            axis, inner = stage.split(axis, factor=factor)
            inner_axes.append(inner)
        return [axis, *reversed(inner_axes)]

    @property
    def value(self) -> list:
        return list(self.size)

    def __repr__(self) -> str:
        return f"split{self.size}"


class OtherOptionEntity:
    """One candidate of a ``define_knob``; the value is ``.val``."""

    kind = "knob"

    def __init__(self, val):
        self.val = val

    @property
    def value(self):
        return self.val

    def __repr__(self) -> str:
        return repr(self.val)


class AnnotateEntity:
    """One word per axis: ``none``, ``unroll``, ``vec`` or ``parallel``."""

    kind = "annotate"
    _PRIMITIVES = {"unroll": "unroll", "vec": "vectorize", "parallel": "parallel"}

    def __init__(self, anns):
        self.anns = list(anns)

    def apply(self, sch, op, axes) -> None:
        if len(axes) != len(self.anns):
            raise ValueError(f"annotation for {len(self.anns)} axes applied to {len(axes)}")
        stage = sch[op]
        for axis, ann in zip(axes, self.anns):
            if ann != "none":
                getattr(stage, self._PRIMITIVES[ann])(axis)

    @property
    def value(self) -> list:
        return list(self.anns)

    def __repr__(self) -> str:
        return f"ann{self.anns}"


class KnobSpace:
    """All choices of one knob, in a fixed order (a config is an index into each)."""

    def __init__(self, name: str, entities: list) -> None:
        if not entities:
            raise ValueError(f"knob {name!r} has no choices")
        self.name = name
        self.entities = entities
        self.kind = entities[0].kind

    def __len__(self) -> int:
        return len(self.entities)

    def index_of(self, value) -> int:
        """The choice whose value is ``value`` (compared as JSON: a logged tuple reads back as a list)."""
        wanted = json.dumps(value)
        for i, entity in enumerate(self.entities):
            if json.dumps(entity.value) == wanted:
                return i
        raise ValueError(f"{value!r} is not a choice of knob {self.name!r}")

    def __repr__(self) -> str:
        return f"{self.name}: {self.kind} with {len(self)} choices"


def split_choices(extent: int, num_outputs: int, policy: str, max_factor: int | None) -> list[list[int]]:
    """Inner factors for a split into ``num_outputs`` axes (TVM's ``factors`` and ``power2`` policies)."""
    limit = min(extent, max_factor or extent)
    if policy == "factors":
        base = [f for f in range(1, limit + 1) if extent % f == 0]
    elif policy == "power2":
        base = [1 << i for i in range(int(math.log2(limit)) + 1)] if limit >= 1 else [1]
    elif policy == "candidate":
        raise ValueError("policy 'candidate' needs candidate=")
    else:
        raise ValueError(f"unknown split policy {policy!r}; use 'factors', 'power2' or 'candidate'")
    out = []
    for combo in itertools.product(base, repeat=num_outputs - 1):
        product = math.prod(combo)
        if product <= extent and (policy != "factors" or extent % product == 0):
            out.append([-1, *combo])
    return out


class _Definer:
    """What ``define_*`` does: add the knob to a space (or, for an entity, check it exists)."""

    def define_split(self, name: str, axis, num_outputs: int = 2, policy: str = "factors",
                     max_factor: int | None = None, candidate=None, filter=None) -> None:
        if candidate is not None:
            choices = [[int(x) for x in c] for c in candidate]
        else:
            choices = split_choices(_extent(axis), num_outputs, policy, max_factor)
        if filter is not None:
            choices = [c for c in choices if filter(SplitEntity(c))]
        self._define(KnobSpace(name, [SplitEntity(c) for c in choices]))

    def define_knob(self, name: str, candidate) -> None:
        self._define(KnobSpace(name, [OtherOptionEntity(c) for c in candidate]))

    def define_annotate(self, name: str, axes, policy: str) -> None:
        """``try_unroll``: each axis unrolled or not; ``try_vec``: the last vectorized or not;
        ``try_unroll_vec``: both."""
        n = len(axes)
        unroll = [list(c) for c in itertools.product(("none", "unroll"), repeat=n)]
        if policy == "try_unroll":
            choices = unroll
        elif policy == "try_vec":
            choices = [["none"] * n, ["none"] * (n - 1) + ["vec"]]
        elif policy == "try_unroll_vec":
            choices = unroll + [c[:-1] + ["vec"] for c in unroll if c[-1] == "none"]
        else:
            raise ValueError(f"unknown annotate policy {policy!r}")
        self._define(KnobSpace(name, [AnnotateEntity(c) for c in choices]))


class ConfigSpace(_Definer):
    """The knobs a template defines; ``cfg[name]`` gives each knob's first choice while defining."""

    def __init__(self) -> None:
        self.space_map: dict[str, KnobSpace] = {}

    def _define(self, knob: KnobSpace) -> None:
        if knob.name in self.space_map:
            raise ValueError(f"knob {knob.name!r} is defined twice")
        self.space_map[knob.name] = knob

    def __getitem__(self, name: str):
        return self.space_map[name].entities[0]

    def __contains__(self, name: str) -> bool:
        return name in self.space_map

    def __len__(self) -> int:
        return math.prod(len(k) for k in self.space_map.values())

    @property
    def dims(self) -> list[int]:
        return [len(k) for k in self.space_map.values()]

    def get(self, index: int) -> "ConfigEntity":
        """The configuration with this index (mixed radix over the knobs, first knob fastest)."""
        if not 0 <= index < len(self):
            raise IndexError(f"config index {index} is outside the space of {len(self)}")
        return ConfigEntity.from_indices(self, self.indices_of(index))

    def indices_of(self, index: int) -> list[int]:
        out = []
        for dim in self.dims:
            out.append(index % dim)
            index //= dim
        return out

    def index_of(self, indices) -> int:
        index, scale = 0, 1
        for i, dim in zip(indices, self.dims):
            index += i * scale
            scale *= dim
        return index

    def from_values(self, values: dict) -> "ConfigEntity":
        """The configuration a log records as ``{name: value}`` (checked against this space)."""
        if set(values) != set(self.space_map):
            raise ValueError(f"logged knobs {sorted(values)} differ from the template's "
                             f"{sorted(self.space_map)}")
        return ConfigEntity.from_indices(self, [k.index_of(values[n]) for n, k in self.space_map.items()])

    def __repr__(self) -> str:
        lines = [f"ConfigSpace ({len(self)} configurations)"]
        lines += [f"  {i}: {knob!r}" for i, knob in enumerate(self.space_map.values())]
        return "\n".join(lines)


class ConfigEntity(_Definer):
    """One point of a space: what a template sees when it is instantiated for a candidate."""

    def __init__(self, index: int, entity_map: dict) -> None:
        self.index = index
        self._entity_map = entity_map

    @classmethod
    def from_indices(cls, space: ConfigSpace, indices) -> "ConfigEntity":
        entities = {name: knob.entities[i] for (name, knob), i in zip(space.space_map.items(), indices)}
        return cls(space.index_of(indices), entities)

    def _define(self, knob: KnobSpace) -> None:
        if knob.name not in self._entity_map:
            raise ValueError(f"this configuration has no knob {knob.name!r} (was the template changed?)")

    def __getitem__(self, name: str):
        try:
            return self._entity_map[name]
        except KeyError:
            raise KeyError(f"no knob {name!r} in this configuration") from None

    def __contains__(self, name: str) -> bool:
        return name in self._entity_map

    def to_dict(self) -> dict:
        return {name: entity.value for name, entity in self._entity_map.items()}

    def __repr__(self) -> str:
        body = ", ".join(f"{name}={entity!r}" for name, entity in self._entity_map.items())
        return f"[{body}],{self.index}"
