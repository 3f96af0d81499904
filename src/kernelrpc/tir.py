"""TVM's ``tvm.tir`` expression helpers (``tvm.tir.indexmod(y, bn)``...) over kernelrpc's IR, and
``call_extern`` of C functions linked into the module."""
from __future__ import annotations

from .compiler import ir_builder
from .compiler.ir import PrimFunc, call_extern, call_packed
from .compiler.expr import (Cast, FloatImm, IntImm, PrimExpr, Select, Var, all_of as all,
                            any_of as any, call_llvm_pure_intrin, const, floordiv, floormod,
                            if_then_else, indexdiv, indexmod, max_value, min_value, reinterpret,
                            truncdiv, truncmod)

__all__ = ["Cast", "FloatImm", "IntImm", "PrimExpr", "Select", "Var", "all", "any", "call_extern",
           "call_llvm_pure_intrin", "call_packed", "reinterpret", "const", "ir_builder", "PrimFunc", "floordiv", "floormod", "if_then_else", "indexdiv", "indexmod",
           "max_value", "min_value", "truncdiv", "truncmod"]
