"""LLVM backend: loop IR -> LLVM IR text -> optimised object code, plus the module metadata
(the module runtime is C: ``module_runtime.c``)."""
from .emitter import CodegenError
from .func_codegen import emit_primfunc
from .llvm_emit import CompiledObject, CompileOptions, compile_ir
from .runtime_ir import metadata_ir

__all__ = ["CodegenError", "CompileOptions", "CompiledObject", "compile_ir", "emit_primfunc",
           "metadata_ir"]
