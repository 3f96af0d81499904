"""Built candidates kept by what they were built from, so that measuring one again builds nothing.

A candidate's build is a function of its cloudpickle bytes (the schedule function with every
value it closes over), the target, the function name and the C files it links: the key is a
digest of exactly those. A tuner measures the default and its fastest configurations once
more at the end of a task (``confirm``); with a cache those are uploaded from the first
build's bytes. On a ResNet-18 run with 24 trials per task that is 42-44 of 315-317 candidates
(14%), each 0.23 s of a core; on MobileNet-v2 103-113 of 784-794. Compile errors are kept
too: the same input fails the same way.

Different configurations often lower to the same kernel (a knob that changes nothing for the
shape: the kernel-width unroll of a 1x1 convolution, an inline or staged padding of none).
With a ``directory`` the build workers of this host share the libraries they link, keyed by
the LLVM IR and everything else the library is made of (``compiler.build_library``): a kernel
lowered to the same IR before is not compiled and linked again, which is 0.18 s of a
candidate's 0.23. Of 24 random configurations per task, 11 of 144 ResNet-18 candidates and 39
of 177 MobileNet-v2 ones (half of its 1x1 convolutions') were such repeats.
"""
from __future__ import annotations

import collections
import hashlib
import threading

from .build import BuildOutput, LinkFiles


class BuildCache:
    """A bounded map of build inputs to :class:`BuildOutput`, oldest dropped first
    (``max_bytes`` of shared libraries). Thread-safe: builds finish on the executor's thread.
    ``directory``: where build workers on this host share the libraries they link (for a
    process pool only: a worker on another machine would not see it); the caller removes it."""

    def __init__(self, max_bytes: int = 256 << 20, directory: str | None = None) -> None:
        self.max_bytes = max_bytes
        self.directory = None if directory is None else str(directory)
        self._items: "collections.OrderedDict[bytes, BuildOutput]" = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0

    @staticmethod
    def key(payload: bytes, target: str | None, name: str, link: LinkFiles | None) -> bytes:
        digest = hashlib.sha256()
        for part in (str(target).encode(), name.encode(), payload):
            digest.update(len(part).to_bytes(8, "little"))
            digest.update(part)
        for kind, path, data in (link.files if link else ()):
            digest.update(f"{kind}\0{path}\0{len(data)}\0".encode())
            digest.update(data)
        return digest.digest()

    def get(self, key: bytes) -> BuildOutput | None:
        with self._lock:
            output = self._items.get(key)
            if output is not None:
                self._items.move_to_end(key)
                self.hits += 1
            return output

    def put(self, key: bytes, output: BuildOutput) -> None:
        size = len(output.library or b"")
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= len(old.library or b"")
            self._items[key] = output
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, dropped = self._items.popitem(last=False)
                self._bytes -= len(dropped.library or b"")

    def __len__(self) -> int:
        return len(self._items)
