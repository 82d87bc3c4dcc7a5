"""The target's hidden states on their way from LLMEngine's forwards to a drafter that reads them
(EAGLE-3: a drafter with a `hidden_layers` attribute, see drafters.py).

Every engine forward that holds such a request asks forward_tensor for those states
(output_hidden_states, all rows); the engine hands each request's rows here, in position order:

    prefill chunks       the rows of their tokens (a prefix-cache hit starts at the first
                         computed position)
    a decode step        the root's row
    a speculative step   the rows of the accepted path (root and accepted drafts)

and takes them out when it tells the drafter the request's new tokens: start(context,
hidden=rows) the first time (the rows of the context's last positions), update(emitted,
hidden=rows) after that (one row per emitted token). Rows that do not continue the ones held
(a request preempted and computed again) replace them.
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

    def take(self, rid: Hashable) -> torch.Tensor | None:
        """-> the held rows in position order (None: none), forgetting them."""
        held = self._held.pop(rid, None)
        if held is None:
            return None
        return held[1][0] if len(held[1]) == 1 else torch.cat(held[1])

    def drop(self, rid: Hashable) -> None:
        self._held.pop(rid, None)
