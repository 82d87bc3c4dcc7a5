"""Adaptive speculation: per request, how many tokens to draft in the next step of the engine (or of
SpeculativeDecoder, the batch loop), from how its earlier drafts fared.

Verification keeps the output exact whatever the draft length; this only decides what drafting
costs. A rejected draft costs a verify step wider than a decode step and, in the engine, a step
that cannot run ahead of its sampled tokens (the drafter proposes from them). So each request
drafts while its drafts pay, stops when they keep failing (its steps are plain decodes, which
run ahead), and probes again now and then:

    state       drafting (length > 0)                    stopped (length = 0)
    next step   up to `length` draft nodes               none; at a probe step `probe_length`
    verified    acceptance <- (1 - alpha) acceptance     probe accepted something: drafting at
                 + alpha * accepted / depth              probe_length * 2, backoff reset;
                all accepted: length doubles (to max)    nothing: backoff doubles (to max_backoff)
                some rejected: length = accepted + 1
                `patience` steps in a row with nothing
                accepted, or acceptance < min_acceptance:
                stop
    probe step  -                                        an engine step that is a multiple of the
                                                         backoff, after the stop

`depth` is the deepest drafted node (a chain's length): a tree is judged by how much of its
best path was accepted. A step in which the drafter proposed nothing for a request counts as a
step with nothing accepted. Backoffs are powers of two and probes fall on their multiples, so
stopped requests probe in the same steps: the engine gives up running ahead once per probe step
for the whole batch, not once per request.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True)
class AdaptiveSpeculation:
    """Thresholds of the adaptive draft length (LLMEngine(adaptive_speculation=...)).

    alpha:          weight of the newest verify step in the acceptance average (0 < alpha <= 1)
    min_acceptance: below this average acceptance (accepted / drafted depth) a request stops drafting
    patience:       consecutive drafting steps with nothing accepted before a request stops
    min_backoff:    engine steps between the stop and the first probe (a power of two)
    max_backoff:    longest wait between probes (a power of two >= min_backoff)
    probe_length:   draft nodes of a probe
    """

    alpha: float = 0.5
    min_acceptance: float = 0.2
    patience: int = 2
    min_backoff: int = 4
    max_backoff: int = 64
    probe_length: int = 1

    def __post_init__(self):
        def pow2(n):
            return isinstance(n, int) and n >= 1 and n & (n - 1) == 0

        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"AdaptiveSpeculation: alpha: expected 0 < alpha <= 1, got {self.alpha!r}")
        if not 0.0 <= self.min_acceptance < 1.0:
            raise ValueError(f"AdaptiveSpeculation: min_acceptance: expected 0 <= value < 1, got {self.min_acceptance!r}")
        if not (isinstance(self.patience, int) and self.patience >= 1):
            raise ValueError(f"AdaptiveSpeculation: patience: expected an int >= 1, got {self.patience!r}")
        if not (pow2(self.min_backoff) and pow2(self.max_backoff) and self.min_backoff <= self.max_backoff):
            raise ValueError(f"AdaptiveSpeculation: min_backoff / max_backoff: expected powers of two, "
                             f"min <= max, got {self.min_backoff!r} / {self.max_backoff!r}")
        if not (isinstance(self.probe_length, int) and self.probe_length >= 1):
            raise ValueError(f"AdaptiveSpeculation: probe_length: expected an int >= 1, got {self.probe_length!r}")


@dataclass
class _State:
    length: int  # draft nodes wanted per step; 0: stopped
    acceptance: float = 1.0  # average accepted / drafted depth
    misses: int = 0  # drafting steps in a row with nothing accepted
    backoff: int = 1  # while stopped: probes at engine steps that are multiples of it
    stopped_at: int = 0  # the engine step of the stop or of the last failed probe


class DraftLengths:
    """Owns the per-request draft-length state of one driver (an LLMEngine, a SpeculativeDecoder).

    policy None: every request drafts up to max_length nodes in every step (no adaptation).
    Steps are numbered by the caller (LLMEngine.num_steps, SpeculativeDecoder's step count);
    wanted() is a function of the state and the step number only: the engine asks it once a step
    is scheduled (whether to read the launched step back first) and again while it builds the drafts.
    """

    def __init__(self, policy: AdaptiveSpeculation | None, max_length: int):
        self.policy, self.max_length = policy, max_length
        self._states: dict[Hashable, _State] = {}

    @classmethod
    def of(cls, setting, max_length: int, where: str) -> "DraftLengths":
        """From a driver's `adaptive_speculation` argument: True (the default thresholds), False (no
        adaptation) or an AdaptiveSpeculation; anything else is a ValueError naming `where`."""
        if not isinstance(setting, (bool, AdaptiveSpeculation)):
            raise ValueError(f"{where}: adaptive_speculation: expected a bool or an AdaptiveSpeculation, "
                             f"got {type(setting).__name__}")
        return cls(AdaptiveSpeculation() if setting is True else setting or None, max_length)

    def add(self, rid: Hashable) -> None:
        backoff = 1 if self.policy is None else self.policy.min_backoff
        self._states[rid] = _State(self.max_length, backoff=backoff)

    def remove(self, rid: Hashable) -> None:
        self._states.pop(rid, None)

    def wanted(self, rid: Hashable, step: int) -> int:
        """Draft nodes (root excluded) the request wants at engine step `step`; 0: a plain decode."""
        s = self._states.get(rid)
        if s is None:
            return 0
        if s.length > 0:
            return s.length
        if step > s.stopped_at and step % s.backoff == 0:
            return min(self.policy.probe_length, self.max_length)
        return 0

    def any_wanted(self, rids, step: int) -> bool:
        return any(self.wanted(r, step) > 0 for r in rids)

    def record(self, rid: Hashable, step: int, depth: int, accepted: int) -> None:
        """The outcome of the request's drafts at `step`: depth = the deepest drafted node (0: the
        drafter proposed nothing), accepted = drafts the target agreed with."""
        s, p = self._states.get(rid), self.policy
        if s is None or p is None:
            return
        if s.length == 0:  # a probe
            if accepted > 0:
                s.length = min(self.max_length, 2 * p.probe_length)
                s.acceptance, s.misses, s.backoff = accepted / depth, 0, p.min_backoff
            else:
                s.backoff, s.stopped_at = min(p.max_backoff, 2 * s.backoff), step
            return
        rate = accepted / depth if depth else 0.0
        s.acceptance = (1.0 - p.alpha) * s.acceptance + p.alpha * rate
        s.misses = s.misses + 1 if accepted == 0 else 0
        if s.misses >= p.patience or s.acceptance < p.min_acceptance:
            s.length, s.stopped_at = 0, step
        elif accepted == depth:
            if depth >= s.length:
                s.length = min(self.max_length, 2 * s.length)
        else:
            s.length = max(1, min(s.length, accepted + 1))
