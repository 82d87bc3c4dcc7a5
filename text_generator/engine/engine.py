"""LLMEngine: the reference engine that drives TextGenerator.forward_tensor with continuous batching.

Requests come in through `add_request` (token ids or text; checked by admission.py) and leave
through the outputs of `step()`. One step:

    Scheduler.schedule()          -> chunks: (request, token span, KV slots)   [scheduler.py]
    flat tensors (one forward)    input_ids, position_ids, slots, block_tables, input_lengths,
                                  q_lens, lm_head_indices (last token of chunks that sample)  [forward.py]
    TextGenerator.forward_tensor  -> logits [num_sampling_requests, vocab]
    BlockManager.commit           computed tokens enter the prefix cache
    Sampler                       -> next tokens (+ logprobs)                  [sampling.py]
    stop checks, detokenization   -> RequestOutput per request with news       [output.py]

Structured requests (SamplingParams.structured) get a grammar at add_request
(text_generator/structured.py); their logits rows are masked before the Sampler, each emitted
token advances the grammar, and its termination ends the request with "stop".

Request-level problems (bad sampling parameters, a prompt longer than max_seq_len, an adapter
that is not loaded, a request the KV pool can never hold, its stream_callback or the tokenizer
raising on its text) finish that request with finish_reason "error" and a message, and free its
blocks; the others go on. A drafter that fails on a request stops drafting for it (plain steps).

Running ahead (async_scheduling) splits the Sampler from the stop checks across two steps
(runahead.py). The drafter's side of speculative decoding (when a step drafts, what the drafter
is told) is drafting.py's, the speculative step speculative/engine_step.py's; the KV cache's size,
when not given, kv_sizing.py's.
"""

from __future__ import annotations

import gc
import itertools
from dataclasses import replace
from typing import Callable, Sequence

import torch
from loguru import logger

from kv_manager import BlockManager
from kv_manager.memory import CPU_KV_BUDGET_BYTES
from text_generator.errors import ErrorCode, ForwardArgumentError, GeneratorStateError
from text_generator.engine.admission import check_adapter, check_params, check_prompt, make_grammar_compiler
from text_generator.engine.drafting import drafts_this_step, stop_drafting, update_drafter
from text_generator.engine.forward import forward_chunks
from text_generator.engine.kv_sizing import size_kv_cache
from text_generator.engine.output import append_tokens, describe, record_logprobs
from text_generator.engine.request import Request, RequestOutput
from text_generator.engine.runahead import InFlight, complete, launch
from text_generator.engine.scheduler import Scheduler
from text_generator.sampling import Sampler, SamplerOutput, SamplingParams
from text_generator.speculative.adaptive import AdaptiveSpeculation, DraftLengths
from text_generator.speculative.engine_step import MAX_TREE_NODES, can_draft, speculative_step
from text_generator.speculative.hidden_feed import HiddenFeed
from text_generator.structured import GrammarCompiler, mask_logits_


