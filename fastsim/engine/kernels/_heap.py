"""A binary min-heap on (time, request) in two arrays, for arrivals that runs release (sessions'
next turns, KV transfers): ties go to the lower request index."""

from __future__ import annotations

from ..._jit import inline


@inline
def push(heap_t, heap_i, size, t, i):
    """Add (t, i) to the heap of ``size`` entries; returns its new size."""
    j = size
    while j > 0:
        up = (j - 1) >> 1
        if heap_t[up] < t or (heap_t[up] == t and heap_i[up] < i):
            break
        heap_t[j], heap_i[j] = heap_t[up], heap_i[up]
        j = up
    heap_t[j], heap_i[j] = t, i
    return size + 1


@inline
def pop(heap_t, heap_i, size):
    """Remove the first entry (``heap_t[0]``, ``heap_i[0]``); returns the new size."""
    size -= 1
    t, i = heap_t[size], heap_i[size]
    j = 0
    while True:
        child = 2 * j + 1
        if child >= size:
            break
        if child + 1 < size and (heap_t[child + 1] < heap_t[child] or (
                heap_t[child + 1] == heap_t[child] and heap_i[child + 1] < heap_i[child])):
            child += 1
        if heap_t[child] > t or (heap_t[child] == t and heap_i[child] > i):
            break
        heap_t[j], heap_i[j] = heap_t[child], heap_i[child]
        j = child
    if size > 0:
        heap_t[j], heap_i[j] = t, i
    return size
