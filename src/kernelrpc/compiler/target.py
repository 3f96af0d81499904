"""Compilation target: ``"llvm -mtriple=... -mcpu=... -mattr=..."``, TVM's spelling.

The identity (triple, cpu, features, ABI) decides the machine code and is recorded
in every module's metadata and so in every ProfileResult measured with it.
A bare ``"llvm"`` means the host this process runs on.

TVM's other CPU target options are accepted so that target strings users already
have keep working: ``-opt-level`` sets the LLVM optimisation level,
``-mfloat-abi`` is checked against the triple, and the labels ``-device``,
``-keys``, ``-model``, ``-tag``, ``-libs``, ``-num-cores`` are recorded in the
module's target; those that would change code in TVM (``-device``, ``-libs``,
``-num-cores``) do not here, and a :class:`TargetOptionIgnored` warning says so.
"""
from __future__ import annotations

import functools
import json
import re
import shlex
import warnings
from dataclasses import dataclass

from ..native.llvm import ensure_llvm, host_cpu

__all__ = ["Target", "TargetError", "TargetKind", "TargetOptionIgnored"]

_CODE_OPTIONS = ("mtriple", "mcpu", "mattr", "mabi", "mfloat-abi", "opt-level")
_LABELS = ("device", "keys", "model", "tag", "libs", "num-cores")
#: Labels that steer TVM's code (schedule choice, external libraries, core count) but
#: not kernelrpc's: the schedule is the user's, no library is linked, and the module's
#: thread pool sizes itself on the device.
_IGNORED = {
    "device": "kernelrpc does not choose schedules by device; the schedule you give is built",
    "libs": "kernelrpc links no external kernel libraries; the generated code is used",
    "num-cores": "the module's thread pool sizes itself on the device (set_num_threads)",
}
#: riscv64 with no -mattr: the RV64GC profile every Linux distribution targets, so the
#: float ABI (lp64d) matches the device's C library.
_RISCV64_DEFAULT = ("generic-rv64", "+m,+a,+f,+d,+c")


class TargetKind(str):
    """The target's kind: a string (``target.kind == "llvm"``) with TVM's ``.name``."""

    @property
    def name(self) -> str:
        return str(self)


class TargetError(ValueError):
    """The target string cannot be parsed or names something LLVM does not know."""


class TargetOptionIgnored(UserWarning):
    """A TVM target option was accepted and recorded but has no effect on kernelrpc's code."""


def _host() -> tuple[str, str, str]:
    host = host_cpu()
    return host.triple, host.cpu, host.features


@dataclass(frozen=True)
class Target:
    """A parsed LLVM CPU target.

    ``Target(target, host=None)`` as in TVM: ``target`` is a string (``"llvm -mtriple=..."``),
    TVM 0.27's JSON/dict form (``{"kind": "llvm", "mtriple": ..., "mattr": [...]}``) or a
    ``tvm.target.Target``. For CPU code the host (if given) is only recorded, since the
    kernel and its caller run on the same CPU.

    Attributes:
        kind: always ``"llvm"`` (CPU code through LLVM); ``kind.name`` as in TVM.
        triple: the LLVM target triple, e.g. ``x86_64-unknown-linux-gnu``.
        cpu: the LLVM cpu name (``znver4``, ``generic``...).
        features: comma-separated ``+feat,-feat`` list; empty means the cpu's defaults.
        abi: ABI name given with ``-mabi`` or implied by the triple (``lp64d`` on riscv64).
        mattr_given: whether ``-mattr`` was spelled out (else ``features`` are the
            host's or the cpu's own, and ``str()`` leaves them out for readability).
        opt_level: ``-opt-level`` (None: the build's default).
        labels: the recorded TVM labels, as sorted ``(name, value)`` pairs.
        host_string: the ``host=`` target's string, if one was given.
    """

    kind: str
    triple: str
    cpu: str
    features: str
    abi: str = ""
    mattr_given: bool = False
    opt_level: "int | None" = None
    labels: tuple = ()
    host_string: str = ""

    def __init__(self, target: "str | dict | Target | None" = None,
                 host: "str | dict | Target | None" = None):
        if isinstance(target, Target):
            values = dict(target.__dict__)
        else:
            target = _as_dict_if_tvm(target)
            values = _parse(target or "llvm")
            if host is None and isinstance(target, dict):
                host = target.get("host")
        if host is not None:
            values["host_string"] = str(host if isinstance(host, Target) else Target(host))
        values["kind"] = TargetKind("llvm")
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @classmethod
    def host(cls) -> "Target":
        return cls("llvm")

    @property
    def arch(self) -> str:
        return self.triple.split("-", 1)[0]

    @property
    def is_host(self) -> bool:
        """Code for this target runs here (same architecture and OS as this process)."""
        host = _host()[0]
        return _same_arch(self.triple, host) and _os(self.triple) == _os(host)

    @property
    def llvm_triple(self) -> str:
        """The triple in LLVM's normal form (``armv7-unknown-linux-gnueabihf``): LLVM reads
        ``armv7-linux-gnueabihf`` positionally, as vendor ``linux`` and OS ``gnueabihf``,
        and then falls back to the soft-float calling convention for libm calls."""
        return _normalized(self.triple)

    @property
    def pointer_bits(self) -> int:
        return _pointer_bits(self.triple)

    @property
    def float_abi(self) -> str:
        """``hard`` or ``soft`` on 32-bit Arm (from the triple), else ``""``."""
        if not self.arch.startswith(("arm", "thumb")):
            return ""
        return "hard" if self.triple.endswith("hf") else "soft"

    def __str__(self) -> str:
        parts = ["llvm", f"-mtriple={self.triple}", f"-mcpu={self.cpu}"]
        if self.features and self.mattr_given:
            parts.append(f"-mattr={self.features}")
        if self.abi and self.abi != _implied_abi(self.triple, self.features):
            parts.append(f"-mabi={self.abi}")
        if self.opt_level is not None:
            parts.append(f"-opt-level={self.opt_level}")
        parts += [f"-{key}={shlex.quote(value)}" for key, value in self.labels]
        return " ".join(parts)

    def to_dict(self) -> dict:
        """The identity recorded in module metadata (``docs/module-format.md``)."""
        record = {"string": str(self), "triple": self.triple, "cpu": self.cpu,
                  "features": self.features, "abi": self.abi or _abi_name(self),
                  "pointer_bits": self.pointer_bits}
        if self.float_abi:
            record["float_abi"] = self.float_abi
        if self.labels:
            record["labels"] = dict(self.labels)
        if self.host_string:
            record["host"] = self.host_string
        return record


