"""Where every tensor of a network lives when it runs.

Graph inputs and outputs are the caller's tensors; weights are slices of one params buffer;
every other value a kernel writes is a slice of one workspace arena, reused once its last
reader has run (best fit among the freed blocks, adjacent free blocks merged). All offsets
are multiples of 64 bytes: kernels rely on 64-byte aligned tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

ALIGN = 64


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Location:
    kind: str       # "input" | "output" | "param" | "work"
    index: int      # input/output position, or byte offset in params/workspace


class Arena:
    """Best-fit allocation of aligned blocks with reuse."""

    def __init__(self):
        self.size = 0
        self.free: list = []          # (offset, size), sorted by offset

    def alloc(self, nbytes: int) -> int:
        need = aligned(max(nbytes, 1))
        fits = [b for b in self.free if b[1] >= need]
        if fits:
            offset, size = min(fits, key=lambda b: (b[1], b[0]))
            self.free.remove((offset, size))
            if size > need:
                self.free.append((offset + need, size - need))
                self.free.sort()
            return offset
        if self.free and self.free[-1][0] + self.free[-1][1] == self.size:
            offset, _ = self.free.pop()      # grow the block at the end
        else:
            offset = self.size
        self.size = offset + need
        return offset

    def release(self, offset: int, nbytes: int) -> None:
        self.free.append((offset, aligned(max(nbytes, 1))))
        self.free.sort()
        merged = []
        for off, size in self.free:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((off, size))
        self.free = merged


@dataclass
class MemoryPlan:
    locations: dict          # id(node) -> Location
    workspace_bytes: int
    naive_bytes: int         # every intermediate value in a buffer of its own
    params: list             # const nodes in the params buffer, in offset order
    params_bytes: int


def plan_memory(groups, inputs, outputs) -> MemoryPlan:
    locations = {id(n): Location("input", k) for k, n in enumerate(inputs)}
    for k, n in enumerate(outputs):
        locations[id(n)] = Location("output", k)
    params, offset = [], 0
    last_use = {}
    for index, group in enumerate(groups):
        for node in group.inputs():
            last_use[id(node)] = index
            if node.is_const and id(node) not in locations:
                locations[id(node)] = Location("param", offset)
                params.append(node)
                offset += aligned(node.nbytes)
    arena, naive, live = Arena(), 0, []
    for index, group in enumerate(groups):
        for node in [n for n in live if last_use.get(id(n), -1) < index]:
            arena.release(locations[id(node)].index, node.nbytes)
            live.remove(node)
        out = group.output
        if id(out) in locations:
            continue
        locations[id(out)] = Location("work", arena.alloc(out.nbytes))
        naive += aligned(out.nbytes)
        live.append(out)
    return MemoryPlan(locations, arena.size, naive, params, offset)
