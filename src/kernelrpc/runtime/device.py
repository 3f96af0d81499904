"""Devices: where a tensor lives and a function runs; local, or remote when ``session`` is set."""
from __future__ import annotations

import operator

# DLPack device-type codes, as TVM puts them on the wire.
DEVICE_TYPE_CODES = {"cpu": 1}
_DEVICE_ALIASES = {"cpu": "cpu", "llvm": "cpu", "c": "cpu"}


class Device:
    """A device: type name, index and, for a remote one, the RPC session that reaches it."""

    __slots__ = ("device_type", "device_id", "session")

    def __init__(self, device_type: str = "cpu", device_id: int = 0, session=None):
        self.device_type = _device_type_name(device_type)
        self.device_id = _device_id(device_id)
        self.session = session

    @property
    def device_type_code(self) -> int:
        return DEVICE_TYPE_CODES[self.device_type]

    @property
    def is_local(self) -> bool:
        return self.session is None

    def sync(self) -> None:
        """Wait for the device's pending work; CPU kernels run synchronously, so nothing to do."""

    def __eq__(self, other) -> bool:
        return (isinstance(other, Device) and self.device_type == other.device_type
                and self.device_id == other.device_id and self.session is other.session)

    def __hash__(self) -> int:
        return hash((self.device_type, self.device_id, id(self.session)))

    def __repr__(self) -> str:
        where = "" if self.session is None else f"remote[{self.session!r}]:"
        return f"{where}{self.device_type}({self.device_id})"


def _device_type_name(device_type) -> str:
    if isinstance(device_type, str):
        name = _DEVICE_ALIASES.get(device_type.split(" ", 1)[0].strip().lower())
        if name is not None:
            return name
    elif isinstance(device_type, int) and not isinstance(device_type, bool):
        for name, code in DEVICE_TYPE_CODES.items():
            if code == device_type:
                return name
    raise ValueError(f"unsupported device type {device_type!r}; supported: "
                     f"{', '.join(DEVICE_TYPE_CODES)}")


def _device_id(device_id) -> int:
    if isinstance(device_id, bool):
        raise TypeError("device_id must be an integer")
    value = operator.index(device_id)
    if not 0 <= value < 1 << 31:
        raise ValueError(f"device_id must be in [0, 2**31), got {value}")
    return value


def cpu(dev_id: int = 0) -> Device:
    """The local CPU (``kernelrpc.cpu(0)``)."""
    return Device("cpu", dev_id)


def device(dev_type="cpu", dev_id: int = 0) -> Device:
    """A local device by name (``"cpu"``, or a target string such as ``"llvm -mcpu=..."``) or code."""
    return Device(dev_type, dev_id)
