"""Helpers of the serving model's continuous kernels: the admission-ordered running list and a
doubly linked completion calendar, from which a preempted request leaves in O(1).

Bucket ``b`` of the calendar heads a list of the requests due at steps == b (mod its size);
``cprev`` of a bucket's first member is -2 - b, so a member can unlink itself.
"""

from __future__ import annotations

from ..._jit import inline


@inline
def cdiv(a, b):
    return -(-a // b)


@inline
def cal_file(bucket, base, ring, cnext, cprev, due, cursor, steps, i, steps_left):
    """File request ``i`` (due ``steps_left`` steps after step ``steps``, whose bucket is
    ``cursor``) in the calendar of ``ring`` buckets from ``bucket[base]`` (a pool keeps every
    replica's calendar in one array); ``cprev`` of a bucket's first member is -2 - its index in
    ``bucket``."""
    due[i] = steps + steps_left
    if steps_left >= ring:
        steps_left %= ring
    b = cursor + steps_left
    b = base + (b - ring if b >= ring else b)
    first = bucket[b]
    cnext[i] = first
    cprev[i] = -2 - b
    if first >= 0:
        cprev[first] = i
    bucket[b] = i


@inline
def cal_remove(bucket, cnext, cprev, i):
    nxt = cnext[i]
    prv = cprev[i]
    if prv >= 0:
        cnext[prv] = nxt
    else:
        bucket[-2 - prv] = nxt
    if nxt >= 0:
        cprev[nxt] = prv


@inline
def unlink(rprev, rnext, rhead, rtail, i):
    """Remove request ``i`` from the running list; returns the new (head, tail)."""
    nx = rnext[i]
    pv = rprev[i]
    if pv >= 0:
        rnext[pv] = nx
    else:
        rhead = nx
    if nx >= 0:
        rprev[nx] = pv
    else:
        rtail = pv
    return rhead, rtail
