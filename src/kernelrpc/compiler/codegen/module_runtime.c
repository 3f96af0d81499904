/* The native runtime every kernelrpc module carries (docs/module-format.md).
 *
 * Compiled for each target by the toolchain that links the module (the host cc,
 * a cross gcc or `zig cc -target ...`), so every struct layout and constant comes
 * from the target's own C library headers. It must also compile as C++ (a TVM
 * `fcompile=` hook may hand it to g++).
 *
 * * __kernelrpc_time: clock_gettime(CLOCK_MONOTONIC) around `number` calls.
 * * __kernelrpc_time_repeats: `repeat` such batches in one call, each timed on its own
 *   (a time_evaluator whose repeats are one batch each, with nothing between them), in
 *   stretches of about `budget_ns` so that the caller can take a signal between them.
 * * __kernelrpc_cache_flush: clflush (x86-64) or dc civac (AArch64) per line;
 *   left out elsewhere (the symbol is optional, the runtime then evicts by
 *   writing a scratch buffer).
 * * __kernelrpc_set_num_threads and the thread pool behind
 *   __kernelrpc_parallel_launch(body, ctx), which runs
 *   int32_t body(void *ctx, int32_t task, int32_t ntasks) for task in 0..ntasks-1.
 *
 * The pool is created on first use and kept for the life of the process. Workers
 * spin on a generation counter for a short while after each job (launches in a
 * timing loop then cost well under a microsecond) and then sleep on a condition
 * variable, so an idle pool burns no CPU. The pool holds exactly threads - 1
 * workers, every worker takes part in every job, and the caller waits for all of
 * them: no late worker can mistake the next job for the one it woke up for. A
 * launch from inside a job or from a second thread while one runs falls back to
 * body(ctx, 0, 1) on the calling thread. After fork() the child starts with no
 * workers and creates them again on first use. The default size is the number of
 * cores in the affinity mask (overridden by KERNELRPC_NUM_THREADS or
 * TVM_NUM_THREADS).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KRPC_EXPORT __attribute__((visibility("default")))
#define KRPC_HIDDEN __attribute__((visibility("hidden")))

/* Workers beyond the calling thread (the caller always runs task 0). */
#define KRPC_MAX_WORKERS 63
/* Spin iterations (each with a pause hint) before a worker or the caller sleeps:
 * roughly 0.1-1 ms, long enough to bridge back-to-back launches in a timing loop. */
#define KRPC_SPIN_ITERATIONS 20000
#define KRPC_YIELD_EVERY 256
/* "No worker quits after this job." */
#define KRPC_NO_QUIT (1 << 30)

typedef int32_t (*krpc_task_fn)(void *ctx, int32_t task, int32_t ntasks);
typedef int32_t (*krpc_packed_fn)(void **args);

static inline void krpc_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield" ::: "memory");
#elif defined(__arm__) && defined(__ARM_ARCH) && __ARM_ARCH >= 7
    __asm__ __volatile__("yield" ::: "memory");
#elif defined(__riscv)
    __asm__ __volatile__(".4byte 0x0100000f" ::: "memory"); /* Zihintpause `pause`, a hint */
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

#define LOAD(p, order) __atomic_load_n((p), (order))
#define STORE(p, v, order) __atomic_store_n((p), (v), (order))
#define ACQ __ATOMIC_ACQUIRE
#define REL __ATOMIC_RELEASE
#define SEQ __ATOMIC_SEQ_CST

/* ------------------------------------------------------------------ timing */