class LLMEngine:
    """Owns the KV cache, the block manager, the scheduler and every live request.

    generator:   a TextGenerator (anything with its forward_tensor / allocate_kv_cache / config)
    num_blocks:  KV blocks to allocate; None: sized here (kv_manager.default_num_blocks) from
                 kv_memory_fraction of the free memory on CUDA, elsewhere enough for max_num_seqs
                 x max_seq_len tokens within kv_cpu_budget_bytes; under tensor parallelism the
                 ranks agree on the smallest count
    block_size:  tokens per block
    max_num_seqs: running requests at most; max_num_batched_tokens: tokens per step at most
    max_seq_len: longest prompt + output (default and limit: the model's max positions)
    tokenizer:   anything with encode(str) -> ids, decode(ids) -> str, eos_token_id; or None
                 (then prompts are token ids and outputs carry no text)
    eos_token_id: overrides the tokenizer's
    speculative: a drafter (text_generator.speculative's NgramDrafter, DraftModelDrafter,
                 Eagle3Drafter, or anything with start / propose / update / finish) for
                 speculative decoding of greedy requests in decode-only steps
                 (speculative/engine_step.py); None: off. A drafter with `hidden_layers` (EAGLE-3)
                 gets the target's hidden states of every token of its requests
                 (speculative/hidden_feed.py; their steps replay graphs captured with the states)
    adaptive_speculation: True (default thresholds), an AdaptiveSpeculation (its thresholds) or
                 False: per request, shrink the draft length as drafts fail, stop drafting for a
                 request whose drafts keep failing and probe again now and then
                 (speculative/adaptive.py); False: every drafting request drafts in every step
    freeze_gc:   gc.freeze() once constructed (see __init__); False leaves the collector alone
    output_kind: "cumulative" (default): every output carries the request's tokens, logprobs and
                 text so far (copies: a snapshot per step); "delta": a running request's outputs
                 carry only the step's tokens and logprob rows (token_ids = new_token_ids), its final
                 output all of them, as vLLM's RequestOutputKind.DELTA; for a consumer that keeps its
                 own copy (the server), it saves the per-step copies and their garbage collection
                 (8-13% of the host time of 128-request decode steps, tiny model on the CPU)
    async_scheduling: run ahead of the sampled tokens (see step()); None: on CUDA. A step
                 in which a request drafts runs in the plain order (the drafter proposes from its
                 accepted tokens, see drafting.drafts_this_step), as do steps while a live request uses penalties
                 or structured output; steps in which no request drafts (sampled requests,
                 requests whose drafting stopped, steps with prefill chunks) run ahead with a
                 drafter set.
    kv_cache_dtype: "auto" / None (the model's dtype) or "fp8" / "fp8_e4m3" / torch.float8_e4m3fn: an e4m3 cache
                 with the generator's per-layer kv_scales, one byte per element (twice the blocks
                 of a 16-bit cache in the same memory when the engine sizes it)
    """

    def __init__(
        self,
        generator,
        *,
        num_blocks: int | None = None,
        block_size: int = 16,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        enable_prefix_caching: bool = True,
        max_seq_len: int | None = None,
        tokenizer=None,
        eos_token_id: int | None = None,
        watermark: float = 0.01,
        sampler: Sampler | None = None,
        speculative=None,
        adaptive_speculation: "bool | AdaptiveSpeculation" = True,
        freeze_gc: bool = True,
        output_kind: str = "cumulative",
        async_scheduling: bool | None = None,
        kv_memory_fraction: float = 0.9,
        kv_cpu_budget_bytes: int = CPU_KV_BUDGET_BYTES,
        kv_cache_dtype=None,
    ):
        if speculative is not None and not all(hasattr(speculative, m) for m in ("start", "propose", "update", "finish")):
            raise ValueError(f"LLMEngine: speculative: expected a drafter with start / propose / update / finish, "
                             f"got {type(speculative).__name__}")
        draft_lengths = DraftLengths.of(adaptive_speculation, MAX_TREE_NODES - 1, "LLMEngine")  # checked first
        if output_kind not in ("cumulative", "delta"):
            raise ValueError(f"LLMEngine: output_kind: expected 'cumulative' or 'delta', got {output_kind!r}")
        if not (isinstance(block_size, int) and block_size >= 1):
            raise ValueError(f"LLMEngine: block_size: expected an int >= 1, got {block_size!r}")
        if num_blocks is not None and not (isinstance(num_blocks, int) and num_blocks >= 1):
            raise ValueError(f"LLMEngine: num_blocks: expected an int >= 1 or None (sized from memory), "
                             f"got {num_blocks!r}")
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError(f"LLMEngine: expected max_num_seqs >= 1 and max_num_batched_tokens >= 1, "
                             f"got {max_num_seqs} and {max_num_batched_tokens}")
        model_max = generator.max_position_embeddings
        if max_seq_len is None:
            max_seq_len = model_max
        if not 2 <= max_seq_len <= model_max:
            raise ValueError(f"LLMEngine: expected 2 <= max_seq_len <= the model's limit {model_max}, got {max_seq_len}")
        self.generator = generator
        self.tokenizer = tokenizer
        self.cumulative_outputs = output_kind == "cumulative"
        self.eos_token_id = eos_token_id if eos_token_id is not None else getattr(tokenizer, "eos_token_id", None)
        self.max_seq_len = max_seq_len
        self.block_size = block_size
        kv_dtype = None if kv_cache_dtype in (None, "auto") else kv_cache_dtype
        if kv_dtype is not None:  # refused here (TG_INVALID_KV_CACHE_DTYPE) before anything is allocated
            generator.kv_cache_dtype(kv_dtype)
        if num_blocks is None:
            num_blocks = size_kv_cache(generator, block_size, max_seq_len, max_num_seqs, kv_memory_fraction,
                                       kv_cpu_budget_bytes, kv_dtype)
        self.kv_cache = generator.allocate_kv_cache(num_blocks, block_size) if kv_dtype is None else \
            generator.allocate_kv_cache(num_blocks, block_size, dtype=kv_dtype)
        watermark_blocks = min(int(watermark * num_blocks), num_blocks - 1)
        self.block_manager = BlockManager(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching,
                                          watermark_blocks=watermark_blocks)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=max_num_batched_tokens)
        self.sampler = sampler if sampler is not None else Sampler()
        self.requests: dict[str, Request] = {}
        self._reports: list[RequestOutput] = []  # errors / aborts to report at the next step
        self._callbacks: dict[str, Callable[[RequestOutput], None]] = {}
        self._ids = itertools.count()
        self.drafter = speculative
        self._drafting: set[str] = set()  # requests the drafter has started
        self.draft_lengths = draft_lengths  # per request: drafts wanted per step
        layers = getattr(speculative, "hidden_layers", None)
        self.hidden_feed = HiddenFeed(layers) if layers else None  # target states for the drafter
        self.num_steps = 0
        self.num_preemptions = 0
        self.device_wait_s = 0.0  # running ahead: host time spent waiting for launched steps (runahead.complete)
        self.num_scheduled_tokens = 0  # tokens computed by the steps so far (decode rows, prompt chunks, drafts)
        self.num_draft_tokens = 0  # proposed by the drafter and run through the model
        self.num_accepted_tokens = 0
        if async_scheduling is None:
            async_scheduling = torch.device(generator.device).type == "cuda"
        self.async_scheduling = bool(async_scheduling)
        self._inflight: InFlight | None = None  # a launched step whose tokens are still on the device
        self._history_reqs: set[str] = set()  # live requests whose sampling reads their output history
        self._draft_reqs: set[str] = set()  # live requests the drafter may draft for (engine_step.can_draft)
        self._grammars: GrammarCompiler | None = None  # built at the first structured request
        self._adapter_keys: set = set()  # prefix-cache keys ((adapter, load id)) given to requests
        if freeze_gc:
            # What is alive now (the model, its CUDA graphs, every imported module: ~10^5-10^6
            # objects) leaves the garbage collector's generations, as serving engines do after
            # start-up: otherwise each full collection rescans all of it, tens of ms at a time,
            # inside steps. Frozen objects are still freed by reference counting.
            gc.freeze()

    # -- requests --------------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | Sequence[int] | torch.Tensor,
        sampling_params: SamplingParams | dict | None = None,
        *,
        adapter: str | None = None,
        request_id: str | None = None,
        stream_callback: Callable[[RequestOutput], None] | None = None,
    ) -> str:
        """Queue a request; returns its id. A problem with the request itself does not raise:
        the request finishes with finish_reason "error" in the next step's outputs (and its id
        is free again). Raises ValueError for a request_id that is still live or a stream_callback
        that is not callable, and a coded error for structured output that cannot be had
        (ForwardArgumentError INVALID_STRUCTURED_OUTPUT: xgrammar does not compile it;
        GeneratorStateError STRUCTURED_OUTPUT_UNAVAILABLE: no xgrammar or no tokenizer); then no
        request is left behind."""
        rid = str(request_id) if request_id is not None else f"req-{next(self._ids)}"
        if rid in self.requests:
            raise ValueError(f"add_request: request_id {rid!r} is already live")
        if stream_callback is not None and not callable(stream_callback):
            raise ValueError(f"add_request: stream_callback: expected a callable or None, "
                             f"got {type(stream_callback).__name__}")
        req = Request(rid, [], SamplingParams())
        self.requests[rid] = req
        if stream_callback is not None:
            self._callbacks[rid] = stream_callback
        try:
            req.params = check_params(sampling_params, self.tokenizer)
            req.prompt_ids = check_prompt(prompt, self.tokenizer, self.generator.vocab_size, self.max_seq_len)
            req.adapter = check_adapter(adapter, list(self.generator.loaded_adapters()))
            if req.adapter is not None:
                req.cache_key = self.generator.adapter_cache_key(req.adapter)
            req.generator = req.params.make_generator(self.generator.device)
        except Exception as e:  # anything wrong with this request (a TypeError from a bad params
            # dict, a tokenizer raising) fails it alone; the id must not stay taken
            self._reports.append(self._end(req, "error", describe(e)))
            return rid
        if req.params.structured is not None:
            try:
                if self._grammars is None:
                    self._grammars = make_grammar_compiler(self.tokenizer, self.generator.vocab_size,
                                                           self.eos_token_id)
                req.grammar = self._grammars.compile(req.params.structured)
            except (ForwardArgumentError, GeneratorStateError):
                del self.requests[rid]
                self._callbacks.pop(rid, None)
                raise
        p = req.params
        if p.has_penalties or req.grammar is not None:
            self._history_reqs.add(rid)
        if self.drafter is not None:
            if can_draft(p):
                self._draft_reqs.add(rid)
                self.draft_lengths.add(rid)
        if req.cache_key is not None:
            self._adapter_keys.add(req.cache_key)
        self.scheduler.add(req)
        return rid

    def abort(self, request_id: str) -> bool:
        """Stop a live request; it is reported with finish_reason "abort" at the next step.
        Returns False if no live request has this id."""
        req = self.requests.get(request_id) if isinstance(request_id, str) else None
        if req is None or req.finished:
            return False
        self._reports.append(self._end(req, "abort"))
        return True

    def is_drafting(self, request_id: str) -> bool:
        """Whether the drafter has started this request (its first token was emitted)."""
        return request_id in self._drafting

    def has_unfinished(self) -> bool:
        """Whether a live request or an unreported output remains. (A launched step whose
        requests all finished meanwhile, e.g. on a stop token it ran ahead of, holds nothing to
        report; the next step() reads it back and drops it.)"""
        return self.scheduler.has_unfinished() or bool(self._reports)

    def _end(self, req: Request, reason: str, error: str | None = None):
        """Finish req with no new token and return its final output (errors, aborts)."""
        self._finish(req, reason, error)
        return req.output([], None, self.tokenizer is not None)

    def _finish(self, req: Request, reason: str, error: str | None = None) -> None:
        if req.request_id in self._drafting:
            self._drafting.discard(req.request_id)
            self.drafter.finish(req.request_id)
        self.scheduler.remove(req)
        self._history_reqs.discard(req.request_id)
        self._draft_reqs.discard(req.request_id)
        self.draft_lengths.remove(req.request_id)
        if self.hidden_feed is not None:
            self.hidden_feed.drop(req.request_id)
        req.finish(reason, error)
        del self.requests[req.request_id]
        if error is not None:
            logger.warning("request {} failed: {}", req.request_id, error)

    # -- the step --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run one forward step, sample; returns an output for every request that got
        a token, finished, failed or was aborted since the last step.

        Running ahead (async_scheduling): the step's sampled tokens stay on the device; the next
        step() schedules and launches its forward with them (forward_tensor's prev_token_ids)
        before reading them back, then reads them, checks stops and reports them. So the host's
        scheduling, validation and attention planning overlap the device's previous step, and
        outputs come one step() later. Requests that finish on a token the device ran ahead of
        have that extra row discarded. A scheduled step in which a request drafts reads the
        launched step back first (the drafter proposes from its tokens), then runs in the plain
        order."""
        if self._adapter_keys:
            self._drop_stale_adapters()
        outputs, self._reports = self._reports, []
        prev, self._inflight = self._inflight, None
        if prev is not None and not self._may_run_ahead():
            outputs += complete(self, prev)
            prev = None
        sched = self.scheduler.schedule()
        self.num_preemptions += len(sched.preempted)
        for req, why in sched.failed:
            outputs.append(self._end(req, "error", why))
        if sched.chunks:
            self.num_steps += 1
            self.num_scheduled_tokens += len(sched.slots)
            if prev is not None and drafts_this_step(self, sched.chunks):
                outputs += complete(self, prev)  # (may finish some of the scheduled requests)
                prev = None
                keep = [i for i, c in enumerate(sched.chunks) if not c.request.finished]
                sched = replace(sched, chunks=[sched.chunks[i] for i in keep], slots=sched.slots[keep])
            if sched.chunks:
                outputs += self._run(sched, prev)
        if prev is not None:
            outputs += complete(self, prev)
        self._notify(outputs)
        return outputs

    def _drop_stale_adapters(self) -> None:
        """Adapters unloaded (or unloaded and loaded again under the same name) since requests
        took their cache keys: those requests fail (their K/V came from weights that are gone),
        and the prefix cache drops the blocks of the old key, which no request can reach now."""
        stale = set()
        for key in self._adapter_keys:
            name = key[0]
            if name not in self.generator.loaded_adapters() or self.generator.adapter_cache_key(name) != key:
                stale.add(key)
        if not stale:
            return
        for req in [r for r in self.requests.values() if r.cache_key in stale and not r.finished]:
            name = req.adapter
            why = (f"adapter {name!r} was reloaded since the request started (its K/V came from the "
                   f"unloaded weights)" if name in self.generator.loaded_adapters()
                   else f"adapter {name!r} is no longer loaded")
            self._reports.append(self._end(req, "error", why))
        for key in stale:
            self.block_manager.drop_cached(key)
        self._adapter_keys -= stale

    def _run(self, sched, prev: InFlight | None) -> list[RequestOutput]:
        if self.drafter is not None and prev is None and all(c.is_decode for c in sched.chunks):
            # (prev is None whenever a request drafts in this step: step() read it back)
            spec = speculative_step(self, sched.chunks)
            if spec is not None:
                return spec
        try:
            logits = forward_chunks(self, sched.chunks, sched.slots, prev)
        except ForwardArgumentError as e:
            if e.code is not ErrorCode.ADAPTER_NOT_LOADED:
                raise
            # An adapter was unloaded while its requests ran: fail those, retry the rest next
            # step (nothing was committed, so they are simply scheduled again).
            loaded = set(self.generator.loaded_adapters())
            outputs = []
            for c in sched.chunks:
                if c.request.adapter is not None and c.request.adapter not in loaded and not c.request.finished:
                    outputs.append(self._end(c.request, "error", f"adapter {c.request.adapter!r} is no longer loaded"))
            return outputs
        for c in sched.chunks:
            c.request.num_computed = c.start + c.num_tokens
        sampled = [c.request for c in sched.chunks if c.needs_sample]
        if self._may_run_ahead():
            self._inflight = launch(self, logits, sched.chunks, sampled)
            return []
        self.block_manager.commit_many([c.request.request_id for c in sched.chunks],
                                       [c.request.num_computed for c in sched.chunks])
        return self.sample(logits, sampled)

    def _may_run_ahead(self) -> bool:
        """Whether the next step may be launched before this one's tokens are on the host: not
        while a live request's sampling reads its own output history (penalties; a grammar,
        which masks a token only once it has accepted the previous one). Drafting requests run
        ahead in the steps in which they do not draft (a hidden-state drafter's rows wait in
        hidden_feed, by position, for their tokens);
        a step in which one drafts (drafting.drafts_this_step) reads the launched step back before it runs. The
        machinery is runahead.py's."""
        return self.async_scheduling and not self._history_reqs

    # -- tokens out ------------------------------------------------------------------------
    def sample(self, logits: torch.Tensor, reqs: list[Request]) -> list[RequestOutput]:
        """Sample one token per row of logits [len(reqs), vocab] for reqs (their params, penalties,
        seeds) and emit it: -> each request's RequestOutput of the step."""
        if not reqs:
            return []
        out = self.sample_on_device(logits, reqs)
        return self.emit_sampled(reqs, out, out.token_ids.tolist())  # the step's one device -> host sync

    def sample_on_device(self, logits: torch.Tensor, reqs: list[Request]) -> SamplerOutput:
        """The Sampler over logits [len(reqs), vocab] (grammar masks first): tokens left on the
        device, for the caller to read back with whatever else it needs from the step."""
        if any(r.grammar is not None for r in reqs):
            logits = mask_logits_(logits.float().contiguous(), [r.grammar for r in reqs])
        return self.sampler(
            logits, [r.params for r in reqs], prompt_ids=[r.prompt_ids for r in reqs],
            output_ids=[r.output_ids for r in reqs], generators=[r.generator for r in reqs])

    def emit_sampled(self, reqs: list[Request], out: SamplerOutput, tokens: list[int]) -> list[RequestOutput]:
        """Emit sample_on_device's tokens (read back: `tokens`), with logprobs where asked."""
        lps = out.logprobs.tolist() if out.logprobs is not None else None
        top_ids = out.top_token_ids.tolist() if out.top_token_ids is not None else None
        top_lps = out.top_logprobs.tolist() if out.top_logprobs is not None else None
        outputs = []
        for i, (req, tok) in enumerate(zip(reqs, tokens)):
            if req.params.logprobs is not None:
                record_logprobs(req, i, lps, top_ids, top_lps)
            outputs.append(self.emit(req, [tok]))
        return outputs

    def emit(self, req: Request, toks: list[int], at: int | None = None) -> RequestOutput:
        """Append new tokens (one, or a speculative step's accepted run) with their stop checks
        (output.append_tokens; at: the token already stands at output_ids[at], a run-ahead
        placeholder just replaced); finish the request or tell the drafter -> its RequestOutput."""
        done = append_tokens(req, toks, at, eos_token_id=self.eos_token_id, max_seq_len=self.max_seq_len,
                             tokenizer=self.tokenizer)
        if done.reason is not None:
            self._finish(req, done.reason, done.error)
        elif req.request_id in self._draft_reqs:  # (requests that never draft are not the drafter's)
            update_drafter(self, req, done.new)
        return req.output(done.new, done.delta, self.tokenizer is not None, self.cumulative_outputs)

    def stop_drafting(self, request_ids, error: Exception) -> None:
        """The drafter failed on these requests: they decode without drafts from now on
        (drafting.stop_drafting; called by the speculative step too)."""
        stop_drafting(self, request_ids, error)

    def _notify(self, outputs: list[RequestOutput]) -> None:
        """Call each output's stream_callback. One that raises fails its own request (reported
        with finish_reason "error" at the next step, blocks freed, never called again); the
        other callbacks still run."""
        for o in outputs:
            cb = self._callbacks.pop(o.request_id, None) if o.finished else self._callbacks.get(o.request_id)
            if cb is None:
                continue
            try:
                cb(o)
            except Exception as e:
                self._callbacks.pop(o.request_id, None)
                req = self.requests.get(o.request_id)
                why = f"its stream_callback raised {describe(e)}"
                if req is None or req.finished:
                    logger.warning("request {}: {} on its final output", o.request_id, why)
                    continue
                self._reports.append(self._end(req, "error", why))

    # -- offline use -----------------------------------------------------------------------
    def generate(
        self,
        prompts: Sequence[str | Sequence[int]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        adapters: str | Sequence[str | None] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Run prompts to completion; returns their final outputs in prompt order."""
        n = len(prompts)
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * n
        adapter_list = list(adapters) if isinstance(adapters, (list, tuple)) else [adapters] * n
        if len(params_list) != n or len(adapter_list) != n:
            raise ValueError(f"generate: expected params and adapters for each of the {n} prompts")
        ids = [self.add_request(p, sp, adapter=a) for p, sp, a in zip(prompts, params_list, adapter_list)]
        final: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=n, desc="generate", unit="req")
        wanted = set(ids)
        while len(final) < n:
            for o in self.step():
                if o.finished and o.request_id in wanted:
                    final[o.request_id] = o
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [final[i] for i in ids]

