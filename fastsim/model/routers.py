"""The routers a fleet may use, declared once with what each needs (docs/model/fleets.md): the
schema validates the names, the fleet's driver and kernel read the rest."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Router:
    code: int  # what the serving loop's pools take
    load_aware: bool  # reads the replicas' state at each request's instant (else: the request alone, replicas apart)
    counts_blocks: bool = False  # reads KV blocks in use (counted for an unlimited cache too)
    draws: bool = False  # a random replica per request, drawn with the traffic


ROUTERS: dict[str, Router] = {
    "round_robin": Router(0, load_aware=False),
    "random": Router(1, load_aware=False, draws=True),
    "least_outstanding": Router(2, load_aware=True),
    "least_kv": Router(3, load_aware=True, counts_blocks=True),
    "prefix_aware": Router(4, load_aware=True, counts_blocks=True),
}
"""Router name -> what it needs; the order is the order the docs and errors list them in."""
assert [r.code for r in ROUTERS.values()] == list(range(len(ROUTERS)))
