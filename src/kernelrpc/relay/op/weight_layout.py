"""The weight layout a convolution's or a dense layer's strategy reads, as one value.

``relay.build`` packs or transforms a layer's constant weight once, at build time, into
the layout its strategy reads; the graph node records it in its ``kernel_layout`` attribute
(a string, so that nodes stay hashable and a workload stays JSON). :class:`WeightLayout` is the
only place that string is written or read.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from ..errors import ModelError
from . import winograd

_PACKED = re.compile(r"OIHW(\d+)o")
_WINOGRAD = re.compile(r"winograd(\d+)_(\d+)o")
_GROUPED = re.compile(r"OIHW(\d+)o_g(\d+)_(\d+)")
#: the ``pointwise`` layout's attribute (``<V>``: its input read in panels of V pixels,
#: ``_padded``: the product over whole panels; ``_r<R>_<O>o``: the weight by blocks of R of
#: its O output channels)
_POINTWISE = re.compile(r"OIHW_pixels(?:(\d+)(_padded)?)?(?:_r(\d+)_(\d+)o)?")
#: the ``panels`` layout's attribute: panels of ``<P>`` of a dense weight's ``<N>`` columns
_PANELS = re.compile(r"KN_panels(\d+)_(\d+)")


@dataclass(frozen=True)
class WeightLayout:
    """``kind``: ``"OIHW"`` (as the model has it), ``"packed"`` (``[O/V][I][KH][KW][V]``:
    ``lanes`` output channels in the vector) or ``"winograd"`` (``U = G g G^T`` of F(``m`` x
    ``m``, 3 x 3), ``[a][a][O/V][I][V]`` with ``a = m + 2``) or ``"grouped"`` (a grouped
    convolution's ``packed``: ``[G * B][I/G][KH][KW][V]``, each of the ``groups`` groups' ``O/G``
    output channels in ``B = ceil(O/G / V)`` vectors, the last padded with zero weights, so
    that no vector holds two groups' channels; ``out_channels`` is ``O``) or ``"pointwise"``
    (a 1x1 convolution's weight read as the ``[O][I]`` matrix of a product over the
    flattened pixels: where ``m`` is 0 the model's OIHW array as it is, else
    ``[O/m][I][m]``, the rows by blocks of ``m`` of the ``out_channels``, the last block
    padded with zero rows, so that a register tile of ``m`` output channels reads its weights
    as one contiguous run; ``lanes``, where not 0, the width of the panels the product reads
    its input from, and ``padded`` whether the product runs over whole panels:
    :func:`..op.nn._conv2d_pixels`); for a dense layer, whose weight the model has as ``[K][N]``
    (the reduction by the ``out_channels`` outputs), ``"panels"``: ``[N/P][K][P]``, panels of
    ``P = lanes`` columns each one contiguous run, the last padded with zero columns.

    The model's shape of the weight (:meth:`model_shape`) is OIHW for a convolution and
    ``[K][N]`` for a dense layer."""

    kind: str = "OIHW"
    lanes: int = 0
    m: int = 0
    groups: int = 1
    out_channels: int = 0
    padded: bool = False

    @classmethod
    def packed(cls, lanes: int) -> "WeightLayout":
        return cls("packed", lanes)

    @classmethod
    def winograd(cls, m: int, lanes: int) -> "WeightLayout":
        return cls("winograd", lanes, m)

    @classmethod
    def grouped(cls, lanes: int, groups: int, out_channels: int) -> "WeightLayout":
        return cls("grouped", lanes, groups=groups, out_channels=out_channels)

    @classmethod
    def pointwise(cls, panel: int = 0, padded: bool = False, rows: int = 0,
                  out_channels: int = 0) -> "WeightLayout":
        return cls("pointwise", panel, rows if rows > 1 else 0,
                   out_channels=out_channels if rows > 1 else 0, padded=padded and panel > 0)

    @classmethod
    def panels(cls, columns: int, out_features: int) -> "WeightLayout":
        return cls("panels", columns, out_channels=out_features)

    @property
    def is_model_array(self) -> bool:
        """Whether the weight's array is the model's own (OIHW, ``pointwise`` without
        blocks of rows)."""
        return self.kind == "OIHW" or self.kind == "pointwise" and not self.m

    @property
    def group_blocks(self) -> int:
        """Vectors of output channels per group (``grouped``)."""
        return -(-self.out_channels // self.groups // self.lanes)

    @classmethod
    def parse(cls, attr: str) -> "WeightLayout":
        if attr == "OIHW":
            return cls()
        found = _POINTWISE.fullmatch(attr)
        if found:
            panel, padded, rows, out_channels = found.groups()
            if (panel is None or 1 < int(panel) <= 64) and \
                    (rows is None or 1 < int(rows) <= 64 and int(out_channels) > 0):
                return cls.pointwise(int(panel or 0), bool(padded), int(rows or 0),
                                     int(out_channels or 0))
        found = _PACKED.fullmatch(attr)
        if found:
            return cls.packed(int(found.group(1)))
        found = _PANELS.fullmatch(attr)
        if found and 1 < int(found.group(1)) <= 64 and int(found.group(2)) > 0:
            return cls.panels(int(found.group(1)), int(found.group(2)))
        found = _WINOGRAD.fullmatch(attr)
        if found:
            return cls.winograd(int(found.group(1)), int(found.group(2)))
        found = _GROUPED.fullmatch(attr)
        if found:
            return cls.grouped(*(int(g) for g in found.groups()))
        raise ModelError(f"unknown kernel_layout {attr!r}")

    @classmethod
    def of(cls, attrs) -> "WeightLayout":
        """The layout of a node's weight (its ``kernel_layout`` attribute, OIHW without one)."""
        return cls.parse(attrs.get("kernel_layout", "OIHW"))

    @property
    def attr(self) -> str:
        """The ``kernel_layout`` attribute's value."""
        if self.kind == "packed":
            return f"OIHW{self.lanes}o"
        if self.kind == "winograd":
            return f"winograd{self.m}_{self.lanes}o"
        if self.kind == "grouped":
            return f"OIHW{self.lanes}o_g{self.groups}_{self.out_channels}"
        if self.kind == "pointwise":
            padded = "_padded" if self.padded else ""
            rows = f"_r{self.m}_{self.out_channels}o" if self.m else ""
            return f"OIHW_pixels{self.lanes or ''}{padded}{rows}"
        if self.kind == "panels":
            return f"KN_panels{self.lanes}_{self.out_channels}"
        return "OIHW"

    def __bool__(self) -> bool:
        """False for the model's own OIHW layout."""
        return self.kind != "OIHW"

    def shape(self, oihw) -> tuple:
        """The weight's shape in this layout, from the model's (OIHW, or a dense layer's
        ``[K][N]``)."""
        if self.is_model_array:
            return tuple(oihw)
        if self.kind == "panels":
            reduction, columns = oihw
            return (-(-columns // self.lanes), reduction, self.lanes)
        out_channels, in_channels, kh, kw = oihw
        if self.kind == "packed":
            return (out_channels // self.lanes, in_channels, kh, kw, self.lanes)
        if self.kind == "winograd":
            a = self.m + 2
            return (a, a, out_channels // self.lanes, in_channels, self.lanes)
        if self.kind == "grouped":
            return (self.groups * self.group_blocks, in_channels, kh, kw, self.lanes)
        return (-(-out_channels // self.m), in_channels, self.m)       # pointwise, by rows

    def model_shape(self, shape) -> list[int]:
        """The model's shape (OIHW, or a dense layer's ``[K][N]``) of a weight of ``shape`` in
        this layout."""
        if self.kind == "panels":
            return [shape[1], self.out_channels]
        if self.kind == "packed":
            blocks, in_channels, kh, kw, lanes = shape
            return [blocks * lanes, in_channels, kh, kw]
        if self.kind == "winograd":
            _, _, blocks, in_channels, lanes = shape
            return [blocks * lanes, in_channels, 3, 3]
        if self.kind == "grouped":
            return [self.out_channels, *shape[1:4]]
        if self.kind == "pointwise" and self.m:
            return [self.out_channels, shape[1], 1, 1]
        return list(shape)

    def transform(self, weight: np.ndarray) -> np.ndarray:
        """A weight array as the model has it (OIHW, a dense layer's ``[K][N]``) in this
        layout."""
        if self.kind == "panels":
            reduction, columns = weight.shape
            padded = np.zeros((reduction, -(-columns // self.lanes) * self.lanes), weight.dtype)
            padded[:, :columns] = weight
            return np.ascontiguousarray(padded.reshape(reduction, -1, self.lanes)
                                        .transpose(1, 0, 2))
        if self.kind == "packed":
            o, i, kh, kw = weight.shape
            blocked = weight.reshape(o // self.lanes, self.lanes, i, kh, kw)
            return np.ascontiguousarray(blocked.transpose(0, 2, 3, 4, 1))
        if self.kind == "winograd":
            return winograd.transform_weight(weight, self.m, self.lanes)
        if self.kind == "grouped":
            o, i, kh, kw = weight.shape
            per_group = weight.reshape(self.groups, o // self.groups, i, kh, kw)
            padded = np.zeros((self.groups, self.group_blocks * self.lanes, i, kh, kw),
                              weight.dtype)
            padded[:, :o // self.groups] = per_group
            return WeightLayout.packed(self.lanes).transform(
                padded.reshape(-1, i, kh, kw))
        if self.kind == "pointwise" and self.m:
            o, i = weight.shape[:2]
            padded = np.zeros((-(-o // self.m) * self.m, i), weight.dtype)
            padded[:o] = weight.reshape(o, i)
            return np.ascontiguousarray(padded.reshape(-1, self.m, i).transpose(0, 2, 1))
        return weight