def _as_dict_if_tvm(target):
    """A ``tvm.target.Target`` or TVM's JSON form as a dict; anything else unchanged."""
    if hasattr(target, "export") and type(target).__module__.startswith("tvm"):
        return _plain(target.export())
    if isinstance(target, str) and target.lstrip().startswith("{"):
        try:
            return json.loads(target)
        except ValueError as exc:
            raise TargetError(f"cannot parse target {target!r}: {exc}") from None
    return target


def _parse(target) -> dict:
    """Target fields from a target string or TVM's dict form."""
    if isinstance(target, dict):
        return _from_options(*_dict_options(target))
    if not isinstance(target, str):
        raise TargetError(f"target must be a string, dict or Target, got {type(target).__name__}")
    text = target
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise TargetError(f"cannot parse target {text!r}: {exc}") from None
    if not tokens or tokens[0] != "llvm":
        raise TargetError(f"target {text!r} must start with 'llvm' (CPU code through LLVM)")
    options: dict[str, str] = {}
    for token in tokens[1:]:
        key, sep, value = token.lstrip("-").partition("=")
        if not token.startswith("-") or not sep or key not in _CODE_OPTIONS + _LABELS:
            raise TargetError(f"unknown target option {token!r} in {text!r}; expected "
                              f"-{'=..., -'.join(_CODE_OPTIONS + _LABELS)}=...")
        options[key] = value
    return _from_options(options, text)


def _plain(value):
    """TVM's Map/Array objects as dicts and lists."""
    if hasattr(value, "items") and not isinstance(value, str):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    try:
        return [_plain(v) for v in value]
    except TypeError:
        return str(value)


def _dict_options(doc: dict) -> tuple[dict, str]:
    """TVM's dict form (``{"kind": "llvm", "mtriple": ..., "mattr": ["+neon"], ...}``) as
    string options. ``feature.*`` entries are TVM's own derived facts and ``host`` is
    given to ``Target(..., host=)`` separately."""
    text = json.dumps(doc, default=str)
    if doc.get("kind") != "llvm":
        raise TargetError(f"target {text} must have kind 'llvm' (CPU code through LLVM)")
    options: dict[str, str] = {}
    for key, value in doc.items():
        if key in ("kind", "host") or key.startswith("feature.") or (key == "tag" and not value):
            continue
        if key not in _CODE_OPTIONS + _LABELS:
            raise TargetError(f"unknown target option {key!r} in {text}; expected "
                              f"{', '.join(_CODE_OPTIONS + _LABELS)}")
        if isinstance(value, (list, tuple)):
            value = ",".join(map(str, value))
        options[key] = str(value)
    if options.get("keys") == "cpu":
        del options["keys"]             # TVM's default for every CPU target
    return options, text


