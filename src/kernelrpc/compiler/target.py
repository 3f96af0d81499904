"""Compilation target: ``"llvm -mtriple=... -mcpu=... -mattr=..."``.

The identity (triple, cpu, features) decides the machine code and is recorded
in every module's metadata and so in every ProfileResult measured with it.
A bare ``"llvm"`` means the host this process runs on.
"""
from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass

__all__ = ["Target", "TargetError"]

_OPTIONS = ("mtriple", "mcpu", "mattr", "mabi")


class TargetError(ValueError):
    """The target string cannot be parsed or names something LLVM does not know."""


@functools.lru_cache(maxsize=1)
def _host() -> tuple[str, str, str]:
    from .codegen.llvm_init import ensure_llvm

    llvm = ensure_llvm()
    features = llvm.get_host_cpu_features()
    enabled = ",".join(f"+{name}" for name, on in sorted(features.items()) if on)
    return llvm.get_process_triple(), llvm.get_host_cpu_name(), enabled


@dataclass(frozen=True)
class Target:
    """A parsed LLVM CPU target.

    Attributes:
        kind: always ``"llvm"`` (CPU code through LLVM).
        triple: the LLVM target triple, e.g. ``x86_64-unknown-linux-gnu``.
        cpu: the LLVM cpu name (``znver4``, ``generic``...).
        features: comma-separated ``+feat,-feat`` list; empty means the cpu's defaults.
        abi: optional ABI name (``lp64d`` on riscv64).
        mattr_given: whether ``-mattr`` was spelled out (else ``features`` are the
            host's or the cpu's own, and ``str()`` leaves them out for readability).
    """

    kind: str
    triple: str
    cpu: str
    features: str
    abi: str = ""
    mattr_given: bool = False

    def __init__(self, target: "str | Target | None" = None):
        if isinstance(target, Target):
            values = (target.triple, target.cpu, target.features, target.abi, target.mattr_given)
        else:
            values = _parse(target or "llvm")
        object.__setattr__(self, "kind", "llvm")
        for name, value in zip(("triple", "cpu", "features", "abi", "mattr_given"), values):
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
    def pointer_bits(self) -> int:
        return 32 if self.arch in ("i386", "i686", "arm", "armv7", "thumbv7", "riscv32",
                                   "wasm32") or self.arch.startswith("armv") else 64

    def __str__(self) -> str:
        parts = ["llvm", f"-mtriple={self.triple}", f"-mcpu={self.cpu}"]
        if self.features and self.mattr_given:
            parts.append(f"-mattr={self.features}")
        if self.abi:
            parts.append(f"-mabi={self.abi}")
        return " ".join(parts)

    def to_dict(self) -> dict:
        """The identity recorded in module metadata (``docs/module-format.md``)."""
        return {"string": str(self), "triple": self.triple, "cpu": self.cpu,
                "features": self.features}


def _parse(text: str) -> tuple[str, str, str, str, bool]:
    if not isinstance(text, str):
        raise TargetError(f"target must be a string or Target, got {type(text).__name__}")
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise TargetError(f"cannot parse target {text!r}: {exc}") from None
    if not tokens or tokens[0] != "llvm":
        raise TargetError(f"target {text!r} must start with 'llvm' (CPU code through LLVM)")
    options: dict[str, str] = {}
    for token in tokens[1:]:
        key, sep, value = token.lstrip("-").partition("=")
        if not token.startswith("-") or not sep or key not in _OPTIONS:
            raise TargetError(f"unknown target option {token!r} in {text!r}; "
                              f"expected -{'=..., -'.join(_OPTIONS)}=...")
        options[key] = value
    host_triple, host_cpu, host_features = _host()
    triple = options.get("mtriple", host_triple)
    same_as_host = _same_arch(triple, host_triple)
    cpu = options.get("mcpu") or (host_cpu if same_as_host and "mattr" not in options
                                  and "mcpu" not in options else "generic")
    if "mattr" in options:
        features = options["mattr"]
    elif same_as_host and "mcpu" not in options:
        features = host_features
    else:
        features = ""
    _check_features(features, text)
    _check_llvm_knows(triple, text)
    return triple, cpu, features, options.get("mabi", ""), "mattr" in options


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
    from .codegen.llvm_init import ensure_llvm

    llvm = ensure_llvm()
    try:
        llvm.Target.from_triple(triple)
    except RuntimeError as exc:
        raise TargetError(f"LLVM does not know the triple {triple!r} of {text!r}: {exc}") from None
