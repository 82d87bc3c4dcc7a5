"""Prometheus metrics of one server: request counters, latency histograms, engine gauges.

The HTTP process records them as the engine process's outputs arrive (engine_client.py):
`on_tokens` per request per step, `on_finished` per finished request, `on_stats` per step with
the engine's own counts. Latencies are measured at the server: arrival of the HTTP request to
the arrival of its tokens from the engine. Each server has its own CollectorRegistry,
so several servers in one process (tests) do not collide; /metrics renders it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96)
_ITL_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("tg_requests", "Finished requests, by finish reason", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("tg_prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.cached_prompt_tokens = Counter("tg_prefix_cache_hit_tokens", "Prompt tokens served by the prefix cache",
                                            registry=r)
        self.generation_tokens = Counter("tg_generation_tokens", "Output tokens of finished requests", registry=r)
        self.ttft = Histogram("tg_time_to_first_token_seconds", "Arrival at the server to the first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("tg_inter_token_latency_seconds", "Gap between consecutive output tokens",
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("tg_e2e_request_latency_seconds", "Arrival at the server to the last token",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.waiting = Gauge("tg_num_requests_waiting", "Requests queued (server queue + scheduler)", registry=r)
        self.running = Gauge("tg_num_requests_running", "Requests in the running batch", registry=r)
        self.steps = Gauge("tg_engine_steps", "Engine steps run since the server started", registry=r)
        self.kv_usage = Gauge("tg_kv_cache_usage_ratio", "KV blocks held by live requests / all blocks", registry=r)
        self.prefix_hit_rate = Gauge("tg_prefix_cache_hit_rate", "Prompt tokens served by the prefix cache / "
                                     "prompt tokens, over finished requests", registry=r)
        self.spec_acceptance = Gauge("tg_spec_decode_acceptance_rate", "Accepted draft tokens / draft tokens "
                                     "(0 without speculative decoding)", registry=r)
        self._prompt, self._cached = 0, 0

    def on_tokens(self, gap: float, n: int, *, first: bool) -> None:
        """n tokens of one request reached the server gap seconds after its previous ones (after
        its arrival, for the first): a TTFT, or n inter-token gaps of gap / n each."""
        if first:
            self.ttft.observe(max(gap, 0.0))
            n -= 1
            gap = 0.0
        for _ in range(n):
            self.itl.observe(gap / n)

    def on_finished(self, reason: str, prompt_len: int, cached: int, num_tokens: int, e2e: float | None) -> None:
        """A request ended: reason (stop / length / abort / error), its prompt and prefix-cache
        hit lengths, its output tokens, arrival to its last token (None: it got none)."""
        self.requests.labels(finish_reason=reason).inc()
        self.prompt_tokens.inc(prompt_len)
        self.cached_prompt_tokens.inc(cached)
        self.generation_tokens.inc(num_tokens)
        self._prompt += prompt_len
        self._cached += cached
        if self._prompt:
            self.prefix_hit_rate.set(self._cached / self._prompt)
        if e2e is not None:
            self.e2e.observe(max(e2e, 0.0))

    def on_stats(self, stats) -> None:
        """stats: engine_worker.Stats, sent by the engine process with each step's outputs."""
        self.waiting.set(stats.waiting)
        self.running.set(stats.running)
        self.steps.set(stats.steps)
        self.kv_usage.set(stats.used_blocks / stats.num_blocks)
        if stats.draft_tokens:
            self.spec_acceptance.set(stats.accepted_tokens / stats.draft_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
