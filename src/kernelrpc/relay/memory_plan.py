"""Where every tensor of a network lives when it runs.

Graph inputs and outputs are the caller's tensors; weights are slices of one params buffer;
every other value a kernel writes is a slice of one workspace arena, reused once its last
reader has run (best fit among the freed blocks, adjacent free blocks merged). All offsets
are multiples of 64 bytes: kernels rely on 64-byte aligned tensors.

A concatenation whose inputs are each one contiguous slice of its output (every axis before
the concatenated one of extent 1, as a batch-1 network's channels), each written by a
kernel for the concatenation alone, costs no copy: its producers write their slices of its
output in place (:func:`concats_in_place`), and it runs no kernel.
"""
from __future__ import annotations

from collections import Counter
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


def concats_in_place(groups, outputs) -> dict:
    """The concatenations whose producers write their output in place: ``{id(group):
    [byte offset of each input's slice]}`` for the lone concatenation groups whose output is
    no graph output and whose every input is another group's output, read by this group
    alone, its slice on a 64-byte boundary (so that its kernel's alignment holds)."""
    producers = {id(g.output): g for g in groups}
    readers = Counter(id(n) for g in groups for n in g.inputs())
    graph_outputs = {id(n) for n in outputs}
    chosen: dict = {}
    for group in groups:
        node = group.output
        if len(group.nodes) != 1 or node.op != "concatenate" or id(node) in graph_outputs:
            continue
        axis = node.attrs["axis"] % len(node.shape)
        if any(extent != 1 for extent in node.shape[:axis]) or \
                len({id(i) for i in node.inputs}) != len(node.inputs):
            continue
        offsets, offset = [], 0
        for value in node.inputs:
            producer = producers.get(id(value))
            if producer is None or id(producer) in chosen or id(value) in graph_outputs or \
                    readers[id(value)] != 1 or offset % ALIGN:
                break
            offsets.append(offset)
            offset += value.nbytes
        else:
            chosen[id(group)] = offsets
    return chosen


def plan_memory(groups, inputs, outputs, in_place=None) -> MemoryPlan:
    """Every value's location; ``in_place`` (:func:`concats_in_place`) puts those
    concatenations' inputs in their output, which takes its block when the first of them
    is written."""
    in_place = in_place or {}
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
    slices = {}
    for index, group in enumerate(groups):
        if id(group) in in_place:
            whole = group.output
            for value, start in zip(whole.inputs, in_place[id(group)]):
                slices[id(value)] = (whole, start)
            last_use[id(whole)] = max(last_use.get(id(whole), index), index)  # until it ran
    arena, naive, live = Arena(), 0, []
    for index, group in enumerate(groups):
        for node in [n for n in live if last_use.get(id(n), -1) < index]:
            arena.release(locations[id(node)].index, node.nbytes)
            live.remove(node)
        out = group.output
        if id(out) not in locations:
            whole, start = slices.get(id(out), (out, 0))
            if id(whole) not in locations:
                locations[id(whole)] = Location("work", arena.alloc(whole.nbytes))
                live.append(whole)
            locations[id(out)] = Location("work", locations[id(whole)].index + start)
        if locations[id(out)].kind == "work":
            naive += aligned(out.nbytes)
    return MemoryPlan(locations, arena.size, naive, params, offset)
