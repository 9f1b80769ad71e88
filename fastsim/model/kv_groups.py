"""Hybrid-attention KV: how a model whose layers do not all attend to every earlier token holds
its KV cache, as vLLM's hybrid KV cache manager lays it out (docs/model/deployed.md, "Hybrid
attention").

Layers come in kinds: *full* attention (KV for every token), *window* attention (a sliding
window, or chunks, of ``model.window_tokens``: KV for the window only) and *linear* attention (a
fixed state per request). vLLM groups the layers of each kind into KV cache groups of the same
number of layers, ``group_size``: the fewest layers of any kind present, or the most when that is
less than 1.5 times the fewest; a kind of L layers forms ceil(L / group_size) groups (the last
padded). Every group allocates blocks of ``block_tokens`` tokens x ``group_size`` layers from one
shared pool, each its own: a full group as many as a request's tokens fill, a window group at most
a window's, a linear group a state's.

fastsim counts the cache in blocks of the full groups together (one vLLM block each while there is
one full group, which every hybrid model served today has), so a request holds what its tokens
fill, as for any model, plus a fixed number of blocks (:func:`fixed_blocks`) from admission to its
end or preemption.
"""

from __future__ import annotations

import math

SLIDING, CHUNKED = "sliding", "chunked"


def group_size(*layers: int) -> int:
    """Layers per KV cache group, given the layers of each kind (kinds with none left out)."""
    present = [n for n in layers if n > 0]
    least, most = min(present), max(present)
    return most if most < least * 1.5 else least


def groups(n_layers: int, window_layers: int, linear_layers: int) -> tuple[int, int, int, int]:
    """(group_size, full groups, window groups, linear groups)."""
    full = n_layers - window_layers - linear_layers
    size = group_size(full, window_layers, linear_layers)
    return size, math.ceil(full / size), math.ceil(window_layers / size), math.ceil(linear_layers / size)


def window_blocks(window_tokens: int, kind: str, block_tokens: int) -> int:
    """Blocks one window group holds for a request at most: a sliding window's tokens before the
    newest (window - 1) and the block the newest is written to; a chunk's blocks (a chunk starts
    on a block boundary when the block divides it)."""
    if kind == CHUNKED:
        return -(-window_tokens // block_tokens)
    return -(-(window_tokens - 1) // block_tokens) + 1


def reach(window_tokens: int, kind: str) -> float:
    """Tokens a window layer reads per query token at long contexts: the window, or half a chunk
    (a token attends to its chunk's tokens before it: on average half of it)."""
    return window_tokens / 2 if kind == CHUNKED else float(window_tokens)


def fixed_blocks(n_layers: int, window_layers: int, window_tokens: int, kind: str, linear_layers: int,
                 state_bytes: float, layer_block_bytes: float, block_tokens: int) -> int:
    """Blocks (of the full groups) a running request holds beyond those its tokens fill: its
    window groups' windows and its linear groups' states (a state takes whole blocks of
    ``layer_block_bytes``, one layer's ``block_tokens`` tokens of KV, as vLLM pads them to one
    page), rounded up to whole blocks of the full groups."""
    if window_layers == 0 and linear_layers == 0:
        return 0
    _, full, window, linear = groups(n_layers, window_layers, linear_layers)
    held = window * window_blocks(window_tokens, kind, block_tokens) if window else 0
    if linear:
        held += linear * math.ceil(state_bytes / layer_block_bytes)
    return -(-held // full)


def page_layers(n_layers: int, window_layers: int, linear_layers: int) -> int:
    """Layers one block of fastsim's counts spans: the full groups' (with their padding)."""
    size, full, _, _ = groups(n_layers, window_layers, linear_layers)
    return size * full
