"""The server's start-up pass: every shape it will meet, run once before /health says ready.

On CUDA the first decode step at each batch bucket captures that bucket's graph and the first
steps of a kind compile their Triton kernels: seconds each, which a client would otherwise see as
a stall (and a benchmark as throughput). warm_up runs max_num_seqs requests: one with a prompt of a full
max_num_batched_tokens prefill chunk that then decodes to the end, the others with short prompts
stopping after 2, 3, ... tokens, so that the running batch passes through every size from
max_num_seqs down to 1; half of them ask for logprobs. Afterwards nothing of it remains: no request, every block free (the prefix cache
reset), the speculation counters at zero. Deterministic (token ids from a formula), so that the TP
ranks, which all run it, step in lockstep.
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
    engine.block_manager.reset_prefix_cache()
    engine.num_draft_tokens = engine.num_accepted_tokens = 0
    return n
