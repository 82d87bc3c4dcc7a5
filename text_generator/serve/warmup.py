"""The server's start-up pass: every shape it will meet, run once before /health says ready.

On CUDA the first decode step at each batch bucket captures that bucket's graph and the first
steps of a kind compile their Triton kernels: seconds each, which a client would otherwise see as
a stall (and a benchmark as throughput). warm_up runs max_num_seqs requests: one with a prompt of a full
max_num_batched_tokens prefill chunk that then decodes to the end, the others with short prompts
stopping after 2, 3, ... tokens, so that the running batch passes through every size from
max_num_seqs down to 1; half of them ask for logprobs. Then every mixed-step graph bucket a step of
this engine can replay (model_wrapper/mixed_graph.py: prompt chunks beside decodes, up to
max_num_batched_tokens tokens and max_num_seqs requests) is captured: which ones a served run meets
depends on when its requests arrive, and each met for the first time cost a step 0.1-0.2 s (three
such steps per 512-request pass of bench_serve on an H100, ~3% of it). Between the two, full steps
(max_num_batched_tokens tokens: several prompts where max_seq_len is shorter than a chunk) beside
d running decodes for d from 1 to max_num_seqs - 1 in powers of two and their midpoints, with an odd
token count every other time: such a step runs eagerly, and its kernels compile for what it
passes (the decode rows' split-KV launch, which depends on d; token counts that are or are not
multiples of 16, which Triton specializes on). Without it the first such steps of a served run
compiled them: on an H100 five steps of 1.0-1.5 s in a 256-request pass with an FP8 KV cache
(the engine row of bench_fp8 at 0.66x bf16's throughput), two of 0.8 s with bf16. Afterwards nothing of it
remains: no request, every block free (the prefix cache reset), the speculation counters at zero.
Deterministic (token ids from a formula, buckets in a fixed order), so that the TP ranks, which all
run it, step and capture in lockstep.
"""

from __future__ import annotations

from text_generator.sampling import SamplingParams


def warm_up(engine) -> int:
    """Run the start-up pass on an idle engine -> the number of requests it ran."""
    sched, vocab = engine.scheduler, engine.generator.vocab_size
    max_len = engine.max_seq_len or engine.generator.max_position_embeddings
    n = max(1, min(sched.max_num_seqs, max_len - 2))
    prompts, params = [], []
    for i in range(n):
        # request 0: one full prefill chunk, then it decodes to the end (in every batch); request i
        # (i >= 1) stops after i + 1 tokens: one request leaves the batch per step
        plen = max(1, min(sched.max_num_batched_tokens, max_len - n - 2)) if i == 0 else min(4, max_len - n - 1)
        new = max(1, min(n + 1 if i == 0 else i + 1, max_len - plen))
        prompts.append([3 + (7 * i + 13 * k) % max(vocab - 3, 1) for k in range(plen)])
        params.append(SamplingParams(temperature=0.0, max_new_tokens=new, ignore_eos=True,
                                     logprobs=1 if i % 2 else None))
    engine.generate(prompts, params, use_tqdm=False)
    _full_mixed_steps(engine, n, max_len, vocab)
    graphs = getattr(getattr(engine.generator, "model_wrapper", None), "graphs", None)
    if getattr(graphs, "mixed", None) is not None:
        graphs.mixed.capture(engine.kv_cache, engine.block_size, max_tokens=sched.max_num_batched_tokens,
                             max_requests=sched.max_num_seqs)
    engine.block_manager.reset_prefix_cache()
    engine.num_draft_tokens = engine.num_accepted_tokens = 0
    return n


def _decode_counts(most: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, 24, ... below `most`, and most - 1."""
    out, p = set(), 1
    while p < most:
        out.update(x for x in (p, p + p // 2) if 1 <= x < most)
        p *= 2
    if most > 1:
        out.add(most - 1)
    return sorted(out)


def _full_mixed_steps(engine, max_seqs: int, max_len: int, vocab: int) -> None:
    """For each decode count d: d short requests prefilled and decoding, then prompts filling the rest of
    one max_num_batched_tokens step; the step that runs them all is timed by nothing, then every request is
    aborted (blocks freed)."""
    budget = engine.scheduler.max_num_batched_tokens
    plen = max(1, min(budget, max_len - 2))

    def tok(i: int, k: int) -> int:
        return 3 + (11 * i + 17 * k) % max(vocab - 3, 1)

    for j, d in enumerate(_decode_counts(max_seqs)):
        rest = budget - d - (j % 2)  # odd / even token counts in turn
        if rest < 1:
            continue
        short = SamplingParams(temperature=0.0, max_new_tokens=max(2, min(8, max_len - 5)), ignore_eos=True)
        ids = [engine.add_request([tok(i, k) for k in range(4)], short) for i in range(d)]
        engine.step()  # the short prompts' prefill: next step they decode
        long = SamplingParams(temperature=0.0, max_new_tokens=1, ignore_eos=True)
        for i in range(-(-rest // plen)):
            n = min(plen, rest - i * plen)
            ids.append(engine.add_request([tok(1000 + i, k) for k in range(n)], long))
        engine.step()  # d decodes + `rest` prompt tokens (as the scheduler packs them)
        for rid in ids:
            engine.abort(rid)
        while engine.has_unfinished():
            engine.step()
        engine.block_manager.reset_prefix_cache()  # the next round's prompts must compute, not hit the cache
