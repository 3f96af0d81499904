"""The cost of one loopback TCP hop with nobody asleep: the floor under any relay.

    python bench/loopback_hop.py

A C client and a C echo process ping-pong 8 bytes over loopback TCP, both
polling their sockets (``recv(MSG_DONTWAIT)`` in a loop) so that no wake-up is
measured, only the kernel's send and receive path.  A round trip is two hops;
a relay in a third process adds two more, so ``2 * hop`` is what any user-space
proxy adds to a round trip here, however fast its own code.  Needs ``cc``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

static long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}
static void poll_recv(int s, char *b) {
  for (int got = 0; got < 8;) {
    int n = recv(s, b + got, 8 - got, MSG_DONTWAIT);
    if (n == 0) exit(0);
    if (n > 0) got += n;
  }
}
static int cmp(const void *a, const void *b) {
  long x = *(const long *)a, y = *(const long *)b;
  return x < y ? -1 : x > y;
}
int main(int argc, char **argv) {
  int one = 1, n = 100000;
  struct sockaddr_in addr = {AF_INET, 0, {htonl(INADDR_LOOPBACK)}};
  socklen_t len = sizeof addr;
  char b[8] = {0};
  if (argc > 1) { /* client of the echo process on port argv[1] */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    addr.sin_port = htons(atoi(argv[1]));
    if (connect(s, (void *)&addr, len)) { perror("connect"); return 1; }
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    long *t = malloc(n * sizeof *t);
    for (int i = 0; i < n; i++) {
      long t0 = now_ns();
      send(s, b, 8, 0);
      poll_recv(s, b);
      t[i] = now_ns() - t0;
    }
    qsort(t, n, sizeof *t, cmp);
    printf("%.3f %.3f\n", t[n / 2] / 1e3, t[n * 9 / 10] / 1e3);
    return 0;
  }
  int l = socket(AF_INET, SOCK_STREAM, 0);
  bind(l, (void *)&addr, len);
  listen(l, 1);
  getsockname(l, (void *)&addr, &len);
  printf("%d\n", ntohs(addr.sin_port));
  fflush(stdout);
  int c = accept(l, 0, 0);
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  for (;;) {
    poll_recv(c, b);
    send(c, b, 8, 0);
  }
}
"""


def measure_hop_us() -> float | None:
    """Median microseconds per loopback hop (half a polling round trip), or None without cc."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp, "hop.c"), Path(tmp, "hop")
        src.write_text(SOURCE)
        subprocess.run([cc, "-O2", "-o", str(exe), str(src)], check=True)
        echo = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, text=True)
        try:
            port = echo.stdout.readline().strip()
            out = subprocess.run([str(exe), port], check=True, capture_output=True, text=True,
                                 timeout=120).stdout
        finally:
            echo.kill()
            echo.wait()
    median_rtt_us = float(out.split()[0])
    return median_rtt_us / 2


def main() -> None:
    hop = measure_hop_us()
    if hop is None:
        sys.exit("no C compiler (cc) found")
    print(f"{os.cpu_count()} cpus: one loopback TCP hop, both ends polling: {hop:.2f} us; "
          f"a relay in a third process adds at least {2 * hop:.1f} us per round trip")


if __name__ == "__main__":
    main()
