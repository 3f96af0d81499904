"""Networks written in torch and exported to ONNX by torch's own exporters, as users export
them: the TorchScript exporter (``dynamo=False``, opset 17) and the dynamo exporter
(``dynamo=True``, opset 18), weights seeded with ``torch.manual_seed``.

Every export is cached in kernelrpc's cache (``exports/`` under ``deploy.toolchain.cache_dir``:
``~/.cache/kernelrpc/exports``), keyed by the source of the network's definition and of the
export call, its example inputs, the seed, the exporter and the versions of torch,
transformers, onnxscript and onnx; an export torch refuses is cached as its error. A later run
reads the file and does not import torch at all: torch, transformers and onnxscript are needed
(else the test skips) only to export."""
import contextlib
import hashlib
import importlib.metadata
import inspect
import io
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest

from kernelrpc.deploy.toolchain import cache_dir

EXPORTERS = {"torchscript": 17, "dynamo": 18}        # exporter -> the opset it is asked for
_VERSIONED = ("torch", "transformers", "onnxscript", "onnx")


@dataclass(frozen=True)
class Network:
    """A torch network to export: ``build()`` returns the ``nn.Module`` (called after
    ``torch.manual_seed(seed)``; its source, the cache key's, defines the whole network);
    ``inputs``: ``forward``'s arguments, name -> example array; ``script``: the module is
    compiled by ``torch.jit.script`` before the TorchScript exporter (its Python control flow
    becomes If); ``needs``: the packages besides torch that ``build`` imports; ``dynamic``:
    input name -> {axis: the dimension's name}, the axes exported as dynamic (as users export
    a batch or a sequence length: the shape arithmetic stays in the graph), fixed again at
    import (``shapes``)."""
    name: str
    build: Callable
    inputs: dict
    outputs: tuple = ("y",)
    seed: int = 0
    script: bool = False
    needs: tuple = ()
    dynamic: dict = field(default_factory=dict)

    @property
    def shapes(self) -> dict:
        """``from_onnx``'s ``shape=``: the example shape of each input with dynamic axes."""
        return {name: np.shape(self.inputs[name]) for name in self.dynamic}


class ExportRefused(Exception):
    """torch could not export the network; the message is torch's error."""


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _key(net: Network, exporter: str) -> str:
    digest = hashlib.sha256()
    for part in (_export, net.build):
        digest.update(inspect.getsource(part).encode())
    for name, value in net.inputs.items():
        value = np.asarray(value)
        digest.update(f"{name}:{value.dtype}:{value.shape}".encode())
        digest.update(value.tobytes())
    digest.update(repr((net.outputs, net.seed, net.script, net.dynamic, exporter,
                        EXPORTERS[exporter], [_version(p) for p in _VERSIONED])).encode())
    return digest.hexdigest()[:24]


def _export(net: Network, exporter: str, path) -> None:
    torch = pytest.importorskip("torch")
    for package in net.needs + (("onnxscript",) if exporter == "dynamo" else ()):
        pytest.importorskip(package)
    torch.manual_seed(net.seed)
    module = net.build().eval()
    if net.script and exporter == "torchscript":
        module = torch.jit.script(module)
    args = tuple(torch.tensor(np.asarray(v)) for v in net.inputs.values())
    with torch.no_grad():
        module(*args)           # an error of the network itself fails the test, never skips it
    if exporter == "dynamo":
        dims = {d: torch.export.Dim(d) for axes in net.dynamic.values() for d in axes.values()}
        dynamic = {"dynamic_shapes": {name: {axis: dims[d] for axis, d in axes.items()}
                                      for name, axes in net.dynamic.items()} or None}
    else:
        dynamic = {"dynamic_axes": net.dynamic or None}
    try:
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
            torch.onnx.export(module, args, str(path), input_names=list(net.inputs),
                              output_names=list(net.outputs), opset_version=EXPORTERS[exporter],
                              dynamo=exporter == "dynamo", external_data=False, **dynamic)
    except Exception as exc:            # whatever the exporter raises is its refusal
        kind = f"{type(exc).__module__}.{type(exc).__qualname__}"
        raise ExportRefused(f"{kind}: {_first_lines(str(exc))}") from exc


def _first_lines(text: str, count=3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " ".join(lines[:count])[:400]


def exported(net: Network, exporter: str) -> onnx.ModelProto:
    """``net`` exported by ``exporter`` (a key of ``EXPORTERS``), from the cache when it is
    there. Raises ExportRefused with torch's error where torch cannot export it."""
    folder = cache_dir() / "exports"
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{net.name}-{exporter}-{_key(net, exporter)}"
    model_path, refused_path = stem.with_suffix(".onnx"), stem.with_suffix(".refused")
    if refused_path.exists():
        raise ExportRefused(refused_path.read_text())
    if not model_path.exists():
        partial = stem.with_suffix(".partial")
        try:
            _export(net, exporter, partial)
        except ExportRefused as exc:
            refused_path.write_text(str(exc))
            raise
        finally:
            _drop_older(folder, net, exporter, stem)
        partial.replace(model_path)
    return onnx.load(str(model_path))


def _drop_older(folder, net: Network, exporter: str, stem) -> None:
    """The network's exports under earlier keys removed, so that the cache stays bounded."""
    for path in folder.glob(f"{net.name}-{exporter}-*"):
        if path.stem != stem.name:
            path.unlink(missing_ok=True)
