"""The per-module native runtime, emitted as LLVM IR text.

Every exported module carries its own copy (docs/module-format.md):

* ``__kernelrpc_time``: ``clock_gettime(CLOCK_MONOTONIC)`` around ``number`` calls.
* ``__kernelrpc_cache_flush``: ``clflush`` per line (x86-64 only).
* ``__kernelrpc_set_num_threads`` and the thread pool behind
  ``__kernelrpc_parallel_launch(body, ctx)``, which runs
  ``i32 body(ptr ctx, i32 task, i32 ntasks)`` for ``task`` in ``0..ntasks-1``.
* ``__kernelrpc_metadata``: the JSON record.

The pool is created on first use and kept for the life of the process. Workers
spin on a generation counter for a short while after each job (launches in a
timing loop then cost well under a microsecond) and then sleep on a pthread
condition variable, so an idle pool burns no CPU. The pool holds exactly
``threads - 1`` workers (``__kernelrpc_set_num_threads`` starts or stops and
joins workers), every worker takes part in every job, and the caller waits for
all of them: no late worker can mistake the next job for the one it woke up
for, and no idle extra thread competes for a core. A launch from inside a job
or from a second thread while one runs falls back to ``body(ctx, 0, 1)`` on the
calling thread. After ``fork()`` the child starts with no workers and creates
them again on first use. The default size is the number of cores in the
affinity mask (overridden by ``KERNELRPC_NUM_THREADS`` or ``TVM_NUM_THREADS``).
"""
from __future__ import annotations

from ..target import Target

#: Workers beyond the calling thread (the caller always runs task 0).
MAX_WORKERS = 63
#: Spin iterations (each with a pause hint) before a worker or the caller sleeps;
#: roughly 0.1-1 ms, long enough to bridge back-to-back launches in a timing loop.
SPIN_ITERATIONS = 20000
_SC_NPROCESSORS_ONLN = 84  # Linux (glibc and musl)
_AFFINITY_WORDS = 16  # a 1024-cpu mask, glibc's cpu_set_t
_CLOCK_MONOTONIC = 1
_PTHREAD_OBJECT_BYTES = 64  # >= sizeof(pthread_mutex_t), sizeof(pthread_cond_t) on Linux ABIs
_NO_QUIT = 1 << 30  # "no worker quits after this job"

LAUNCH_SYMBOL = "__kernelrpc_parallel_launch"


def pause_ir(arch: str) -> tuple[str, str]:
    """(declaration, call) of the spin-wait hint for ``arch``."""
    if arch in ("x86_64", "i386", "i686"):
        return "declare void @llvm.x86.sse2.pause()", "call void @llvm.x86.sse2.pause()"
    if arch.startswith("aarch64"):
        return "declare void @llvm.aarch64.hint(i32)", "call void @llvm.aarch64.hint(i32 1)"
    if arch.startswith("arm") or arch.startswith("thumb"):
        return "declare void @llvm.arm.hint(i32)", "call void @llvm.arm.hint(i32 1)"
    return "", ""


def _flush_ir(arch: str) -> str:
    """``__kernelrpc_cache_flush`` where the ISA has a user-mode flush LLVM exposes (x86-64).

    Elsewhere the symbol is left out (it is optional) and the runtime evicts by
    writing a scratch buffer; AArch64's ``dc civac`` would need inline assembly,
    which llvmlite cannot assemble for a foreign target.
    """
    if arch != "x86_64":
        return ""
    line_op = "call void @llvm.x86.sse2.clflush(ptr %line)"
    fence = "call void @llvm.x86.sse2.mfence()"
    decls = "declare void @llvm.x86.sse2.clflush(ptr)\ndeclare void @llvm.x86.sse2.mfence()"
    return f"""{decls}
define void @__kernelrpc_cache_flush(ptr %ptr, i64 %nbytes) nounwind {{
entry:
  %start = ptrtoint ptr %ptr to i64
  %first = and i64 %start, -64
  %end = add i64 %start, %nbytes
  %empty = icmp sle i64 %nbytes, 0
  br i1 %empty, label %done, label %loop
loop:
  %addr = phi i64 [ %first, %entry ], [ %next, %loop ]
  %line = inttoptr i64 %addr to ptr
  {line_op}
  %next = add i64 %addr, 64
  %more = icmp ult i64 %next, %end
  br i1 %more, label %loop, label %done
done:
  {fence}
  ret void
}}
"""


