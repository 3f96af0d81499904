"""Checked tensors (``--checked-tensors``): find the call whose kernel wrote past a tensor.

A kernel whose metadata lies about a shape, or that indexes wrongly, can write past the end
(or before the start) of a tensor argument. Unchecked, the call returns OK and the session
fails later, somewhere else. In checked mode every tensor the session allocates sits
between two pads of a known pattern; after each call the pads of its tensor arguments are
compared, and a changed pad makes that call fail with :class:`TensorOverrun` (the pads are
then restored, so the session goes on). Writes that reach beyond a pad are not caught.
"""
from __future__ import annotations

from ..runtime.buffer import AlignedBuffer, BufferView

PAD = 4096                                 # a multiple of the 64-byte alignment
_PATTERN = bytes([0xA5, 0x5A, 0xC3, 0x3C]) * (PAD // 4)


class TensorOverrun(MemoryError):
    """A kernel wrote outside a tensor argument (seen in checked mode)."""


class CanaryBuffer(BufferView):
    """:class:`~kernelrpc.runtime.buffer.AlignedBuffer`'s interface, with a pad on each side."""

    __slots__ = ("nbytes", "_outer", "_view", "_before", "_after", "_address")

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self._outer = AlignedBuffer(nbytes + 2 * PAD)
        outer = self._outer.view
        self._before = outer[:PAD]
        self._after = outer[PAD + nbytes:]
        self._view = outer[PAD:PAD + nbytes]
        self._address = self._outer.address + PAD
        self._before[:] = self._after[:] = _PATTERN

    def free(self) -> None:
        self._view = self._before = self._after = None
        self._outer.free()
        self._address = 0

    def overrun(self) -> tuple[int, int] | None:
        """``(bytes changed before the start, bytes changed after the end)``, pads restored;
        None when both pads are intact."""
        if self._view is None or (self._before == _PATTERN and self._after == _PATTERN):
            return None
        changed = tuple(sum(a != b for a, b in zip(pad.tobytes(), _PATTERN)) for pad in (self._before, self._after))
        self._before[:] = self._after[:] = _PATTERN
        return changed


def guard(tensor) -> None:
    """Give a freshly allocated runtime tensor a :class:`CanaryBuffer` of its size."""
    tensor._buf.free()
    tensor._buf = CanaryBuffer(tensor.nbytes)


def check_arguments(args) -> None:
    """Raise :class:`TensorOverrun` if the call that just ran wrote outside a checked tensor
    among ``args``."""
    for index, arg in enumerate(args):
        buf = getattr(arg, "_buf", None)
        if type(buf) is CanaryBuffer:
            changed = buf.overrun()
            if changed is not None:
                before, after = changed
                where = " and ".join(part for part in (
                    f"{before} of the {PAD} bytes before its start" if before else "",
                    f"{after} of the {PAD} bytes after its end" if after else "") if part)
                raise TensorOverrun(f"the call wrote outside tensor argument {index} "
                                    f"({arg.dtype}{list(arg.shape)}, {arg.nbytes} bytes): it changed "
                                    f"{where} (checked mode)")
