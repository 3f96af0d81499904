"""JIT compilation of an ``llvmlite.ir`` module for this host, and the spin-wait hint."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

from llvmlite import ir

from .llvm import ensure_llvm, host_cpu


@dataclass(frozen=True)
class JitFunction:
    """A compiled function and the engine that owns its code (keep both alive together)."""

    function: ctypes._CFuncPtr
    engine: object

    def __call__(self, *args):
        return self.function(*args)


def jit_function(module: ir.Module, name: str, prototype, opt_level: int = 2) -> JitFunction:
    """Verify, optimise and compile ``module`` for the host; ``name`` through ``prototype``.

    Raises:
        RuntimeError: LLVM rejected the module (its diagnosis is the message).
    """
    llvm = ensure_llvm()
    host = host_cpu()
    machine = llvm.Target.from_triple(host.triple).create_target_machine(
        cpu=host.cpu, features=host.features, opt=opt_level)
    module.triple = host.triple
    module.data_layout = str(machine.target_data)
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    pass_builder = llvm.create_pass_builder(machine, llvm.create_pipeline_tuning_options(opt_level))
    pass_builder.getModulePassManager().run(parsed, pass_builder)
    engine = llvm.create_mcjit_compiler(parsed, machine)
    engine.finalize_object()
    address = engine.get_function_address(name)
    if not address:
        raise RuntimeError(f"LLVM produced no function {name!r}")
    return JitFunction(prototype(address), engine)


def spin_hint(builder: ir.IRBuilder, arch: str) -> None:
    """Emit the CPU's "spinning" hint (x86 ``pause``, Arm ``yield``); nothing elsewhere."""
    module = builder.module
    if arch in ("x86_64", "i386", "i686"):
        name, args = "llvm.x86.sse2.pause", []
    elif arch.startswith("aarch64"):
        name, args = "llvm.aarch64.hint", [ir.IntType(32)(1)]
    elif arch.startswith(("arm", "thumb")):
        name, args = "llvm.arm.hint", [ir.IntType(32)(1)]
    else:
        return
    hint = module.globals.get(name) or ir.Function(
        module, ir.FunctionType(ir.VoidType(), [a.type for a in args]), name)
    builder.call(hint, args)