/* One batch: the elapsed nanoseconds (>= 0) of `number` calls, or -code of a failing call. */
static inline int64_t krpc_time_batch(krpc_packed_fn fn, void **args, int64_t number) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t i = 0; i < number; ++i) {
        int32_t rc = fn(args);
        if (rc != 0) {
            int64_t code = rc;
            return code < 0 ? code : -code;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int64_t elapsed = ((int64_t)t1.tv_sec - (int64_t)t0.tv_sec) * 1000000000
                      + ((int64_t)t1.tv_nsec - (int64_t)t0.tv_nsec);
    return elapsed < 0 ? 0 : elapsed;
}

KRPC_EXPORT int64_t __kernelrpc_time(krpc_packed_fn fn, void **args, int64_t number) {
    return krpc_time_batch(fn, args, number);
}

/* Up to `repeat` batches of `number` calls, batch i's nanoseconds in elapsed_ns[i], back to
 * back; it returns after the batch that brings their time to `budget_ns` or more (so that the
 * caller can take a signal), with the number of batches run (>= 1), or -code of a failing call
 * (the batches before it are written). */
KRPC_EXPORT int64_t __kernelrpc_time_repeats(krpc_packed_fn fn, void **args, int64_t number,
                                             int64_t repeat, int64_t *elapsed_ns,
                                             int64_t budget_ns) {
    int64_t spent = 0;
    for (int64_t i = 0; i < repeat; ++i) {
        int64_t elapsed = krpc_time_batch(fn, args, number);
        if (elapsed < 0)
            return elapsed;
        elapsed_ns[i] = elapsed;
        spent += elapsed;
        if (spent >= budget_ns)
            return i + 1;
    }
    return repeat;
}

/* ------------------------------------------------------------------ cache flush */

#if defined(__x86_64__)
KRPC_EXPORT void __kernelrpc_cache_flush(const void *ptr, int64_t nbytes) {
    if (nbytes <= 0)
        return;
    uintptr_t end = (uintptr_t)ptr + (uintptr_t)nbytes;
    for (uintptr_t line = (uintptr_t)ptr & ~(uintptr_t)63; line < end; line += 64)
        __builtin_ia32_clflush((const void *)line);
    __builtin_ia32_mfence();
}
#elif defined(__aarch64__)
/* dc civac (clean and invalidate to the point of coherency) is allowed at EL0 on Linux. */
KRPC_EXPORT void __kernelrpc_cache_flush(const void *ptr, int64_t nbytes) {
    if (nbytes <= 0)
        return;
    uint64_t ctr;
    __asm__ __volatile__("mrs %0, ctr_el0" : "=r"(ctr));
    uintptr_t step = (uintptr_t)4 << ((ctr >> 16) & 0xf); /* DminLine: log2 of words */
    uintptr_t end = (uintptr_t)ptr + (uintptr_t)nbytes;
    for (uintptr_t line = (uintptr_t)ptr & ~(step - 1); line < end; line += step)
        __asm__ __volatile__("dc civac, %0" : : "r"(line) : "memory");
    __asm__ __volatile__("dsb ish" ::: "memory");
}
#endif

/* ------------------------------------------------------------------ thread pool */

static int32_t krpc_pool_lock;          /* the workspace pool's (below) */
static pthread_mutex_t krpc_mutex = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t krpc_cv_work = PTHREAD_COND_INITIALIZER;
static pthread_cond_t krpc_cv_done = PTHREAD_COND_INITIALIZER;
static pthread_t krpc_threads[KRPC_MAX_WORKERS];
static int32_t krpc_seen_init[KRPC_MAX_WORKERS];

/* The state every launch touches, together on one cache line (as scattered statics in
 * .data and .bss, a launch moved measurably more lines between cores). */
static struct {
    int32_t state;                  /* 0 none, 1 initialising, 2 ready */
    int32_t nworkers;
    int32_t nthreads;
    int32_t gen;
    int32_t sleepers;
    int32_t pending;
    int32_t waiter;
    int32_t busy;
    krpc_task_fn job_fn;
    void *job_ctx;
    int32_t job_n;
    int32_t job_err;
    int32_t job_quit;               /* workers with index >= this exit after the job */
    int32_t caller_cpu;             /* where the job's caller ran when it published it */
} krpc __attribute__((aligned(64))) = {0, 0, 1, 0, 0, 0, 0, 0, NULL, NULL, 0, 0, KRPC_NO_QUIT,
                                        -1};

/* Wait until *word != value: spin first, then sleep on cv with *count raised. The spin
 * yields the CPU every KRPC_YIELD_EVERY pauses: a thread the scheduler put on this CPU (a
 * worker woken or created on its caller's CPU, before the balancer moves it) would otherwise
 * wait for the spinner's time slice, a millisecond or more a launch. */
static int krpc_wait_change(int32_t *word, int32_t value, pthread_cond_t *cv, int32_t *count) {
    for (int i = 0; i < KRPC_SPIN_ITERATIONS; ++i) {
        if (LOAD(word, ACQ) != value)
            return 0;
        if (i % KRPC_YIELD_EVERY == KRPC_YIELD_EVERY - 1)
            sched_yield();
        else
            krpc_pause();
    }
    pthread_mutex_lock(&krpc_mutex);
    __atomic_fetch_add(count, 1, SEQ);
    while (LOAD(word, SEQ) == value)
        pthread_cond_wait(cv, &krpc_mutex);
    __atomic_fetch_sub(count, 1, SEQ);
    pthread_mutex_unlock(&krpc_mutex);
    return 1;
}

/* A worker woken from its sleep on the CPU its caller runs on moves off it at once: the
 * scheduler wakes a thread where its waker runs and moves it only at its next balancing,
 * milliseconds later, and until then the two take turns on one CPU (a 2-thread network's
 * first runs after a pause took 2.7 times as long). Narrowing the thread's mask to the other
 * CPUs migrates it now; the full mask is given back right after (it stays where it went). */
static void krpc_leave_cpu(int32_t cpu) {
    if (cpu < 0 || sched_getcpu() != cpu)
        return;
    cpu_set_t all, others;
    if (sched_getaffinity(0, sizeof all, &all) != 0)
        return;
    others = all;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) > 0 && sched_setaffinity(0, sizeof others, &others) == 0)
        sched_setaffinity(0, sizeof all, &all);
}