def _string_constant(name: str, text: str) -> str:
    data = text.encode("utf-8") + b"\0"
    body = "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\{b:02X}" for b in data)
    return f'@{name} = private unnamed_addr constant [{len(data)} x i8] c"{body}", align 1'


def runtime_ir(target: Target, metadata_json: str) -> str:
    """LLVM IR text of the runtime for ``target`` with the given metadata document."""
    pause_decl, pause = pause_ir(target.arch)
    word = "i64" if target.pointer_bits == 64 else "i32"  # pthread_t, time_t, long
    widen, widen_to = ("add i64", ", 0") if word == "i64" else ("sext i32", " to i64")
    obj = f"[{_PTHREAD_OBJECT_BYTES} x i8] zeroinitializer, align 16"
    return f"""
{pause_decl}
declare i32 @clock_gettime(i32, ptr)
declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_join({word}, ptr)
declare i32 @pthread_mutex_lock(ptr)
declare i32 @pthread_mutex_unlock(ptr)
declare i32 @pthread_cond_wait(ptr, ptr)
declare i32 @pthread_cond_broadcast(ptr)
declare i32 @pthread_atfork(ptr, ptr, ptr)
declare i32 @sched_yield()
declare {word} @sysconf(i32)
declare i32 @sched_getaffinity(i32, {word}, ptr)
declare i64 @llvm.ctpop.i64(i64)
declare ptr @getenv(ptr)
declare i32 @atoi(ptr)
declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)

{_string_constant("__krpc_meta", metadata_json)}
{_string_constant("__krpc_env1", "KERNELRPC_NUM_THREADS")}
{_string_constant("__krpc_env2", "TVM_NUM_THREADS")}

@__krpc_mutex = internal global {obj}
@__krpc_cv_work = internal global {obj}
@__krpc_cv_done = internal global {obj}
@__krpc_threads = internal global [{MAX_WORKERS} x {word}] zeroinitializer
@__krpc_seen_init = internal global [{MAX_WORKERS} x i32] zeroinitializer
@__krpc_state = internal global i32 0      ; 0 none, 1 initialising, 2 ready
@__krpc_nworkers = internal global i32 0
@__krpc_nthreads = internal global i32 1
@__krpc_gen = internal global i32 0
@__krpc_sleepers = internal global i32 0
@__krpc_pending = internal global i32 0
@__krpc_waiter = internal global i32 0
@__krpc_busy = internal global i32 0
@__krpc_job_fn = internal global ptr null
@__krpc_job_ctx = internal global ptr null
@__krpc_job_n = internal global i32 0
@__krpc_job_err = internal global i32 0
@__krpc_job_quit = internal global i32 {_NO_QUIT}  ; workers with index >= this exit after the job

define ptr @__kernelrpc_metadata() nounwind {{
  ret ptr @__krpc_meta
}}

define i64 @__kernelrpc_time(ptr %fn, ptr %args, i64 %number) nounwind {{
entry:
  %t0 = alloca [2 x {word}], align 8
  %t1 = alloca [2 x {word}], align 8
  %c0 = call i32 @clock_gettime(i32 {_CLOCK_MONOTONIC}, ptr %t0)
  %any = icmp sgt i64 %number, 0
  br i1 %any, label %loop, label %stop
loop:
  %i = phi i64 [ 0, %entry ], [ %inext, %ok ]
  %rc = call i32 %fn(ptr %args)
  %bad = icmp ne i32 %rc, 0
  br i1 %bad, label %fail, label %ok
ok:
  %inext = add i64 %i, 1
  %more = icmp slt i64 %inext, %number
  br i1 %more, label %loop, label %stop
fail:
  %rc64 = sext i32 %rc to i64
  %negrc = sub i64 0, %rc64
  %isneg = icmp slt i64 %rc64, 0
  %out = select i1 %isneg, i64 %rc64, i64 %negrc
  ret i64 %out
stop:
  %c1 = call i32 @clock_gettime(i32 {_CLOCK_MONOTONIC}, ptr %t1)
  %s0p = getelementptr [2 x {word}], ptr %t0, i32 0, i32 0
  %n0p = getelementptr [2 x {word}], ptr %t0, i32 0, i32 1
  %s1p = getelementptr [2 x {word}], ptr %t1, i32 0, i32 0
  %n1p = getelementptr [2 x {word}], ptr %t1, i32 0, i32 1
  %s0w = load {word}, ptr %s0p
  %n0w = load {word}, ptr %n0p
  %s1w = load {word}, ptr %s1p
  %n1w = load {word}, ptr %n1p
  %s0 = {widen} %s0w{widen_to}
  %n0 = {widen} %n0w{widen_to}
  %s1 = {widen} %s1w{widen_to}
  %n1 = {widen} %n1w{widen_to}
  %ds = sub i64 %s1, %s0
  %dn = sub i64 %n1, %n0
  %dsns = mul i64 %ds, 1000000000
  %elapsed = add i64 %dsns, %dn
  %negative = icmp slt i64 %elapsed, 0
  %result = select i1 %negative, i64 0, i64 %elapsed
  ret i64 %result
}}

{_flush_ir(target.arch)}

define internal void @__krpc_lock() nounwind {{
  %r = call i32 @pthread_mutex_lock(ptr @__krpc_mutex)
  ret void
}}

define internal void @__krpc_unlock() nounwind {{
  %r = call i32 @pthread_mutex_unlock(ptr @__krpc_mutex)
  ret void
}}

; Wait until *%word != %value: spin first, then sleep on %cv with %count raised.
define internal void @__krpc_wait_change(ptr %word, i32 %value, ptr %cv, ptr %count) nounwind {{
entry:
  br label %spin
spin:
  %i = phi i32 [ 0, %entry ], [ %inext, %again ]
  %cur = load atomic i32, ptr %word acquire, align 4
  %changed = icmp ne i32 %cur, %value
  br i1 %changed, label %done, label %again
again:
  {pause}
  %inext = add i32 %i, 1
  %spinning = icmp slt i32 %inext, {SPIN_ITERATIONS}
  br i1 %spinning, label %spin, label %sleep
sleep:
  call void @__krpc_lock()
  %old = atomicrmw add ptr %count, i32 1 seq_cst
  br label %check
check:
  %now = load atomic i32, ptr %word seq_cst, align 4
  %still = icmp eq i32 %now, %value
  br i1 %still, label %block, label %woken
block:
  %w = call i32 @pthread_cond_wait(ptr %cv, ptr @__krpc_mutex)
  br label %check
woken:
  %old2 = atomicrmw sub ptr %count, i32 1 seq_cst
  call void @__krpc_unlock()
  br label %done
done:
  ret void
}}

; Wake sleepers of __krpc_wait_change after the watched word changed (seq_cst).
define internal void @__krpc_wake(ptr %cv, ptr %count) nounwind {{
entry:
  %n = load atomic i32, ptr %count seq_cst, align 4
  %some = icmp ne i32 %n, 0
  br i1 %some, label %wake, label %done
wake:
  call void @__krpc_lock()
  %b = call i32 @pthread_cond_broadcast(ptr %cv)
  call void @__krpc_unlock()
  br label %done
done:
  ret void
}}

define internal ptr @__krpc_worker(ptr %arg) nounwind {{
entry:
  %tid64 = ptrtoint ptr %arg to i64
  %tid = trunc i64 %tid64 to i32
  %slot = getelementptr [{MAX_WORKERS} x i32], ptr @__krpc_seen_init, i32 0, i32 %tid
  %seen0 = load i32, ptr %slot
  %task = add i32 %tid, 1
  br label %loop
loop:
  %seen = phi i32 [ %seen0, %entry ], [ %gen, %next ]
  call void @__krpc_wait_change(ptr @__krpc_gen, i32 %seen, ptr @__krpc_cv_work, ptr @__krpc_sleepers)
  %gen = load atomic i32, ptr @__krpc_gen acquire, align 4
  %n = load i32, ptr @__krpc_job_n
  %quit = load i32, ptr @__krpc_job_quit
  %mine = icmp slt i32 %task, %n
  br i1 %mine, label %run, label %ack
run:
  %fn = load ptr, ptr @__krpc_job_fn
  %ctx = load ptr, ptr @__krpc_job_ctx
  %rc = call i32 %fn(ptr %ctx, i32 %task, i32 %n)
  %bad = icmp ne i32 %rc, 0
  br i1 %bad, label %record, label %ack
record:
  %x = cmpxchg ptr @__krpc_job_err, i32 0, i32 %rc seq_cst seq_cst
  br label %ack
ack:
  %left = atomicrmw sub ptr @__krpc_pending, i32 1 seq_cst
  %last = icmp eq i32 %left, 1
  br i1 %last, label %notify, label %next
notify:
  call void @__krpc_wake(ptr @__krpc_cv_done, ptr @__krpc_waiter)
  br label %next
next:
  %leave = icmp sge i32 %tid, %quit
  br i1 %leave, label %exit, label %loop
exit:
  ret ptr null
}}

; Publish a job to every worker (caller holds __krpc_busy).
define internal void @__krpc_publish(ptr %fn, ptr %ctx, i32 %n, i32 %quit) nounwind {{
  store ptr %fn, ptr @__krpc_job_fn
  store ptr %ctx, ptr @__krpc_job_ctx
  store i32 %n, ptr @__krpc_job_n
  store i32 %quit, ptr @__krpc_job_quit
  store i32 0, ptr @__krpc_job_err
  %nw = load i32, ptr @__krpc_nworkers
  store atomic i32 %nw, ptr @__krpc_pending seq_cst, align 4
  %g = atomicrmw add ptr @__krpc_gen, i32 1 seq_cst
  call void @__krpc_wake(ptr @__krpc_cv_work, ptr @__krpc_sleepers)
  ret void
}}

; Wait until every worker has acknowledged the published job.
define internal void @__krpc_join() nounwind {{
entry:
  br label %join
join:
  %left = load atomic i32, ptr @__krpc_pending acquire, align 4
  %alldone = icmp eq i32 %left, 0
  br i1 %alldone, label %done, label %wait
wait:
  call void @__krpc_wait_change(ptr @__krpc_pending, i32 %left, ptr @__krpc_cv_done, ptr @__krpc_waiter)
  br label %join
done:
  ret void
}}

define internal i32 @__krpc_noop(ptr %ctx, i32 %task, i32 %n) nounwind {{
  ret i32 0
}}

; Stop and join the workers with index >= %keep (caller holds __krpc_busy).
define internal void @__krpc_shrink(i32 %keep) nounwind {{
entry:
  %have = load i32, ptr @__krpc_nworkers
  %more = icmp slt i32 %keep, %have
  br i1 %more, label %stop, label %done
stop:
  call void @__krpc_publish(ptr @__krpc_noop, ptr null, i32 1, i32 %keep)
  call void @__krpc_join()
  store i32 {_NO_QUIT}, ptr @__krpc_job_quit
  br label %reap
reap:
  %i = phi i32 [ %keep, %stop ], [ %inext, %reap ]
  %th = getelementptr [{MAX_WORKERS} x {word}], ptr @__krpc_threads, i32 0, i32 %i
  %handle = load {word}, ptr %th
  %j = call i32 @pthread_join({word} %handle, ptr null)
  %inext = add i32 %i, 1
  %again = icmp slt i32 %inext, %have
  br i1 %again, label %reap, label %shrunk
shrunk:
  store i32 %keep, ptr @__krpc_nworkers
  br label %done
done:
  ret void
}}

; Grow the pool to %want workers (caller holds __krpc_busy or is the initialiser).
define internal void @__krpc_grow(i32 %want) nounwind {{
entry:
  %tidp = alloca {word}, align 8
  %capped = call i32 @llvm.smin.i32(i32 %want, i32 {MAX_WORKERS})
  br label %loop
loop:
  %have = load i32, ptr @__krpc_nworkers
  %need = icmp slt i32 %have, %capped
  br i1 %need, label %create, label %done
create:
  %g = load atomic i32, ptr @__krpc_gen acquire, align 4
  %slot = getelementptr [{MAX_WORKERS} x i32], ptr @__krpc_seen_init, i32 0, i32 %have
  store i32 %g, ptr %slot
  %th = getelementptr [{MAX_WORKERS} x {word}], ptr @__krpc_threads, i32 0, i32 %have
  %arg64 = zext i32 %have to i64
  %arg = inttoptr i64 %arg64 to ptr
  %rc = call i32 @pthread_create(ptr %th, ptr null, ptr @__krpc_worker, ptr %arg)
  %failed = icmp ne i32 %rc, 0
  br i1 %failed, label %done, label %created
created:
  %have1 = add i32 %have, 1
  store atomic i32 %have1, ptr @__krpc_nworkers release, align 4
  br label %loop
done:
  ret void
}}
declare i32 @llvm.smin.i32(i32, i32)
declare i32 @llvm.smax.i32(i32, i32)

define internal i32 @__krpc_env_threads() nounwind {{
entry:
  %v1 = call ptr @getenv(ptr @__krpc_env1)
  %has1 = icmp ne ptr %v1, null
  br i1 %has1, label %parse, label %try2
try2:
  %v2 = call ptr @getenv(ptr @__krpc_env2)
  %has2 = icmp ne ptr %v2, null
  br i1 %has2, label %parse, label %none
parse:
  %v = phi ptr [ %v1, %entry ], [ %v2, %try2 ]
  %n = call i32 @atoi(ptr %v)
  ret i32 %n
none:
  ret i32 0
}}

; The cores this thread may run on (its affinity mask, as taskset/cpusets set it),
; else the online cores.
define internal i32 @__krpc_usable_cores() nounwind {{
entry:
  %mask = alloca [{_AFFINITY_WORDS} x i64], align 8
  call void @llvm.memset.p0.i64(ptr %mask, i8 0, i64 {_AFFINITY_WORDS * 8}, i1 false)
  %rc = call i32 @sched_getaffinity(i32 0, {word} {_AFFINITY_WORDS * 8}, ptr %mask)
  %ok = icmp eq i32 %rc, 0
  br i1 %ok, label %count, label %online
count:
  %i = phi i32 [ 0, %entry ], [ %inext, %count ]
  %acc = phi i64 [ 0, %entry ], [ %sum, %count ]
  %wp = getelementptr [{_AFFINITY_WORDS} x i64], ptr %mask, i32 0, i32 %i
  %w = load i64, ptr %wp
  %bits = call i64 @llvm.ctpop.i64(i64 %w)
  %sum = add i64 %acc, %bits
  %inext = add i32 %i, 1
  %more = icmp slt i32 %inext, {_AFFINITY_WORDS}
  br i1 %more, label %count, label %counted
counted:
  %some = icmp sgt i64 %sum, 0
  %n = trunc i64 %sum to i32
  br i1 %some, label %done, label %online
online:
  %c = call {word} @sysconf(i32 {_SC_NPROCESSORS_ONLN})
  %c32 = trunc {word} %c to i32
  br label %done
done:
  %result = phi i32 [ %n, %counted ], [ %c32, %online ]
  ret i32 %result
}}

; 0 (or less) means all usable cores; the result is in [1, MAX_WORKERS + 1].
define internal i32 @__krpc_resolve_threads(i32 %n) nounwind {{
entry:
  %auto = icmp sle i32 %n, 0
  br i1 %auto, label %cores, label %clamp
cores:
  %c32 = call i32 @__krpc_usable_cores()
  br label %clamp
clamp:
  %v = phi i32 [ %n, %entry ], [ %c32, %cores ]
  %lo = call i32 @llvm.smax.i32(i32 %v, i32 1)
  %hi = call i32 @llvm.smin.i32(i32 %lo, i32 {MAX_WORKERS + 1})
  ret i32 %hi
}}

define internal void @__krpc_after_fork_child() nounwind {{
  call void @llvm.memset.p0.i64(ptr @__krpc_mutex, i8 0, i64 {_PTHREAD_OBJECT_BYTES}, i1 false)
  call void @llvm.memset.p0.i64(ptr @__krpc_cv_work, i8 0, i64 {_PTHREAD_OBJECT_BYTES}, i1 false)
  call void @llvm.memset.p0.i64(ptr @__krpc_cv_done, i8 0, i64 {_PTHREAD_OBJECT_BYTES}, i1 false)
  store i32 0, ptr @__krpc_nworkers
  store i32 0, ptr @__krpc_sleepers
  store i32 0, ptr @__krpc_waiter
  store i32 0, ptr @__krpc_pending
  store i32 0, ptr @__krpc_busy
  store i32 1, ptr @__krpc_nthreads
  store atomic i32 0, ptr @__krpc_state release, align 4
  ret void
}}

define internal void @__krpc_ensure_pool() nounwind {{
entry:
  %s = load atomic i32, ptr @__krpc_state acquire, align 4
  %ready = icmp eq i32 %s, 2
  br i1 %ready, label %done, label %claim
claim:
  %x = cmpxchg ptr @__krpc_state, i32 0, i32 1 seq_cst seq_cst
  %won = extractvalue {{ i32, i1 }} %x, 1
  br i1 %won, label %init, label %waitready
init:
  %first = load atomic i32, ptr @__krpc_gen acquire, align 4
  %isfirst = icmp eq i32 %first, 0
  br i1 %isfirst, label %register, label %sized
register:
  ; gen starts at 1 after the first init so that a forked child does not re-register
  store atomic i32 1, ptr @__krpc_gen release, align 4
  %af = call i32 @pthread_atfork(ptr null, ptr null, ptr @__krpc_after_fork_child)
  br label %sized
sized:
  %env = call i32 @__krpc_env_threads()
  %n = call i32 @__krpc_resolve_threads(i32 %env)
  %w = sub i32 %n, 1
  call void @__krpc_grow(i32 %w)
  %have = load i32, ptr @__krpc_nworkers
  %total = add i32 %have, 1
  store i32 %total, ptr @__krpc_nthreads
  store atomic i32 2, ptr @__krpc_state release, align 4
  br label %done
waitready:
  %y = call i32 @sched_yield()
  %s2 = load atomic i32, ptr @__krpc_state acquire, align 4
  %ready2 = icmp eq i32 %s2, 2
  br i1 %ready2, label %done, label %waitready
done:
  ret void
}}

define hidden i32 @{LAUNCH_SYMBOL}(ptr %fn, ptr %ctx) nounwind {{
entry:
  call void @__krpc_ensure_pool()
  %n = load i32, ptr @__krpc_nthreads
  %multi = icmp sgt i32 %n, 1
  br i1 %multi, label %claim, label %serial
claim:
  %x = cmpxchg ptr @__krpc_busy, i32 0, i32 1 acquire monotonic
  %won = extractvalue {{ i32, i1 }} %x, 1
  br i1 %won, label %launch, label %serial
launch:
  call void @__krpc_publish(ptr %fn, ptr %ctx, i32 %n, i32 {_NO_QUIT})
  %rc0 = call i32 %fn(ptr %ctx, i32 0, i32 %n)
  call void @__krpc_join()
  %err = load i32, ptr @__krpc_job_err
  %ok0 = icmp eq i32 %rc0, 0
  %rc = select i1 %ok0, i32 %err, i32 %rc0
  store atomic i32 0, ptr @__krpc_busy release, align 4
  ret i32 %rc
serial:
  %rcs = call i32 %fn(ptr %ctx, i32 0, i32 1)
  ret i32 %rcs
}}

define i32 @__kernelrpc_set_num_threads(i32 %want) nounwind {{
entry:
  call void @__krpc_ensure_pool()
  br label %claim
claim:
  %x = cmpxchg ptr @__krpc_busy, i32 0, i32 1 acquire monotonic
  %won = extractvalue {{ i32, i1 }} %x, 1
  br i1 %won, label %set, label %yield
yield:
  %y = call i32 @sched_yield()
  br label %claim
set:
  %n = call i32 @__krpc_resolve_threads(i32 %want)
  %w = sub i32 %n, 1
  call void @__krpc_shrink(i32 %w)
  call void @__krpc_grow(i32 %w)
  %have = load i32, ptr @__krpc_nworkers
  %avail = add i32 %have, 1
  %use = call i32 @llvm.smin.i32(i32 %n, i32 %avail)
  store i32 %use, ptr @__krpc_nthreads
  store atomic i32 0, ptr @__krpc_busy release, align 4
  ret i32 %use
}}
"""
