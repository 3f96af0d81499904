"""Loads and stores: contiguous vectors with proven alignment, gathers, scatters, masks.

A ``Ramp(base, 1, n)`` index is one ``load/store <n x T>`` whose ``align`` comes from
what is known to divide ``base``. A load of ``Ramp(base, s, n)`` with a small constant stride
(a strided convolution's or pooling's input) is ``s`` contiguous loads within the span its
lanes cover and one shuffle (:data:`STRIDED_LOADS`); other vector indices touch lanes one by
one. Inside
the branch of a vector ``if_then_else`` (``self.mask`` set), vector loads are masked so
that lanes the condition rules out are never read.
"""
from __future__ import annotations

from .. import ir
from .. import expr as E
from ..expr import dtype_element, dtype_lanes, parse_dtype
from .emitter import CodegenError, Value, alignment
from .llvm_types import element_bytes, llvm_type, memory_type, scalar_type


#: the strided loads' fast path on (its differential test turns it off to compare). MobileNet-v2's
#: stride-2 depthwise layers on one znver4 core, lane by lane -> fast path: 96x112x112
#: 802-1102 -> 152-165 us, 144x56x56 325-473 -> 64-66, 192x28x28 102-148 -> 27-32.
STRIDED_LOADS = True
#: the in-bounds loads' fast path on (:meth:`MemoryCodegen._inside`; its differential
#: test turns it off to compare). MobileNet-v2's int8 depthwise layers as AVX2 code (each
#: channel's padded plane staged from masked byte loads), one thread, emeraldrapids: 32 x 112
#: x 112 413 -> 224 us, 960 x 7 x 7 113 -> 41, 96 x 112 x 112 stride 2 read in place 782 -> 336;
#: ResNet-18's int8 max pool 581 -> 103.
IN_BOUNDS_LOADS = True


def _mangle(llvm_scalar: str) -> str:
    return {"float": "f32", "double": "f64", "half": "f16"}.get(llvm_scalar, llvm_scalar)