/* Wake sleepers of krpc_wait_change after the watched word changed (seq_cst). */
static void krpc_wake(pthread_cond_t *cv, int32_t *count) {
    if (LOAD(count, SEQ) != 0) {
        pthread_mutex_lock(&krpc_mutex);
        pthread_cond_broadcast(cv);
        pthread_mutex_unlock(&krpc_mutex);
    }
}

static void *krpc_worker(void *arg) {
    int32_t tid = (int32_t)(intptr_t)arg;
    int32_t task = tid + 1;
    int32_t seen = krpc_seen_init[tid];
    for (;;) {
        if (krpc_wait_change(&krpc.gen, seen, &krpc_cv_work, &krpc.sleepers))
            krpc_leave_cpu(LOAD(&krpc.caller_cpu, __ATOMIC_RELAXED));
        seen = LOAD(&krpc.gen, ACQ);
        int32_t n = krpc.job_n;
        int32_t quit = krpc.job_quit;
        if (task < n) {
            int32_t rc = krpc.job_fn(krpc.job_ctx, task, n);
            if (rc != 0) {
                int32_t expected = 0;
                __atomic_compare_exchange_n(&krpc.job_err, &expected, rc, 0, SEQ, SEQ);
            }
        }
        if (__atomic_fetch_sub(&krpc.pending, 1, SEQ) == 1)
            krpc_wake(&krpc_cv_done, &krpc.waiter);
        if (tid >= quit)
            return NULL;
    }
}

/* Publish a job to every worker (the caller holds krpc.busy). */
static void krpc_publish(krpc_task_fn fn, void *ctx, int32_t n, int32_t quit) {
    krpc.job_fn = fn;
    krpc.job_ctx = ctx;
    krpc.job_n = n;
    krpc.job_quit = quit;
    krpc.job_err = 0;
    if (LOAD(&krpc.sleepers, __ATOMIC_RELAXED) != 0)
        STORE(&krpc.caller_cpu, sched_getcpu(), __ATOMIC_RELAXED);
    STORE(&krpc.pending, krpc.nworkers, SEQ);
    __atomic_fetch_add(&krpc.gen, 1, SEQ);
    krpc_wake(&krpc_cv_work, &krpc.sleepers);
}

/* Wait until every worker has acknowledged the published job. */
static void krpc_join(void) {
    int32_t left;
    while ((left = LOAD(&krpc.pending, ACQ)) != 0)
        krpc_wait_change(&krpc.pending, left, &krpc_cv_done, &krpc.waiter);
}

static int32_t krpc_noop(void *ctx, int32_t task, int32_t n) {
    (void)ctx, (void)task, (void)n;
    return 0;
}

