"""The target's hidden states on their way from LLMEngine's forwards to a drafter that reads them
(EAGLE-3: a drafter with a `hidden_layers` attribute, see drafters.py).

Every engine forward that holds such a request asks forward_tensor for those states
(output_hidden_states, all rows); the engine hands each request's rows here, in position order:

    prefill chunks       the rows of their tokens (a prefix-cache hit starts at the first
                         computed position)
    a decode step        the root's row
    a speculative step   the rows of the accepted path (root and accepted drafts)

and takes them out, by position, when it tells the drafter the request's new tokens:
start(context, hidden=rows) the first time (the held rows of the context's positions),
update(emitted, hidden=rows) after that (the rows of the positions before each emitted token).
A step launched ahead adds its rows before the tokens of the step before it are emitted; taking
by position leaves them for the next emission. Rows that do not continue the ones held (a
request preempted and computed again) replace them.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch


class HiddenFeed:
    """Owns, per request, the target states [rows, len(layers), hidden_size] not yet given to the
    drafter and the position of their first row."""

    def __init__(self, layers):
        self.layers = list(layers)
        self._held: dict[Hashable, tuple[int, list[torch.Tensor]]] = {}

    def forward_kwargs(self) -> dict:
        return {"output_hidden_states": self.layers}

    def add(self, rid: Hashable, first: int, rows: torch.Tensor) -> None:
        """rows [r, len(layers), H]: the states of positions first .. first + r - 1."""
        held = self._held.get(rid)
        if held is not None and held[0] + sum(x.shape[0] for x in held[1]) == first:
            held[1].append(rows)
        else:
            self._held[rid] = (first, [rows])

    def take(self, rid: Hashable, upto: int) -> torch.Tensor | None:
        """-> the held rows of positions < upto, in position order (None: none), forgetting them.
        Rows of one add come back as a view of what was added (no copy, no kernel): a decode
        step's row is handed on as it came, the run-ahead step's row behind it stays held."""
        held = self._held.get(rid)
        if held is None:
            return None
        first, parts = held
        n = max(0, min(upto - first, sum(p.shape[0] for p in parts)))
        if n == 0:
            return None
        out, left = [], n
        while left:
            p = parts[0]
            if p.shape[0] <= left:
                out.append(parts.pop(0))
                left -= p.shape[0]
            else:
                out.append(p[:left])
                parts[0] = p[left:]
                left = 0
        if parts:
            self._held[rid] = (first + n, parts)
        else:
            del self._held[rid]
        return out[0] if len(out) == 1 else torch.cat(out)

    def drop(self, rid: Hashable) -> None:
        self._held.pop(rid, None)
