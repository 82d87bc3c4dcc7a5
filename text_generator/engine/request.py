"""Request and RequestOutput: one request's state inside the reference engine, and what a step
reports about it.

A Request is created by LLMEngine.add_request, moved between the scheduler's waiting queue and
running list, and read by the engine after each forward step. Its token list is
`prompt_ids + output_ids`; `num_computed` of them have K/V in the cache (the block manager's
count); the rest are computed by the next steps:

    tokens:    p0 p1 p2 p3 p4 | o0 o1 o2
    computed:  [-------------- num_computed -------]   (o2, just sampled, is computed next step)

Preemption by recompute frees the blocks and sets num_computed back to 0; the outputs stay,
and the request re-enters as if its prompt were all its tokens.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
import torch

from text_generator.sampling import SamplingParams
from text_generator.structured import RequestGrammar


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RequestMetrics:
    """Wall-clock times (time.perf_counter seconds) of one request."""

    arrival_time: float
    first_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per output token

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies: gaps between consecutive output tokens."""
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]


@dataclass
class RequestOutput:
    """What one step (or generate) reports about one request.

    new_token_ids: tokens produced in this step ([] for an error / abort report)
    token_ids:     every output token so far (an engine with output_kind="delta": while the
                   request runs, only this step's, = new_token_ids; its final output has all)
    text:          detokenized output so far (None without a tokenizer); stop strings cut it
    delta_text:    the part of text that is new in this step
    finish_reason: None while running; "stop" (EOS, stop token or string), "length"
                   (max_new_tokens or max_seq_len), "abort", or "error" (message in `error`)
    logprobs:      per output token, its logprob (if SamplingParams.logprobs was set; rows of
                   token_ids, so only this step's while a "delta" request runs)
    top_logprobs:  per output token, {token_id: logprob} of the top-n (if logprobs > 0; the same)
    num_cached_tokens: prompt tokens served by the prefix cache at (first) admission
    metrics:       arrival / first-token / per-token / finish times
    """

    request_id: str
    prompt_token_ids: list[int]
    new_token_ids: list[int]
    token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None
    text: str | None = None
    delta_text: str | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
    num_cached_tokens: int = 0
    metrics: RequestMetrics | None = None


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    adapter: str | None = None
    cache_key: object = None  # the prefix-cache extra_key: the adapter's (name, load id), None for the base
    generator: torch.Generator | None = None
    grammar: RequestGrammar | None = None  # structured output: the grammar after output_ids
    output_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    num_computed: int = 0  # tokens with K/V in the cache
    num_registered: int = 0  # tokens the block manager knows (admitted + appended)
    # Run-ahead (LLMEngine async scheduling): the last `pending` entries of output_ids are
    # placeholders for tokens sampled on the device and not yet read back; final_pending: the
    # newest of them reaches the length limit, so the request is not scheduled again.
    pending: int = 0
    final_pending: bool = False
    finish_reason: str | None = None
    error: str | None = None
    text: str = ""  # reported text (what the deltas add up to)
    # decoded but not yet reported: it may be the start of a stop string (output.check_token)
    held_text: str = ""
    detokenizer: object | None = None  # engine/detokenizer.py, made at the first output token
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
    num_preemptions: int = 0
    num_cached_tokens: int | None = None  # set at the first admission
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.perf_counter()))

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def token_span(self, start: int, end: int) -> list[int]:
        """tokens[start:end] without building the whole list."""
        P = len(self.prompt_ids)
        if end <= P:
            return self.prompt_ids[start:end]
        if start >= P:
            return self.output_ids[start - P:end - P]
        return self.prompt_ids[start:] + self.output_ids[:end - P]

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED

    def finish(self, reason: str, error: str | None = None) -> None:
        self.status = RequestStatus.FINISHED
        self.finish_reason, self.error = reason, error
        self.metrics.finished_time = time.perf_counter()

    def output(self, new_token_ids: list[int], delta_text: str | None, has_tokenizer: bool,
               cumulative: bool = True) -> RequestOutput:
        """What this step reports. A finished request's output takes its lists as they are (nothing
        changes them any more); a running one's copies them (cumulative: every token so far, a
        snapshot) or, cumulative=False, holds only this step's tokens and logprob rows (an engine
        with output_kind="delta": no per-step copies of ever longer lists, nor their garbage)."""
        lps, tops = self.logprobs, self.top_logprobs
        if self.finished:
            ids = self.output_ids if not self.pending else self.output_ids[:len(self.output_ids) - self.pending]
        elif cumulative:
            ids = self.output_ids[:len(self.output_ids) - self.pending]
            lps = None if lps is None else lps[:]
            tops = None if tops is None else tops[:]
        else:  # row k of logprobs belongs to output token k: this step's are those of its new tokens
            end = len(self.output_ids) - self.pending
            start = end - len(new_token_ids)
            ids = new_token_ids
            lps = None if lps is None else lps[start:end]
            tops = None if tops is None else tops[start:end]
        return RequestOutput(self.request_id, self.prompt_ids, new_token_ids, ids, self.finished, self.finish_reason,
                             self.error, self.text if has_tokenizer else None, delta_text, lps, tops,
                             self.num_cached_tokens or 0, self.metrics)
