"""PrimFunc -> LLVM IR text: statements, loops, allocations and parallel outlining.

Each PrimFunc becomes
* ``@<name>.impl(ptr noalias align 64 %A, ...)``: the body, internal;
* ``i32 @__kernelrpc_fn_<name>(ptr %args)``: the packed-convention entry point
  of docs/module-format.md, which unpacks ``args`` and calls the body.

A ``parallel`` loop is outlined into ``i32 @<name>.par<k>(ptr ctx, i32 task,
i32 ntasks)``, which unpacks the captured values from a context struct and runs
chunks of the iteration space, calling for each a chunk function whose pointer
parameters are again ``noalias`` (so LLVM keeps the alias facts after inlining).
Task ``t`` of ``n`` owns the ``t``-th contiguous ``n``-th of the iterations and runs
its chunks first, in order; then it helps the others, claiming their chunks from
their counters in the struct. Owning the same share of every loop keeps a core on
the part of a tensor it wrote in the layer before (its own cache), where chunks
claimed from one shared counter went to whichever core came first: a 1x1 layer
after another ran at the same speed on two threads as on one. The body runs on
the module's thread pool through ``__kernelrpc_parallel_launch``.

Small constant-size allocations live in the entry block (``alloca ... align 64``)
so SROA turns accumulator tiles indexed with constants into registers; larger
ones take a 64-byte aligned block from the module runtime's pool of freed blocks
(``__kernelrpc_workspace_alloc``/``_free`` around their scope; ``aligned_alloc`` when the
pool has none), so a kernel called again reuses pages already mapped.
"""
from __future__ import annotations

from .. import ir
from .. import expr as E
from ..expr import Var, dtype_lanes
from .emitter import CodegenError, FunctionBuilder, ModuleBuilder, Value
from .expr_codegen import ExprCodegen
from .llvm_types import element_bytes, llvm_type, memory_type
from .runtime_ir import LAUNCH_SYMBOL, MAX_WORKERS, WORKSPACE_ALLOC, WORKSPACE_FREE

#: Allocations up to this many bytes go on the stack (and may become registers).
STACK_ALLOC_LIMIT = 64 * 1024
#: A task's share of a parallel loop is cut into this many chunks, claimed one by one
#: from the share's counter, so a thread slowed by a noisy neighbour simply does fewer
#: and the others take the rest.
CHUNKS_PER_THREAD = 4
#: Tasks a parallel loop has counters for: the pool's threads (KRPC_MAX_WORKERS + 1).
MAX_TASKS = MAX_WORKERS + 1
#: Error code a kernel returns when a heap allocation fails.
ERR_OUT_OF_MEMORY = 2


def _symbol_name(name: str) -> str:
    if not name or not all(c.isalnum() or c == "_" for c in name) or name[0].isdigit():
        raise CodegenError(f"function name {name!r} must be a C identifier")
    return name