class MemoryCodegen:
    """Memory access methods of :class:`ExprCodegen` (which provides env, fn, module, mask)."""

    #: inside an index expression: signed arithmetic is ``nsw`` (an in-bounds index cannot wrap)
    in_index = False

    def index(self, node) -> Value:
        """An index expression's value, its signed adds and multiplies marked ``nsw`` so that
        LLVM folds the sign extension into the address (a wrapped index would be out of
        bounds: undefined already)."""
        outer, self.in_index = self.in_index, True
        try:
            return self(node)
        finally:
            self.in_index = outer

    def address(self, buffer, index: Value) -> Value:
        base = self.env.get(buffer)
        if base is None:
            raise CodegenError(f"buffer {buffer.name} is used outside its allocation")
        if index.const == 0:
            return base
        idx = index
        if index.type != "i64":
            if index.const is not None:
                idx = Value("i64", str(index.const), const=index.const)
            else:
                idx = self.fn.assign("i64", f"sext {index} to i64")
        return self.fn.assign("ptr", f"getelementptr inbounds {memory_type(buffer.dtype)}, "
                                     f"ptr {base.ref}, i64 {idx.ref}", hint="p")

    def lane_indices(self, index_node, lanes: int) -> list[Value]:
        """Scalar index of every lane of a vector index (for gathers and scatters)."""
        if isinstance(index_node, ir.Ramp):
            base, stride = self.index(index_node.base), self.index(index_node.stride)
            elem = index_node.base.dtype
            out = []
            for k in range(lanes):
                step = self._int_binary(E.Mul, elem, stride, self.const(k, elem))
                out.append(self._int_binary(E.Add, elem, base, step))
            return out
        if isinstance(index_node, ir.Broadcast):
            return [self.index(index_node.value)] * lanes
        vec = self.index(index_node)
        elem_ty = scalar_type(dtype_element(index_node.dtype))
        return [self.fn.assign(elem_ty, f"extractelement {vec}, i32 {k}") for k in range(lanes)]

    def visit_Load(self, node):
        buffer = node.buffer
        lanes = dtype_lanes(node.dtype)
        mty = memory_type(buffer.dtype)
        nbytes = element_bytes(buffer.dtype)
        contiguous = self._contiguous_base(node.index)
        if lanes == 1:
            index = self.index(node.index)
            ptr = self.address(buffer, index)
            raw = self.fn.assign(mty, f"load {mty}, ptr {ptr.ref}, align {nbytes}")
            return self._from_memory(raw, buffer.dtype)
        vty = f"<{lanes} x {mty}>"
        if contiguous is not None:
            base = self.index(contiguous)
            ptr = self.address(buffer, base)
            align = alignment(base.div, nbytes)
            if self.mask is None:
                raw = self.fn.assign(vty, f"load {vty}, ptr {ptr.ref}, align {align}")
            else:
                raw = self._masked_load(buffer, base, vty, ptr, align)
            return self._from_memory(raw, node.dtype)
        stride = self._load_stride(node.index, lanes)
        if stride:
            return self._from_memory(self._strided_load(buffer, node.index, lanes), node.dtype)
        if self.mask is not None:
            index = self.index(node.index) if not isinstance(node.index, ir.Broadcast) else \
                self.splat(self.index(node.index.value), lanes)
            wide = f"<{lanes} x i64>"
            if index.type != wide:
                index = self.fn.assign(wide, f"sext {index} to {wide}")
            ptrs = self.fn.assign(f"<{lanes} x ptr>", f"getelementptr inbounds {mty}, "
                                  f"ptr {self.env[buffer].ref}, {index}")
            raw = self._masked("gather", vty, ptrs, nbytes)
            return self._from_memory(raw, node.dtype)
        if isinstance(node.index, ir.Broadcast):
            scalar = self.visit_Load(ir.Load(buffer, node.index.value))
            return self.splat(scalar, lanes)
        vty = llvm_type(node.dtype)
        result = Value(vty, "poison")
        for k, index in enumerate(self.lane_indices(node.index, lanes)):
            ptr = self.address(buffer, index)
            raw = self.fn.assign(mty, f"load {mty}, ptr {ptr.ref}, align {nbytes}")
            lane = self._from_memory(raw, buffer.dtype)
            result = self.fn.assign(vty, f"insertelement {result}, {lane}, i32 {k}")
        return result

    def _loads_whole(self, buffer) -> bool:
        """Whether a load under a mask from ``buffer`` reads whole vectors where they lie in
        the buffer (:meth:`_inside`): bytes and 16-bit elements on a target without masked
        loads of them (``module.masked_loads``), which LLVM would load lane by lane, a branch
        a lane (16 to 64 lanes a vector). Wider elements keep the masked load: NEON's 4-lane
        float depthwise loop read in place ran 127 instructions for 63 multiply-adds (LLVM
        takes the masks' branches out of the loop), 283 as whole loads."""
        native = self.module.masked_loads
        bits = element_bytes(buffer.dtype) * 8
        return native is not None and bits < 32 and bits not in native

    def _masked_load(self, buffer, base: Value, vty: str, pointer: Value, align: int) -> Value:
        """A contiguous load from ``base`` under ``self.mask``: where :meth:`_loads_whole`,
        one plain load if the vector lies inside the buffer (:meth:`_inside`; the select
        around it drops the lanes the mask rules out), else the masked load."""
        def masked():
            return self._masked("load", vty, pointer, align)

        def whole():
            return self.fn.assign(vty, f"load {vty}, ptr {pointer.ref}, align {align}")
        if not self._loads_whole(buffer):
            return masked()
        return self._inside(buffer, base, int(vty[1:].split(" x ")[0]), vty, whole, masked)

    def _inside(self, buffer, base: Value, span: int, vty: str, whole, part) -> Value:
        """``whole()`` where the ``span`` elements from ``base`` lie inside ``buffer``, else
        ``part()`` (the in-bounds loads' fast path: :data:`IN_BOUNDS_LOADS`, a buffer of known
        size); each emits its load and returns its value."""
        size = buffer.size
        if not IN_BOUNDS_LOADS or not isinstance(size, int) or span > size:
            return part()
        first = self.fn.assign("i1", f"icmp sge {base}, 0")
        last = self.fn.assign("i1", f"icmp sle {base}, {size - span}")
        inside = self.fn.assign("i1", f"and i1 {first.ref}, {last.ref}")
        whole_l, part_l, join = (self.fn.label(h) for h in ("ld.whole", "ld.part", "ld.end"))
        self.fn.emit(f"br {inside}, label %{whole_l}, label %{part_l}")
        self.fn.start_block(whole_l)
        plain = whole()
        whole_end = self.fn.block
        self.fn.branch(join)
        self.fn.start_block(part_l)
        masked = part()
        part_end = self.fn.block
        self.fn.branch(join)
        self.fn.start_block(join)
        return self.fn.assign(vty, f"phi {vty} [ {plain.ref}, %{whole_end} ], "
                                   f"[ {masked.ref}, %{part_end} ]")

    def _masked(self, kind: str, vty: str, pointer: Value, align: int) -> Value:
        """A masked load (``pointer`` a ``ptr``) or gather (a vector of pointers) under
        ``self.mask``. A width that is not a power of two is done at the next power of two,
        the added lanes masked off: LLVM 22's x86 backend miscompiles ``<11 x float>`` masked
        loads on AVX/AVX2 (lanes 8-10 of a depthwise tile of 11 columns came out wrong)."""
        lanes, elem = vty[1:-1].split(" x ")
        lanes = int(lanes)
        mask = self.mask
        wide = 1 << (lanes - 1).bit_length()
        if wide != lanes:
            widen = ", ".join(f"i32 {min(k, lanes)}" for k in range(wide))
            mask = self.fn.assign(f"<{wide} x i1>", f"shufflevector {mask}, <{lanes} x i1> "
                                  f"zeroinitializer, <{wide} x i32> <{widen}>")
            if kind != "load":
                keep = ", ".join(f"i32 {min(k, lanes - 1)}" for k in range(wide))
                pointer = self.fn.assign(f"<{wide} x ptr>", f"shufflevector {pointer}, "
                                         f"<{lanes} x ptr> poison, <{wide} x i32> <{keep}>")
        wty = f"<{wide} x {elem}>"
        suffix = f"v{wide}{_mangle(elem)}"
        name = (f"llvm.masked.load.{suffix}.p0" if kind == "load"
                else f"llvm.masked.gather.{suffix}.v{wide}p0")
        ptr_ty = "ptr" if kind == "load" else f"<{wide} x ptr>"
        self.module.declare(name, f"declare {wty} @{name}({ptr_ty}, i32, <{wide} x i1>, {wty})")
        raw = self.fn.assign(wty, f"call {wty} @{name}({pointer}, i32 {align}, {mask}, "
                                  f"{wty} poison)")
        if wide == lanes:
            return raw
        first = ", ".join(f"i32 {k}" for k in range(lanes))
        return self.fn.assign(vty, f"shufflevector {raw}, {wty} poison, <{lanes} x i32> <{first}>")

    @staticmethod
    def _load_stride(index_node, lanes: int) -> int:
        """The stride of a ``Ramp`` index the strided fast path loads, else 0."""
        if not STRIDED_LOADS or lanes < 4 or not isinstance(index_node, ir.Ramp) or \
                not isinstance(index_node.stride, E.IntImm):
            return 0
        stride = index_node.stride.value
        return stride if 2 <= stride <= ir.MAX_STRIDED_LOAD else 0

    def _strided_load(self, buffer, ramp, lanes: int) -> Value:
        """Lanes ``base + k * stride``: contiguous ``lanes``-wide loads covering the span from
        the first lane's element to the last one's (the last load ends on the last lane, so no
        element outside the lanes' span is read), concatenated, then one shuffle picks the
        lanes. Under a mask, masked loads reading only the elements of the lanes the mask
        keeps; on a target without masked loads of the buffer's elements, the plain loads
        where the span lies inside the buffer (:meth:`_inside`)."""
        if self.mask is None or not self._loads_whole(buffer):
            return self._strided_parts(buffer, ramp, lanes)
        outer = self.mask

        def unmasked():
            self.mask = None
            try:
                return self._strided_parts(buffer, ramp, lanes)
            finally:
                self.mask = outer
        vty = f"<{lanes} x {memory_type(buffer.dtype)}>"
        span = (lanes - 1) * ramp.stride.value + 1
        return self._inside(buffer, self.index(ramp.base), span, vty, unmasked,
                            lambda: self._strided_parts(buffer, ramp, lanes))

    def _strided_parts(self, buffer, ramp, lanes: int) -> Value:
        mty = memory_type(buffer.dtype)
        nbytes = element_bytes(buffer.dtype)
        stride = ramp.stride.value
        span = (lanes - 1) * stride + 1
        offsets = [min(j * lanes, span - lanes) for j in range(-(-span // lanes))]
        vty = f"<{lanes} x {mty}>"
        source = [min(k * stride // lanes, len(offsets) - 1) for k in range(lanes)]
        picks = [j * lanes + k * stride - offsets[j] for k, j in enumerate(source)]
        parts = []
        for j, offset in enumerate(offsets):
            ptr = self.address(buffer, self.index(ramp.base + offset))
            if self.mask is None:
                parts.append(self.fn.assign(vty, f"load {vty}, ptr {ptr.ref}, align {nbytes}"))
                continue
            read = [lanes] * lanes          # lane ``lanes``: the false of the zero operand
            for k, part in enumerate(source):
                if part == j:
                    read[k * stride - offset] = k
            order = ", ".join(f"i32 {k}" for k in read)
            mask = self.fn.assign(f"<{lanes} x i1>", f"shufflevector {self.mask}, <{lanes} x i1> "
                                  f"zeroinitializer, <{lanes} x i32> <{order}>")
            outer, self.mask = self.mask, mask
            try:
                parts.append(self._masked("load", vty, ptr, nbytes))
            finally:
                self.mask = outer
        whole, width = self.concatenated(parts, mty)
        order = ", ".join(f"i32 {k}" for k in picks)
        return self.fn.assign(vty, f"shufflevector {whole}, <{width} x {mty}> poison, "
                                   f"<{lanes} x i32> <{order}>")

    def concatenated(self, parts: list, element: str) -> tuple[Value, int]:
        """Vectors of the same width, of ``element``s, one after another in one vector (pairs
        joined by a shuffle, poison past the last where their count is not a power of two);
        returns it and its width."""
        width = int(parts[0].type[1:].split(" x ")[0])
        while len(parts) > 1:
            if len(parts) % 2:
                parts = [*parts, Value(f"<{width} x {element}>", "poison")]
            order = ", ".join(f"i32 {k}" for k in range(2 * width))
            parts = [self.fn.assign(f"<{2 * width} x {element}>",
                                    f"shufflevector {a}, {b}, <{2 * width} x i32> <{order}>")
                     for a, b in zip(parts[::2], parts[1::2])]
            width *= 2
        return parts[0], width

    @staticmethod
    def _contiguous_base(index_node):
        if isinstance(index_node, ir.Ramp) and isinstance(index_node.stride, E.IntImm) \
                and index_node.stride.value == 1:
            return index_node.base
        return None

    def _from_memory(self, raw: Value, dtype: str) -> Value:
        if parse_dtype(dtype)[0] != "bool":
            return raw
        ty = llvm_type(dtype)
        return self.fn.assign(ty, f"trunc {raw} to {ty}")

    def to_memory(self, value: Value, dtype: str) -> Value:
        if parse_dtype(dtype)[0] != "bool":
            return value
        lanes = dtype_lanes(dtype)
        ty = "i8" if lanes == 1 else f"<{lanes} x i8>"
        return self.fn.assign(ty, f"zext {value} to {ty}")

    def store(self, node) -> None:
        buffer = node.buffer
        lanes = dtype_lanes(node.value.dtype)
        nbytes = element_bytes(buffer.dtype)
        value = self.to_memory(self(node.value), node.value.dtype)
        if lanes == 1:
            ptr = self.address(buffer, self.index(node.index))
            self.fn.emit(f"store {value}, ptr {ptr.ref}, align {nbytes}")
            return
        contiguous = self._contiguous_base(node.index)
        if contiguous is not None:
            base = self.index(contiguous)
            ptr = self.address(buffer, base)
            self.fn.emit(f"store {value}, ptr {ptr.ref}, align {alignment(base.div, nbytes)}")
            return
        mty = memory_type(buffer.dtype)
        for k, index in enumerate(self.lane_indices(node.index, lanes)):
            lane = self.fn.assign(mty, f"extractelement {value}, i32 {k}")
            ptr = self.address(buffer, index)
            self.fn.emit(f"store {lane}, ptr {ptr.ref}, align {nbytes}")