def _from_options(options: dict, text: str) -> dict:
    host_triple, host_cpu, host_features = _host()
    triple = options.get("mtriple", host_triple)
    same_as_host = _same_arch(triple, host_triple)
    explicit_cpu = "mcpu" in options or "mattr" in options
    if "mattr" in options:
        features = options["mattr"]
    elif same_as_host and "mcpu" not in options:
        features = host_features
    elif triple.startswith("riscv64"):
        features = _RISCV64_DEFAULT[1]
    else:
        features = ""
    default_cpu = _RISCV64_DEFAULT[0] if triple.startswith("riscv64") else "generic"
    cpu = options.get("mcpu") or (host_cpu if same_as_host and not explicit_cpu else default_cpu)
    _check_features(features, text)
    _check_x86_64_float_abi(triple, features, text)
    _check_llvm_knows(triple, text)
    abi = options.get("mabi") or _implied_abi(triple, features)
    _check_float_abi(options.get("mfloat-abi"), triple, text)
    labels = tuple(sorted((key, options[key]) for key in _LABELS if key in options))
    for key, value in labels:
        if key in _IGNORED:
            warnings.warn(f"target option -{key}={value} is recorded but ignored: "
                          f"{_IGNORED[key]}", TargetOptionIgnored, stacklevel=4)
    return {"triple": triple, "cpu": cpu, "features": features, "abi": abi,
            "mattr_given": "mattr" in options, "opt_level": _opt_level(options, text),
            "labels": labels, "host_string": ""}


def _check_x86_64_float_abi(triple: str, features: str, text: str) -> None:
    """x86-64's calling convention passes and returns floats in SSE registers: code without
    SSE2 cannot call the C library's float functions (LLVM stops the process over it)."""
    turned_off = {f[1:] for f in features.split(",") if f.startswith("-")}
    if triple.startswith("x86_64") and turned_off & {"sse", "sse2"}:
        raise TargetError(f"target {text!r}: x86-64 code needs SSE2 (its calling convention "
                          "passes floats in SSE registers); drop -sse/-sse2 from -mattr")


def _implied_abi(triple: str, features: str) -> str:
    """The ABI LLVM would need to be told about: riscv64's float ABI from its features."""
    if not triple.startswith("riscv64"):
        return ""
    enabled = set(filter(None, features.split(",")))
    return "lp64d" if "+d" in enabled else "lp64f" if "+f" in enabled else "lp64"


def _abi_name(target: "Target") -> str:
    """The calling convention's usual name, for the record (LLVM needs no option for it)."""
    arch = target.arch
    if arch.startswith(("arm", "thumb")):
        return "aapcs-vfp" if target.float_abi == "hard" else "aapcs"
    return {"aarch64": "aapcs64", "x86_64": "sysv"}.get(arch, "")


def _opt_level(options: dict, text: str) -> "int | None":
    value = options.get("opt-level")
    if value is None:
        return None
    if value not in ("0", "1", "2", "3"):
        raise TargetError(f"-opt-level must be 0, 1, 2 or 3 in {text!r}, got {value!r}")
    return int(value)


def _check_float_abi(value: "str | None", triple: str, text: str) -> None:
    if value is None:
        return
    if value not in ("hard", "soft", "softfp"):
        raise TargetError(f"-mfloat-abi must be hard, soft or softfp in {text!r}, got {value!r}")
    if not triple.split("-", 1)[0].startswith(("arm", "thumb")):
        return
    implied = "hard" if triple.endswith("hf") else "soft"
    if (value == "hard") != (implied == "hard"):
        raise TargetError(f"-mfloat-abi={value} contradicts the triple {triple!r} in {text!r}; "
                          "use an ...-gnueabihf triple for hard float, ...-gnueabi for soft")


def _same_arch(triple: str, host_triple: str) -> bool:
    return triple.split("-", 1)[0] == host_triple.split("-", 1)[0]


def _os(triple: str) -> str:
    parts = triple.split("-")
    return next((p for p in parts[1:] if p not in ("unknown", "pc", "none")), "")


def _check_features(features: str, text: str) -> None:
    for item in filter(None, features.split(",")):
        if item[0] not in "+-" or not item[1:].replace(".", "").replace("-", "").replace(
                "_", "").isalnum():
            raise TargetError(f"bad -mattr entry {item!r} in {text!r}: use +feature or -feature")


def _check_llvm_knows(triple: str, text: str) -> None:
    llvm = ensure_llvm()
    try:
        llvm.Target.from_triple(triple)
    except RuntimeError as exc:
        raise TargetError(f"LLVM does not know the triple {triple!r} of {text!r}: {exc}") from None


@functools.lru_cache(maxsize=None)
def _normalized(triple: str) -> str:
    parts = ensure_llvm().get_triple_parts(triple)
    fields = [triple.split("-", 1)[0], parts.Vendor, parts.OS] + ([parts.Env] if parts.Env
                                                                  else [])
    return "-".join(fields)


@functools.lru_cache(maxsize=None)
def _pointer_bits(triple: str) -> int:
    """Pointer width from LLVM's data layout for the triple (``p:32:32`` on 32-bit targets)."""
    llvm = ensure_llvm()
    layout = str(llvm.Target.from_triple(_normalized(triple)).create_target_machine().target_data)
    match = re.search(r"(?:^|-)p(?:0)?:(\d+)", layout)
    return int(match.group(1)) if match else 64
