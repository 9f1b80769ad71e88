"""The KV link of each prefill replica: finished prompts cross it to the decode pool first come
first served (ties: lower index); a transfer starts at max(prefill end, link free) and takes
``fleet.kv_link_latency_ms`` 1e-3 + the prompt's KV (prompt x ``model.kv_bytes_per_token``; a
hybrid-attention model's held KV: :func:`fastsim.model.cost.prompt_kv_bytes`) / (``fleet.kv_link_gb_s``
1e9) seconds (docs/model/fleets.md)."""

from __future__ import annotations

import numpy as np

from .._jit import jit
from ..model.cost import prompt_kv_bytes
from ..model.schema import Config


@jit
def _first_come_first_served(ended, duration):
    """Arrival times of transfers queued in this order on one link."""
    out = np.empty(ended.size)
    free = 0.0
    for t in range(ended.size):
        free = max(ended[t], free) + duration[t]
        out[t] = free
    return out


def transfer_s(config: Config, prompt: np.ndarray) -> np.ndarray:
    """Each prompt's transfer time over a link (s)."""
    f = config.fleet
    return f.kv_link_latency_ms * 1e-3 + prompt_kv_bytes(config, prompt) / (f.kv_link_gb_s * 1e9)


def kv_arrivals(config: Config, ended: np.ndarray, prompt: np.ndarray, sent: np.ndarray,
                prefill_replica: np.ndarray) -> np.ndarray:
    """When each request's KV reaches the decode pool (NaN for those not ``sent``: a one-token
    output is done at its prefill), from its prefill end ``ended`` (engine time) on
    ``prefill_replica``'s link."""
    f = config.fleet
    duration = transfer_s(config, prompt)
    arrived = np.full(ended.size, np.nan)
    for r in range(f.prefill_replicas):
        mine = np.flatnonzero(sent & (prefill_replica == r))
        queue = mine[np.lexsort((mine, ended[mine]))]  # by prefill end, ties by index
        arrived[queue] = _first_come_first_served(ended[queue], duration[queue])
    return arrived