class StmtCodegen(ExprCodegen):
    """Statements of one LLVM function."""

    def __init__(self, module: ModuleBuilder, fn: FunctionBuilder, func_name: str,
                 in_parallel: bool = False):
        super().__init__(module, fn)
        self.func_name = func_name
        self.in_parallel = in_parallel
        self.outlined = 0

    def stmt(self, node) -> None:
        if node is None:            # nothing to do (an empty nest, e.g. a zero-size tensor)
            return
        method = getattr(self, "stmt_" + type(node).__name__, None)
        if method is None:
            raise CodegenError(f"cannot generate code for statement {type(node).__name__}")
        method(node)

    def stmt_SeqStmt(self, node):
        for s in node.seq:
            self.stmt(s)

    def stmt_Store(self, node):
        self.store(node)

    def stmt_Evaluate(self, node):
        self(node.value)

    def stmt_Prefetch(self, node):
        base = self.env.get(node.buffer)
        if base is None:
            return                  # the buffer is not live here: a hint can be dropped
        index = self(node.index)
        if index.type != "i64":
            index = self.cast(index, node.index.dtype, "int64")
        ptr = self.fn.assign("ptr", f"getelementptr {memory_type(node.buffer.dtype)}, "
                                    f"ptr {base.ref}, i64 {index.ref}")
        self.module.declare("llvm.prefetch.p0",
                            "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
        self.fn.emit(f"call void @llvm.prefetch.p0(ptr {ptr.ref}, i32 0, i32 3, i32 1)")

    def stmt_AssertStmt(self, node):
        cond = self(node.condition)
        if cond.const is None:
            self.return_if(self.fn.assign("i1", f"xor {cond}, true"), node.code)
        elif not cond.const:
            self.return_if(Value("i1", "true"), node.code)
        self.stmt(node.body)

    def stmt_LetStmt(self, node):
        with self.bound(node.var, self(node.value)):
            self.stmt(node.body)

    def stmt_IfThenElse(self, node):
        cond = self(node.condition)
        if cond.const is not None:
            chosen = node.then_case if cond.const else node.else_case
            if chosen is not None:
                self.stmt(chosen)
            return
        then_l, else_l, end_l = (self.fn.label(h) for h in ("then", "else", "endif"))
        self.fn.emit(f"br {cond}, label %{then_l}, label %{else_l if node.else_case else end_l}")
        self.fn.start_block(then_l)
        self.stmt(node.then_case)
        self.fn.branch(end_l)
        if node.else_case is not None:
            self.fn.start_block(else_l)
            self.stmt(node.else_case)
            self.fn.branch(end_l)
        self.fn.start_block(end_l)

    # ------------------------------------------------------------------ allocation

    def stmt_Allocate(self, node):
        buffer = node.buffer
        size = buffer.size
        if not isinstance(size, int):
            raise CodegenError(f"allocation {buffer.name} needs a constant size, got {size}")
        nbytes = max(1, size) * element_bytes(buffer.dtype)
        if nbytes <= STACK_ALLOC_LIMIT:
            storage = self.fn.alloca(memory_type(buffer.dtype), max(1, size), 64, hint=buffer.name)
            with self.bound(buffer, storage):
                self.stmt(node.body)
            return
        size_t = self.module.size_type
        if nbytes >= 1 << (8 * self.module.pointer_bytes - 1):
            raise CodegenError(f"allocation {buffer.name} of {nbytes} bytes does not fit the "
                               f"target's {8 * self.module.pointer_bytes}-bit address space")
        self.module.declare(WORKSPACE_ALLOC,
                            f"declare noalias ptr @{WORKSPACE_ALLOC}({size_t})")
        self.module.declare(WORKSPACE_FREE, f"declare void @{WORKSPACE_FREE}(ptr, {size_t})")
        ptr = self.fn.assign("ptr", f"call noalias ptr @{WORKSPACE_ALLOC}({size_t} {nbytes})",
                             hint=buffer.name)
        self.return_if(self.fn.assign("i1", f"icmp eq ptr {ptr.ref}, null"), ERR_OUT_OF_MEMORY)
        with self.bound(buffer, ptr):
            self.stmt(node.body)
        self.fn.emit(f"call void @{WORKSPACE_FREE}(ptr {ptr.ref}, {size_t} {nbytes})")

    def return_if(self, cond: Value, code) -> None:
        """``if (cond) return code;`` (``code`` is an int or an i32 Value)."""
        fail, ok = self.fn.label("fail"), self.fn.label("ok")
        self.fn.emit(f"br {cond}, label %{fail}, label %{ok}")
        self.fn.start_block(fail)
        self.fn.emit(f"ret i32 {code.ref if isinstance(code, Value) else code}")
        self.fn.start_block(ok)

    # ------------------------------------------------------------------ loops

    def stmt_For(self, node):
        if node.kind == "parallel" and not self.in_parallel:
            self.parallel_for(node)
            return
        lo = self(node.min)
        extent = self(node.extent)
        if extent.const is not None and extent.const <= 0:
            return
        if extent.const == 1:
            with self.bound(node.var, lo):
                self.stmt(node.body)
            return
        end = self._int_binary(E.Add, node.var.dtype, lo, extent)
        self.serial_loop(node.var, lo, end, node.body)

    def serial_loop(self, var: Var, lo: Value, end: Value, body) -> None:
        ty = llvm_type(var.dtype)
        pre = self.fn.block
        header, body_l, latch, exit_l = (self.fn.label(h) for h in ("for", "body", "next", "done"))
        phi, step = self.fn.tmp(var.name), self.fn.tmp(var.name + ".next")
        self.fn.branch(header)
        self.fn.start_block(header)
        self.fn.emit(f"{phi} = phi {ty} [ {lo.ref}, %{pre} ], [ {step}, %{latch} ]")
        cond = self.fn.assign("i1", f"icmp slt {ty} {phi}, {end.ref}")
        self.fn.emit(f"br {cond}, label %{body_l}, label %{exit_l}")
        self.fn.start_block(body_l)
        with self.bound(var, Value(ty, phi)):
            self.stmt(body)
        self.fn.branch(latch)
        self.fn.start_block(latch)
        self.fn.emit(f"{step} = add nsw {ty} {phi}, 1")
        self.fn.branch(header)
        self.fn.start_block(exit_l)

    def parallel_for(self, node) -> None:
        captured = _captures(node.body, self.env)
        lo, extent = self(node.min), self(node.extent)
        index_ty = llvm_type(node.var.dtype)
        # each task's next unclaimed iteration of its share, reset before every launch
        counter = Value(f"[{MAX_TASKS} x i64]", "zeroinitializer")
        fields = [self.env[key] for key in captured] + [lo, extent, counter]
        struct = "{ " + ", ".join(v.type for v in fields) + " }"
        ctx = self.fn.alloca(struct, align=8, hint="ctx")
        for k, value in enumerate(fields):
            slot = self.fn.assign("ptr", f"getelementptr inbounds {struct}, ptr {ctx.ref}, "
                                         f"i32 0, i32 {k}", hint="slot")
            self.fn.emit(f"store {value}, ptr {slot.ref}")
        self.outlined += 1
        body_name = self.module.unique(f"{self.func_name}.par{self.outlined}")
        emit_parallel_body(self.module, body_name, struct, captured, fields, index_ty, node)
        self.module.declare(LAUNCH_SYMBOL, f"declare i32 @{LAUNCH_SYMBOL}(ptr, ptr)")
        rc = self.fn.assign("i32",
                            f"call i32 @{LAUNCH_SYMBOL}(ptr @\"{body_name}\", ptr {ctx.ref})")
        self.return_if(self.fn.assign("i1", f"icmp ne i32 {rc.ref}, 0"), rc)


def _captures(body, env: dict) -> list:
    """Vars and Buffers bound outside ``body`` that it uses, in first-use order."""
    seen: dict = {}

    def visit(n):
        if isinstance(n, Var) and n in env:
            seen.setdefault(n, None)
        elif isinstance(n, (ir.Load, ir.Store, ir.BufferPointer)) and n.buffer in env:
            seen.setdefault(n.buffer, None)
    ir.post_order_visit(body, visit)
    return list(seen)


def _param_decl(key, value_type: str, name: str) -> str:
    if isinstance(key, ir.Buffer):
        return f"ptr noalias align 64 %{name}"
    return f"{value_type} %{name}"


def emit_parallel_body(module: ModuleBuilder, name: str, struct: str, captured: list,
                       fields: list[Value], index_ty: str, node) -> None:
    """The outlined task function and the chunk function it calls."""
    types = [v.type for v in fields]
    names = [f"cap{k}" for k in range(len(captured))]
    chunk_name = module.unique(name + ".chunk")
    params = [_param_decl(key, ty, n) for key, ty, n in zip(captured, types, names)]
    params += [f"{index_ty} %lo", f"{index_ty} %hi", f"{index_ty} %base"]
    chunk = FunctionBuilder(f"define internal i32 @\"{chunk_name}\"({', '.join(params)}) nounwind")
    gen = StmtCodegen(module, chunk, name.split(".")[0], in_parallel=True)
    for key, value, n in zip(captured, fields, names):
        gen.env[key] = Value(value.type, f"%{n}", div=value.div)
    loop_var = Var(node.var.name + ".rel", node.var.dtype)
    body = ir.LetStmt(node.var, E.Add(loop_var, _param_var(gen, "base", node.var.dtype)), node.body)
    gen.serial_loop(loop_var, Value(index_ty, "%lo"), Value(index_ty, "%hi"), body)
    chunk.emit("ret i32 0")
    module.functions.append(chunk.text())

    task = FunctionBuilder(
        f"define internal i32 @\"{name}\"(ptr %ctx, i32 %task, i32 %ntasks) nounwind")
    args = []
    for k, ty in enumerate(types[:-1]):
        slot = task.assign("ptr", f"getelementptr inbounds {struct}, ptr %ctx, i32 0, i32 {k}")
        args.append(task.assign(ty, f"load {ty}, ptr {slot.ref}"))
    counters = task.assign("ptr", f"getelementptr inbounds {struct}, ptr %ctx, i32 0, "
                                  f"i32 {len(types) - 1}")
    *values, lo, extent = args
    ext = task.assign("i64", f"sext {extent} to i64") if index_ty != "i64" else extent
    tasks = task.assign("i64", "sext i32 %ntasks to i64")
    me = task.assign("i64", "sext i32 %task to i64")
    module.declare("llvm.smax.i64", "declare i64 @llvm.smax.i64(i64, i64)")
    module.declare("llvm.smin.i64", "declare i64 @llvm.smin.i64(i64, i64)")
    share, claim, run, next_share, done = (
        task.label(h) for h in ("share", "claim", "run", "next", "done"))
    entry = task.block
    task.branch(share)
    # share: the `visited`-th share after this task's own (its own first)
    task.start_block(share)
    visited = task.tmp("visited")
    step = task.tmp("visited.next")
    task.emit(f"{visited} = phi i64 [0, %{entry}], [{step}, %{next_share}]")
    owner0 = task.assign("i64", f"add i64 {me.ref}, {visited}")
    owner = task.assign("i64", f"urem i64 {owner0.ref}, {tasks.ref}")
    first0 = task.assign("i64", f"mul i64 {ext.ref}, {owner.ref}")
    first = task.assign("i64", f"udiv i64 {first0.ref}, {tasks.ref}")
    after = task.assign("i64", f"add i64 {owner.ref}, 1")
    end0 = task.assign("i64", f"mul i64 {ext.ref}, {after.ref}")
    end = task.assign("i64", f"udiv i64 {end0.ref}, {tasks.ref}")
    size = task.assign("i64", f"sub i64 {end.ref}, {first.ref}")
    grain0 = task.assign("i64", f"udiv i64 {size.ref}, {CHUNKS_PER_THREAD}")
    grain = task.assign("i64", f"call i64 @llvm.smax.i64(i64 {grain0.ref}, i64 1)")
    counter = task.assign("ptr", f"getelementptr inbounds [{MAX_TASKS} x i64], "
                                 f"ptr {counters.ref}, i64 0, i64 {owner.ref}")
    task.branch(claim)
    task.start_block(claim)
    offset = task.assign("i64", f"atomicrmw add ptr {counter.ref}, i64 {grain.ref} monotonic")
    start = task.assign("i64", f"add i64 {first.ref}, {offset.ref}")
    finished = task.assign("i1", f"icmp sge i64 {start.ref}, {end.ref}")
    task.emit(f"br {finished}, label %{next_share}, label %{run}")
    task.start_block(run)
    stop0 = task.assign("i64", f"add i64 {start.ref}, {grain.ref}")
    stop = task.assign("i64", f"call i64 @llvm.smin.i64(i64 {stop0.ref}, i64 {end.ref})")
    if index_ty != "i64":
        start = task.assign(index_ty, f"trunc {start} to {index_ty}")
        stop = task.assign(index_ty, f"trunc {stop} to {index_ty}")
    call_args = ", ".join([str(v) for v in values] + [str(start), str(stop), str(lo)])
    rc = task.assign("i32", f"call i32 @\"{chunk_name}\"({call_args})")
    failed = task.assign("i1", f"icmp ne i32 {rc.ref}, 0")
    fail = task.label("fail")
    task.emit(f"br {failed}, label %{fail}, label %{claim}")
    task.start_block(fail)
    task.emit(f"ret {rc}")
    task.start_block(next_share)
    task.emit(f"{step} = add i64 {visited}, 1")
    more = task.assign("i1", f"icmp ult i64 {step}, {tasks.ref}")
    task.emit(f"br {more}, label %{share}, label %{done}")
    task.start_block(done)
    task.emit("ret i32 0")
    module.functions.append(task.text())


def _param_var(gen: StmtCodegen, name: str, dtype: str) -> Var:
    var = Var(name, dtype)
    gen.env[var] = Value(llvm_type(dtype), f"%{name}")
    return var


def emit_primfunc(module: ModuleBuilder, func) -> str:
    """Add ``func``'s implementation and entry point to ``module``; return the entry symbol."""
    name = _symbol_name(func.name)
    impl_name = module.unique(f"{name}.impl")
    params, arg_types = [], []
    for k, p in enumerate(func.params):
        if isinstance(p, ir.Buffer):
            params.append(f"ptr noalias align 64 %arg{k}")
            arg_types.append("ptr")
        elif isinstance(p, Var):
            if dtype_lanes(p.dtype) != 1:
                raise CodegenError(f"scalar parameter {p.name} must have a scalar dtype")
            params.append(f"{llvm_type(p.dtype)} %arg{k}")
            arg_types.append(llvm_type(p.dtype))
        else:
            raise CodegenError(f"parameter {k} of {name} is neither a Buffer nor a Var")
    impl = FunctionBuilder(f"define internal i32 @\"{impl_name}\"({', '.join(params)}) nounwind")
    gen = StmtCodegen(module, impl, name)
    for k, (p, ty) in enumerate(zip(func.params, arg_types)):
        gen.env[p] = Value(ty, f"%arg{k}")
    gen.stmt(func.body)
    impl.emit("ret i32 0")
    module.functions.append(impl.text())

    symbol = f"__kernelrpc_fn_{name}"
    entry = FunctionBuilder(f"define i32 @{symbol}(ptr %args) nounwind")
    values = []
    for k, p in enumerate(func.params):
        slot = entry.assign("ptr", f"getelementptr inbounds ptr, ptr %args, i64 {k}")
        pointer = entry.assign("ptr", f"load ptr, ptr {slot.ref}, "
                                      f"align {module.pointer_bytes}")
        if isinstance(p, ir.Buffer):
            values.append(pointer)
            continue
        mty = memory_type(p.dtype)
        raw = entry.assign(mty, f"load {mty}, ptr {pointer.ref}, align 8")
        if mty != llvm_type(p.dtype):
            raw = entry.assign(llvm_type(p.dtype), f"trunc {raw} to i1")
        values.append(raw)
    rc = entry.assign("i32", f"call i32 @\"{impl_name}\"({', '.join(map(str, values))})")
    entry.emit(f"ret {rc}")
    module.functions.append(entry.text())
    return symbol
