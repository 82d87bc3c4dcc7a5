"""Prometheus metrics of one server: request counters, latency histograms, engine gauges.

The engine thread records them (prometheus_client's metrics are thread-safe): `on_finished` for
each finished request, `on_step` after each step. Each server has its own CollectorRegistry,
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
        self.kv_usage = Gauge("tg_kv_cache_usage_ratio", "KV blocks held by live requests / all blocks", registry=r)
        self.prefix_hit_rate = Gauge("tg_prefix_cache_hit_rate", "Prompt tokens served by the prefix cache / "
                                     "prompt tokens, over finished requests", registry=r)
        self.spec_acceptance = Gauge("tg_spec_decode_acceptance_rate", "Accepted draft tokens / draft tokens "
                                     "(0 without speculative decoding)", registry=r)
        self._prompt, self._cached = 0, 0

    def on_finished(self, out, arrival: float) -> None:
        """out: a finished RequestOutput; arrival: time.perf_counter() when the server got it."""
        self.requests.labels(finish_reason=out.finish_reason or "unknown").inc()
        n_prompt = len(out.prompt_token_ids)
        self.prompt_tokens.inc(n_prompt)
        self.cached_prompt_tokens.inc(out.num_cached_tokens)
        self.generation_tokens.inc(len(out.token_ids))
        self._prompt += n_prompt
        self._cached += out.num_cached_tokens
        if self._prompt:
            self.prefix_hit_rate.set(self._cached / self._prompt)
        m = out.metrics
        if m is None or m.first_token_time is None:
            return
        self.ttft.observe(max(m.first_token_time - arrival, 0.0))
        for gap in m.itls:
            self.itl.observe(gap)
        if m.token_times:
            self.e2e.observe(max(m.token_times[-1] - arrival, 0.0))

    def on_step(self, engine, queued: int) -> None:
        """engine: the LLMEngine after a step; queued: commands not yet handed to it."""
        sched, bm = engine.scheduler, engine.block_manager
        self.waiting.set(len(sched.waiting) + queued)
        self.running.set(len(sched.running))
        self.kv_usage.set(bm.num_used_blocks / bm.num_blocks)
        if engine.num_draft_tokens:
            self.spec_acceptance.set(engine.num_accepted_tokens / engine.num_draft_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