/* Stop and join the workers with index >= keep (the caller holds krpc.busy). */
static void krpc_shrink(int32_t keep) {
    int32_t have = krpc.nworkers;
    if (keep >= have)
        return;
    krpc_publish(krpc_noop, NULL, 1, keep);
    krpc_join();
    krpc.job_quit = KRPC_NO_QUIT;
    for (int32_t i = keep; i < have; ++i)
        pthread_join(krpc_threads[i], NULL);
    krpc.nworkers = keep;
}

/* Grow the pool to `want` workers (the caller holds krpc.busy or is the initialiser). */
static void krpc_grow(int32_t want) {
    if (want > KRPC_MAX_WORKERS)
        want = KRPC_MAX_WORKERS;
    for (int32_t have = krpc.nworkers; have < want; ++have) {
        krpc_seen_init[have] = LOAD(&krpc.gen, ACQ);
        if (pthread_create(&krpc_threads[have], NULL, krpc_worker, (void *)(intptr_t)have) != 0)
            return;
        STORE(&krpc.nworkers, have + 1, REL);
    }
}

static int32_t krpc_env_threads(void) {
    const char *value = getenv("KERNELRPC_NUM_THREADS");
    if (value == NULL)
        value = getenv("TVM_NUM_THREADS");
    return value == NULL ? 0 : atoi(value);
}

/* The cores this thread may run on (its affinity mask, as taskset/cpusets set it),
 * else the online cores. */
static int32_t krpc_usable_cores(void) {
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
        int count = CPU_COUNT(&mask);
        if (count > 0)
            return count;
    }
    return (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
}

/* 0 (or less) means all usable cores; the result is in [1, KRPC_MAX_WORKERS + 1]. */
static int32_t krpc_resolve_threads(int32_t n) {
    if (n <= 0)
        n = krpc_usable_cores();
    if (n < 1)
        n = 1;
    return n > KRPC_MAX_WORKERS + 1 ? KRPC_MAX_WORKERS + 1 : n;
}

static void krpc_after_fork_child(void) {
    static const pthread_mutex_t fresh_mutex = PTHREAD_MUTEX_INITIALIZER;
    static const pthread_cond_t fresh_cond = PTHREAD_COND_INITIALIZER;
    krpc_mutex = fresh_mutex;
    krpc_cv_work = fresh_cond;
    krpc_cv_done = fresh_cond;
    krpc.nworkers = 0;
    krpc.sleepers = 0;
    krpc.waiter = 0;
    krpc.pending = 0;
    krpc.busy = 0;
    krpc.nthreads = 1;
    STORE(&krpc.state, 0, REL);
    STORE(&krpc_pool_lock, 0, REL);
}

static void krpc_ensure_pool(void) {
    if (LOAD(&krpc.state, ACQ) == 2)
        return;
    int32_t expected = 0;
    if (!__atomic_compare_exchange_n(&krpc.state, &expected, 1, 0, SEQ, SEQ)) {
        while (LOAD(&krpc.state, ACQ) != 2)
            sched_yield();
        return;
    }
    if (LOAD(&krpc.gen, ACQ) == 0) {
        /* gen starts at 1 after the first init so that a forked child does not re-register */
        STORE(&krpc.gen, 1, REL);
        pthread_atfork(NULL, NULL, krpc_after_fork_child);
    }
    krpc_grow(krpc_resolve_threads(krpc_env_threads()) - 1);
    krpc.nthreads = krpc.nworkers + 1;
    STORE(&krpc.state, 2, REL);
}

static int krpc_try_claim(void) {
    int32_t expected = 0;
    return __atomic_compare_exchange_n(&krpc.busy, &expected, 1, 0, ACQ, __ATOMIC_RELAXED);
}

KRPC_HIDDEN int32_t __kernelrpc_parallel_launch(krpc_task_fn fn, void *ctx) {
    krpc_ensure_pool();
    int32_t n = LOAD(&krpc.nthreads, __ATOMIC_RELAXED); /* set_num_threads may change it */
    if (n <= 1 || !krpc_try_claim())
        return fn(ctx, 0, 1);
    krpc_publish(fn, ctx, n, KRPC_NO_QUIT);
    int32_t rc = fn(ctx, 0, n);
    krpc_join();
    if (rc == 0)
        rc = krpc.job_err;
    STORE(&krpc.busy, 0, REL);
    return rc;
}

