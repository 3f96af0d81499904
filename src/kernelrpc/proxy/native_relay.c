/* The proxy's native relay loop: one paired session, no interpreter on the path.
 *
 * Compiled for the host by its C compiler (deploy/toolchain.py), as the module runtime is, so
 * the layouts of struct pollfd and struct timespec and the constants (MSG_DONTWAIT, POLLIN,
 * EAGAIN...) come from the C library's own headers. native_loop.py declares the ABI (PARAMS)
 * and loads the library; native_relay.py runs the loop in a thread per session.
 *
 * Python equivalent, per paired session (a, b non-blocking sockets):
 *
 *     while not stop_flag:
 *         p = pump(a -> b) | pump(b -> a)         # < 0: a socket failed (-errno)
 *         if a direction ended (EOF, all it sent delivered): return 0
 *         if p & READ_SHORT: last_short = now()   # a request or a reply went through
 *         elif not p and now() - last_short >= spin_ns:
 *             poll([a, b, stop_fd])               # sleep until there is work
 *         (else: spin_hint() and go round again)
 *     return STOPPED
 *
 * pump reads into the direction's buffer when it is empty (recv), then sends what it holds
 * (send) until the destination would block.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0
#endif

/* Reads shorter than this look like requests and replies and (re)start the polling window;
 * bulk transfers do not, so they do not take a core from the peers. */
#define SHORT_READ_BYTES (16 << 10)
#define STOPPED 1       /* the return value when stopped through stop_flag / stop_fd */
#define MOVED 1         /* pump result bits: moved bytes or saw EOF */
#define READ_SHORT 2    /* ... read a short message */

/* One direction: bytes [start, end) of buf are still to be sent to dst. */
struct direction {
    int src, dst;
    char *buf;
    int64_t start, end, cap;
    int eof;
    int64_t moved;
};

static inline void spin_hint(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int try_again(int err) {
    return err == EAGAIN || err == EWOULDBLOCK || err == EINTR;
}

/* MOVED|READ_SHORT bits, or -errno. */
static int pump(struct direction *d) {
    int progress = 0;
    if (d->start == d->end && !d->eof) {
        ssize_t n = recv(d->src, d->buf, (size_t)d->cap, MSG_DONTWAIT);
        if (n == 0) {
            d->eof = 1;
            return MOVED;
        }
        if (n < 0)
            return try_again(errno) ? 0 : -errno;
        d->start = 0;
        d->end = n;
        d->moved += n;
        progress = n < SHORT_READ_BYTES ? MOVED | READ_SHORT : MOVED;
    }
    for (;;) {
        if (d->start == d->end) {   /* all delivered */
            d->start = d->end = 0;
            return progress;
        }
        ssize_t w = send(d->dst, d->buf + d->start, (size_t)(d->end - d->start), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w <= 0)
            return try_again(errno) ? progress : -errno;
        d->start += w;
        progress |= MOVED;
    }
}

static int ended(const struct direction *d) {
    return d->eof && d->start == d->end;
}

/* POLLIN if source may read (open, buffer empty), POLLOUT if towards holds bytes. */
static short poll_events(const struct direction *source, const struct direction *towards) {
    return (short)((!source->eof && source->start == source->end ? POLLIN : 0)
                   | (towards->start != towards->end ? POLLOUT : 0));
}

/* 0: a side ended; STOPPED; -errno: a socket failed. The parameters are native_loop.PARAMS. */
__attribute__((visibility("default")))
int64_t kernelrpc_relay(int32_t a, int32_t b, char *buf_ab, char *buf_ba, int64_t cap, int64_t pend_ab,
                        int64_t pend_ba, int32_t stop_fd, int32_t *stop_flag, int64_t spin_ns, int64_t *moved) {
    struct direction ab = {a, b, buf_ab, 0, pend_ab, cap, 0, 0};
    struct direction ba = {b, a, buf_ba, 0, pend_ba, cap, 0, 0};
    struct pollfd fds[3];
    int64_t last_short = now_ns(), rc;
    for (;;) {
        if (__atomic_load_n(stop_flag, __ATOMIC_RELAXED)) {
            rc = STOPPED;
            break;
        }
        int p1 = pump(&ab), p2 = pump(&ba);
        if (p1 < 0 || p2 < 0) {
            rc = p1 < 0 ? p1 : p2;
            break;
        }
        if (ended(&ab) || ended(&ba)) {
            rc = 0;
            break;
        }
        int progress = p1 | p2;
        if (progress & READ_SHORT) {
            last_short = now_ns();
            continue;
        }
        if (progress)
            continue;
        if (now_ns() - last_short < spin_ns) {
            spin_hint();
            continue;
        }
        fds[0] = (struct pollfd){.fd = a, .events = poll_events(&ab, &ba), .revents = 0};
        fds[1] = (struct pollfd){.fd = b, .events = poll_events(&ba, &ab), .revents = 0};
        fds[2] = (struct pollfd){.fd = stop_fd, .events = POLLIN, .revents = 0};
        if (poll(fds, 3, -1) < 0) {
            if (errno != EINTR) {
                rc = -errno;
                break;
            }
            continue;
        }
        if (fds[2].revents) {
            rc = STOPPED;
            break;
        }
    }
    moved[0] = ab.moved;
    moved[1] = ba.moved;
    return rc;
}
