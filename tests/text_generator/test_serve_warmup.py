"""The server's start-up pass (text_generator/serve/warmup.py), run here on a CPU engine: it takes
the running batch through every size from max_num_seqs down to 1 behind a full prefill chunk, and
leaves nothing behind (no request, every block free, speculation counters at zero), so that the
next answer is still transformers' greedy."""

from __future__ import annotations

import pytest

from serve_fixtures import greedy, make_chat_checkpoint, make_tokenizer
from conftest import hf_model

pytestmark = pytest.mark.usefixtures("one_thread")


def test_warm_up_runs_every_batch_size_and_leaves_the_engine_as_new(tmp_path):
    from text_generator import LLMEngine, SamplingParams, TextGenerator
    from text_generator.serve.warmup import warm_up

    path = make_chat_checkpoint(tmp_path)
    tok = make_tokenizer()
    engine = LLMEngine(TextGenerator.from_pretrained(path, device="cpu"), num_blocks=8 * 16 + 1, block_size=4,
                       max_num_seqs=8, max_num_batched_tokens=32, max_seq_len=64, tokenizer=tok)
    sizes, chunk = [], []
    step = engine.step

    def recording_step():  # what each step ran: decode batch size, prompt tokens scheduled
        outs = step()
        sizes.append(len(engine.scheduler.running))
        chunk.append(sum(len(o.new_token_ids) for o in outs))
        return outs

    engine.step = recording_step
    tokens = []  # tokens of each forward call
    forward = engine.generator.forward_tensor

    def recording_forward(input_ids, *args, **kwargs):
        tokens.append(int(input_ids.numel()))
        return forward(input_ids, *args, **kwargs)

    engine.generator.forward_tensor = recording_forward
    assert warm_up(engine) == 8
    del engine.generator.forward_tensor
    assert set(range(1, 9)) <= set(sizes) | {0}, sizes  # the batch shrank through every size
    # full steps (several 62-token prompts where max_seq_len is shorter than the chunk) beside running
    # decodes, with an even and an odd token count
    assert {32, 31} <= set(tokens), str(tokens)
    bm = engine.block_manager
    assert not engine.requests and not engine.has_unfinished()
    assert bm.num_used_blocks == 0 and bm.num_cached_blocks == 0 and bm.num_free_blocks == bm.num_blocks
    assert engine.num_draft_tokens == engine.num_accepted_tokens == 0
    ids = tok("the quick brown fox").input_ids
    out = engine.generate([ids], SamplingParams(temperature=0.0, max_new_tokens=6), use_tqdm=False)[0]
    assert out.token_ids == greedy(hf_model(path), ids, 6)


@pytest.mark.cuda
def test_on_cuda_warm_up_captures_every_mixed_bucket_and_served_steps_capture_none(tmp_path):
    """After the start-up pass the mixed-step graphs hold every (tokens, requests) bucket that a step of
    at most max_num_batched_tokens tokens and max_num_seqs requests replays (enumerated here through
    bucket_for), so requests arriving at any time capture nothing more. (That replays of mixed graphs
    give eager's and transformers' logits is tests/model_wrapper/test_mixed_graph.py's.)"""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from text_generator import LLMEngine, SamplingParams, TextGenerator
    from text_generator.serve.warmup import warm_up

    path = make_chat_checkpoint(tmp_path)
    tok = make_tokenizer()

    gen = TextGenerator.from_pretrained(path, device="cuda", dtype=torch.bfloat16, cuda_graphs=True)
    served = LLMEngine(gen, num_blocks=8 * 16 + 1, block_size=16, max_num_seqs=8, max_num_batched_tokens=256,
                       max_seq_len=256, tokenizer=tok)
    warm_up(served)
    mixed = served.generator.model_wrapper.graphs.mixed
    want = {mixed.bucket_for(t, b) for b in range(1, 9) for t in range(b, 257)}
    assert set(mixed._graphs) == want
    g = torch.Generator().manual_seed(0)
    vocab = gen.vocab_size  # token ids the checkpoint has (160): the engine refuses others
    prompts = [torch.randint(3, vocab, (int(n),), generator=g).tolist()
               for n in torch.randint(5, 120, (12,), generator=g)]
    params = SamplingParams(temperature=0.0, max_new_tokens=6, ignore_eos=True)

    def staggered(e):  # two new requests before each step: prefill chunks beside decodes, many shapes
        ids, final, i = [], {}, 0
        while len(final) < len(prompts):
            for p in prompts[i:i + 2]:
                ids.append(e.add_request(p, params))
            i += 2
            for o in e.step():
                if o.finished:
                    final[o.request_id] = o.token_ids
        return [final[r] for r in ids]

    got = staggered(served)
    assert set(mixed._graphs) == want  # nothing captured while serving
    assert [len(t) for t in got] == [6] * len(prompts)
