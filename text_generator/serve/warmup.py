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
such steps per 512-request pass of bench_serve on an H100, ~3% of it). Afterwards nothing of it
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
    graphs = getattr(getattr(engine.generator, "model_wrapper", None), "graphs", None)
    if getattr(graphs, "mixed", None) is not None:
        graphs.mixed.capture(engine.kv_cache, engine.block_size, max_tokens=sched.max_num_batched_tokens,
                             max_requests=sched.max_num_seqs)
    engine.block_manager.reset_prefix_cache()
    engine.num_draft_tokens = engine.num_accepted_tokens = 0
    return n
