"""LLVM IR text -> optimised module -> relocatable object / assembly for a Target.

Pipeline: parse and link the IR modules, verify, run the new pass manager's O3
pipeline with the loop vectorizer off (it turned tiled scalar loops into
gathers here, 13x slower; vector code is emitted explicitly instead) and SLP as
configured, then emit position-independent code (``reloc="pic"``, small code model).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..target import Target
from .emitter import CodegenError
from ...native.llvm import ensure_llvm

__all__ = ["CodegenError", "CompileOptions", "CompiledObject", "compile_ir"]


@dataclass(frozen=True)
class CompileOptions:
    opt_level: int = 3
    slp_vectorize: bool = True
    loop_vectorize: bool = False
    loop_unroll: bool = True


@dataclass(frozen=True)
class CompiledObject:
    """Machine code for one target, plus the texts ``get_source`` offers."""

    target: Target
    object_code: bytes
    llvm_ir: str
    optimized_ir: str

    def assembly(self) -> str:
        """Assembly text of the optimised module (computed on demand)."""
        llvm = ensure_llvm()
        mod = llvm.parse_assembly(self.optimized_ir)
        return _target_machine(self.target, 3).emit_assembly(mod)


def _target_machine(target: Target, opt_level: int):
    llvm = ensure_llvm()
    try:
        llvm_target = llvm.Target.from_triple(target.llvm_triple)
    except RuntimeError as exc:
        raise CodegenError(f"LLVM has no backend for {target.triple}: {exc}") from None
    return llvm_target.create_target_machine(
        cpu=target.cpu, features=_llvm_features(target.features), opt=opt_level, reloc="pic",
        codemodel="default", abiname=target.abi)


def _llvm_features(features: str) -> str:
    """``features`` with ``-d32`` added for an ARM FPU of 16 double registers (``+vfp3d16``...):
    LLVM's armv7 defaults keep d16-d31, and float64 code used them, which traps on such a
    board (qemu's cortex-r5f, Raspberry Pi OS's VFP baseline)."""
    enabled = [f[1:] for f in features.split(",") if f.startswith("+")]
    if any(f.endswith(("d16", "d16sp")) for f in enabled) and "d32" not in features:
        return features + ",-d32"
    return features


def compile_ir(ir_texts: list[str], target: Target,
               options: CompileOptions = CompileOptions()) -> CompiledObject:
    """Link, optimise and compile LLVM IR modules into one object for ``target``.

    Raises:
        CodegenError: a module does not parse or verify (the message holds LLVM's diagnosis).
    """
    llvm = ensure_llvm()
    tm = _target_machine(target, options.opt_level)
    linked = None
    for index, text in enumerate(ir_texts):
        try:
            mod = llvm.parse_assembly(text)
        except RuntimeError as exc:
            raise CodegenError(f"generated LLVM IR (module {index}) does not parse: {exc}"
                               f"\n{_numbered(text, str(exc))}") from None
        mod.triple = target.llvm_triple
        mod.data_layout = str(tm.target_data)
        if linked is None:
            linked = mod
        else:
            linked.link_in(mod)
    if linked is None:
        raise CodegenError("nothing to compile")
    try:
        linked.verify()
    except RuntimeError as exc:
        raise CodegenError(f"generated LLVM IR does not verify: {exc}") from None
    source = str(linked)
    pto = llvm.create_pipeline_tuning_options(options.opt_level)
    pto.loop_vectorization = options.loop_vectorize
    pto.slp_vectorization = options.slp_vectorize
    pto.loop_unrolling = options.loop_unroll
    pass_builder = llvm.create_pass_builder(tm, pto)
    pass_builder.getModulePassManager().run(linked, pass_builder)
    return CompiledObject(target=target, object_code=tm.emit_object(linked), llvm_ir=source,
                          optimized_ir=str(linked))


def _numbered(text: str, error: str, context: int = 3) -> str:
    """The lines around the line number LLVM's parse error names, numbered."""
    import re

    match = re.search(r":(\d+):\d+:", error)
    if not match:
        return ""
    line = int(match.group(1))
    lines = text.splitlines()
    lo, hi = max(0, line - 1 - context), min(len(lines), line + context)
    return "\n".join(f"{n + 1:5d}  {lines[n]}" for n in range(lo, hi))