KRPC_EXPORT int32_t __kernelrpc_set_num_threads(int32_t want) {
    krpc_ensure_pool();
    while (!krpc_try_claim())
        sched_yield();
    int32_t n = krpc_resolve_threads(want);
    krpc_shrink(n - 1);
    krpc_grow(n - 1);
    int32_t avail = krpc.nworkers + 1;
    int32_t use = n < avail ? n : avail;
    STORE(&krpc.nthreads, use, __ATOMIC_RELAXED);
    STORE(&krpc.busy, 0, REL);
    return use;
}

/* Kernels' large intermediate buffers (over 64 KiB: smaller ones are on the stack).
 * A kernel allocates them on every call and frees them on return; memory fresh from the
 * system costs a page fault per page on first touch, and glibc hands a freed block back to
 * the system whenever its arena's top grows past the trim threshold (a device server's
 * session thread, whose arena is not the main one, did so on every call: 3,500 faults and
 * 5 ms of a 12 ms ResNet-18 run). Freed blocks are kept here instead, up to
 * KRPC_POOL_SLOTS of them and KRPC_POOL_BYTES in all, the oldest given back first, and an
 * allocation takes a kept block of its size up to twice its size. */
#define KRPC_POOL_SLOTS 32
#define KRPC_POOL_BYTES ((size_t)128 << 20)

static struct {
    void *ptr;
    size_t size;
    uint64_t age;
} krpc_pool[KRPC_POOL_SLOTS];
static size_t krpc_pool_bytes;
static uint64_t krpc_pool_clock;

static void krpc_pool_enter(void) {
    while (__atomic_exchange_n(&krpc_pool_lock, 1, ACQ))
        krpc_pause();
}

static void krpc_pool_leave(void) { STORE(&krpc_pool_lock, 0, REL); }

KRPC_HIDDEN void *__kernelrpc_workspace_alloc(size_t nbytes) {
    void *found = NULL;
    int best = -1;
    krpc_pool_enter();
    for (int i = 0; i < KRPC_POOL_SLOTS; ++i) {
        size_t size = krpc_pool[i].size;
        if (krpc_pool[i].ptr && size >= nbytes && size / 2 <= nbytes &&
                (best < 0 || size < krpc_pool[best].size))
            best = i;
    }
    if (best >= 0) {
        found = krpc_pool[best].ptr;
        krpc_pool[best].ptr = NULL;
        krpc_pool_bytes -= krpc_pool[best].size;
    }
    krpc_pool_leave();
    return found ? found : aligned_alloc(64, (nbytes + 63) / 64 * 64);
}

KRPC_HIDDEN void __kernelrpc_workspace_free(void *ptr, size_t nbytes) {
    size_t size = (nbytes + 63) / 64 * 64;
    if (size > KRPC_POOL_BYTES) {
        free(ptr);
        return;
    }
    krpc_pool_enter();
    for (;;) {
        int empty = -1, oldest = -1;
        for (int i = 0; i < KRPC_POOL_SLOTS; ++i) {
            if (!krpc_pool[i].ptr)
                empty = i;
            else if (oldest < 0 || krpc_pool[i].age < krpc_pool[oldest].age)
                oldest = i;
        }
        if (empty >= 0 && krpc_pool_bytes + size <= KRPC_POOL_BYTES) {
            krpc_pool[empty].ptr = ptr;
            krpc_pool[empty].size = size;
            krpc_pool[empty].age = ++krpc_pool_clock;
            krpc_pool_bytes += size;
            krpc_pool_leave();
            return;
        }
        /* give the oldest back (outside the lock), then look again */
        void *old = krpc_pool[oldest].ptr;
        krpc_pool[oldest].ptr = NULL;
        krpc_pool_bytes -= krpc_pool[oldest].size;
        krpc_pool_leave();
        free(old);
        krpc_pool_enter();
    }
}

#ifdef __cplusplus
}
#endif
