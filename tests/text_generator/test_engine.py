"""LLMEngine: greedy output equals transformers' greedy decoding under continuous batching (chunked
prefill, mixed steps, staggered arrivals, prefix-cache hits, preemption), and request-level
errors, aborts and stop conditions behave per request."""

from __future__ import annotations

import functools
import random

import pytest
import torch

from conftest import hf_model
from text_generator import TextGenerator
from text_generator.engine import LLMEngine
from text_generator.sampling import SamplingParams

VOCAB = 96  # conftest.TINY


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True, params=[False, True], ids=["plain", "run_ahead"])
def run_ahead(request, monkeypatch):
    """Every engine test runs twice: in the plain order (sample, read the tokens, schedule) and
    running ahead (the next step launched with the tokens still on the device; CUDA's default),
    which must not change any output."""
    init = LLMEngine.__init__

    def patched(self, *args, **kwargs):
        kwargs.setdefault("async_scheduling", request.param)
        init(self, *args, **kwargs)

    monkeypatch.setattr(LLMEngine, "__init__", patched)
    return request.param


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from conftest import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("engine_llama"), "llama")


@pytest.fixture(scope="module")
def gen(ckpt):
    return TextGenerator.from_pretrained(ckpt, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def reference(ckpt):
    """prompt -> transformers' greedy continuation (argmax loop with its own KV cache)."""
    model = hf_model(ckpt)

    @functools.lru_cache(maxsize=None)
    def greedy(prompt: tuple[int, ...], n: int) -> list[int]:
        with torch.no_grad():
            out = model(torch.tensor([prompt]), use_cache=True)
            toks = []
            for _ in range(n):
                t = int(out.logits[0, -1].argmax())
                toks.append(t)
                out = model(torch.tensor([[t]]), past_key_values=out.past_key_values, use_cache=True)
        return toks

    return greedy


def make_prompts(seed: int = 0) -> list[list[int]]:
    """Mixed lengths, two families sharing long prefixes, and an exact repeat."""
    rng = random.Random(seed)
    shared = [rng.randrange(VOCAB) for _ in range(21)]
    other = [rng.randrange(VOCAB) for _ in range(9)]
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (1, 3, 17, 33)]
    prompts += [shared + [rng.randrange(VOCAB) for _ in range(n)] for n in (2, 7, 12)]
    prompts += [other + [5], other + [6, 7, 8], list(shared)]
    prompts.append(list(prompts[3]))
    return prompts


def greedy_params(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=n)


def run_staggered(engine: LLMEngine, prompts, n_new: list[int], arrivals: list[int]) -> dict[int, list[int]]:
    """Add prompt i before step arrivals[i]; step until all finish; returns index -> output ids."""
    ids: dict[str, int] = {}
    done: dict[int, list[int]] = {}
    step = 0
    while len(done) < len(prompts):
        for i, a in enumerate(arrivals):
            if a == step:
                ids[engine.add_request(prompts[i], greedy_params(n_new[i]))] = i
        for o in engine.step():
            if o.finished:
                assert o.finish_reason == "length", o
                done[ids[o.request_id]] = o.token_ids
        step += 1
        assert step < 2000
    return done


class SpyGenerator:
    """Wraps a TextGenerator and records what each forward_tensor call carried."""

    def __init__(self, gen):
        self.gen, self.calls = gen, []

    def __getattr__(self, name):
        return getattr(self.gen, name)

    def forward_tensor(self, *args, **kwargs):
        q = torch.as_tensor(kwargs["q_lens"]).tolist()
        lm, prev = args[8], kwargs.get("prev_token_ids")
        self.calls.append(dict(q_lens=q, is_prefill=args[2], num_out=None if lm is None else len(lm),
                               device_rows=0 if prev is None else len(prev[1])))
        return self.gen.forward_tensor(*args, **kwargs)


# greedy parity ----------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size,budget,max_seqs", [(4, 7, 64), (16, 2048, 64), (4, 2048, 3), (16, 13, 5)])
def test_greedy_matches_transformers_under_continuous_batching(gen, reference, block_size, budget, max_seqs):
    prompts = make_prompts()
    n_new = [6 + (i * 5) % 11 for i in range(len(prompts))]
    arrivals = [0, 0, 0, 1, 2, 2, 5, 5, 9, 14, 30]
    spy = SpyGenerator(gen)
    engine = LLMEngine(spy, num_blocks=256, block_size=block_size, max_num_seqs=max_seqs,
                       max_num_batched_tokens=budget)
    got = run_staggered(engine, prompts, n_new, arrivals)
    for i, p in enumerate(prompts):
        assert got[i] == reference(tuple(p), n_new[i]), f"prompt {i} (len {len(p)})"
    assert engine.block_manager.num_used_blocks == 0
    assert all(sum(c["q_lens"]) <= budget for c in spy.calls)
    # prefill chunks and decodes share steps; chunks that stop short of the end get no logits
    assert any(c["is_prefill"] and 1 in c["q_lens"] and max(c["q_lens"]) > 1 for c in spy.calls)
    assert all(c["num_out"] <= len(c["q_lens"]) for c in spy.calls)
    if budget < 20:
        assert any(c["num_out"] < len(c["q_lens"]) for c in spy.calls)  # a mid-prompt chunk


def test_prefix_cache_hits_skip_cached_tokens_and_keep_the_output(gen, reference):
    prompts = make_prompts()
    spy = SpyGenerator(gen)
    engine = LLMEngine(spy, num_blocks=128, block_size=4)
    first = engine.generate(prompts[4:5], greedy_params(5), use_tqdm=False)[0]
    assert first.num_cached_tokens == 0
    spy.calls.clear()
    outs = engine.generate(prompts[5:7] + [prompts[4]], greedy_params(5), use_tqdm=False)
    assert [o.num_cached_tokens for o in outs] == [20, 20, 20]  # 5 full blocks of the shared 21 tokens
    computed = sum(sum(c["q_lens"]) for c in spy.calls)
    assert computed == sum(len(p) - 20 for p in prompts[5:7] + [prompts[4]]) + 3 * 4  # + 4 decodes each
    for o, p in zip(outs, prompts[5:7] + [prompts[4]]):
        assert o.token_ids == reference(tuple(p), 5)
    no_cache = LLMEngine(gen, num_blocks=128, block_size=4, enable_prefix_caching=False)
    assert [o.num_cached_tokens for o in no_cache.generate(prompts[4:6], greedy_params(2), use_tqdm=False)] == [0, 0]


# preemption ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size,speculative", [(4, False), (16, False), (4, True)])
def test_small_pool_preempts_and_every_request_finishes_with_the_same_output(gen, reference, block_size, speculative):
    from text_generator.speculative import NgramDrafter

    rng = random.Random(7)
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(5, 30))] for _ in range(8)]
    params = [greedy_params(24) if i % 2 else SamplingParams(temperature=1.0, seed=100 + i, max_new_tokens=24)
              for i in range(8)]
    big = LLMEngine(gen, num_blocks=512, block_size=block_size)
    want = big.generate(prompts, params, use_tqdm=False)
    assert big.num_preemptions == 0
    # room for about two requests at a time, and growth forces preemption
    need = max(-(-(len(p) + 24) // block_size) for p in prompts)
    small = LLMEngine(gen, num_blocks=need * 2 + 1, block_size=block_size, watermark=0.0,
                      speculative=NgramDrafter(depth=3) if speculative else None)
    got = small.generate(prompts, params, use_tqdm=False)
    assert small.num_preemptions > 0
    for w, g, p, sp in zip(want, got, prompts, params):
        assert g.finish_reason == "length" and g.token_ids == w.token_ids
        if sp.greedy:
            assert g.token_ids == reference(tuple(p), 24)
    assert small.block_manager.num_used_blocks == 0
    assert not small.has_unfinished()


def test_a_request_the_pool_can_never_hold_fails_alone(gen, reference):
    engine = LLMEngine(gen, num_blocks=4, block_size=4, watermark=0.0)
    seen = {}
    engine.add_request(list(range(40)), greedy_params(2), request_id="huge", stream_callback=lambda o: seen.update(huge=o))
    out = engine.generate([[4, 5]], greedy_params(3), use_tqdm=False)[0]  # needs 10 blocks of 4
    assert out.finish_reason == "length" and out.token_ids == reference((4, 5), 3)
    assert seen["huge"].finish_reason == "error" and "cannot hold" in seen["huge"].error
    assert not engine.has_unfinished() and engine.block_manager.num_used_blocks == 0


def test_growth_beyond_the_pool_fails_the_request_not_the_engine(gen):
    engine = LLMEngine(gen, num_blocks=3, block_size=4, watermark=0.0)
    seen = {}
    engine.add_request([1, 2, 3], greedy_params(30), request_id="long", stream_callback=lambda o: seen.update(long=o))
    engine.add_request([4, 5], greedy_params(3), request_id="short", stream_callback=lambda o: seen.update(short=o))
    while engine.has_unfinished():
        engine.step()
    assert seen["short"].finish_reason == "length" and len(seen["short"].token_ids) == 3
    assert seen["long"].finish_reason == "error" and "KV cache" in seen["long"].error
    assert engine.block_manager.num_used_blocks == 0


# request-level errors, abort, stops ---------------------------------------------------------------


def test_request_errors_are_reported_per_request_and_others_finish(gen, reference):
    engine = LLMEngine(gen, num_blocks=64, block_size=4, max_seq_len=40)
    good = [[3, 1, 4, 1, 5], [9, 2, 6]]
    ids = {
        "bad_params": engine.add_request([1, 2], {"temperature": -1.0}),
        "bad_params_obj": engine.add_request([1, 2], SamplingParams(top_p=0.5)),
        "too_long": engine.add_request(list(range(40)), greedy_params(2)),
        "empty": engine.add_request([], greedy_params(2)),
        "oov": engine.add_request([1, VOCAB], greedy_params(2)),
        "text_without_tokenizer": engine.add_request("hello", greedy_params(2)),
        "adapter": engine.add_request([1, 2], greedy_params(2), adapter="nope"),
        "stop_string_without_tokenizer": engine.add_request([1, 2], SamplingParams(stop=["x"])),
        "bad_type": engine.add_request([1, 2], "greedy"),
        "good0": engine.add_request(good[0], greedy_params(4)),
        "good1": engine.add_request(good[1], greedy_params(4)),
    }
    finals = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                finals[o.request_id] = o
    by_name = {name: finals[rid] for name, rid in ids.items()}
    expect = {
        "bad_params": "SamplingParams.temperature", "too_long": "max_seq_len", "empty": "at least one token",
        "oov": f"[0, {VOCAB})", "text_without_tokenizer": "tokenizer", "adapter": "'nope'",
        "stop_string_without_tokenizer": "tokenizer", "bad_type": "SamplingParams",
    }
    for name, fragment in expect.items():
        o = by_name[name]
        assert o.finish_reason == "error" and fragment in o.error, (name, o.error)
        assert o.token_ids == []
    assert by_name["bad_params_obj"].finish_reason == "length"
    for k, p in enumerate(good):
        assert by_name[f"good{k}"].token_ids == reference(tuple(p), 4)
    engine.add_request([1], request_id="dup")
    with pytest.raises(ValueError, match="already live"):
        engine.add_request([1], request_id="dup")


def test_abort_frees_the_request_and_reports_it(gen, reference):
    engine = LLMEngine(gen, num_blocks=64, block_size=4)
    a = engine.add_request([1, 2, 3, 4, 5, 6], greedy_params(20))
    b = engine.add_request([7, 8, 9], greedy_params(6))
    waiting = engine.add_request([10, 11], greedy_params(6), request_id="w")
    seen = [t for _ in range(3) for o in engine.step() if o.request_id == a for t in o.new_token_ids]
    assert seen  # (running ahead, the last step's token is still on the device: one fewer)
    assert engine.abort(a) and not engine.abort(a) and not engine.abort("unknown")
    finals = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                finals[o.request_id] = o
    # the aborted request keeps exactly the tokens reported before the abort
    assert finals[a].finish_reason == "abort" and finals[a].token_ids == seen == reference((1, 2, 3, 4, 5, 6), 20)[:len(seen)]
    assert finals[b].token_ids == reference((7, 8, 9), 6)
    assert finals[waiting].token_ids == reference((10, 11), 6)
    assert engine.block_manager.num_used_blocks == 0


def test_eos_stop_tokens_and_length_limits(gen, reference):
    prompt = (5, 17, 33, 2)
    ref = reference(prompt, 12)
    stop_tok = ref[4]
    k = ref.index(stop_tok)
    engine = LLMEngine(gen, num_blocks=64, block_size=4, eos_token_id=stop_tok, max_seq_len=12)
    outs = engine.generate(
        [list(prompt)] * 4,
        [greedy_params(8), SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True),
         SamplingParams(temperature=0, max_new_tokens=20, ignore_eos=True),
         SamplingParams(temperature=0, max_new_tokens=8, ignore_eos=True, stop_token_ids=[ref[1]])],
        use_tqdm=False)
    assert outs[0].finish_reason == "stop" and outs[0].token_ids == ref[:k + 1]  # EOS kept in token_ids
    assert outs[1].finish_reason == "length" and outs[1].token_ids == ref[:6]
    assert outs[2].finish_reason == "length" and outs[2].token_ids == ref[:12 - len(prompt)]  # max_seq_len
    assert outs[3].finish_reason == "stop" and outs[3].token_ids == ref[:ref.index(ref[1]) + 1]


class CharTokenizer:
    """Token i <-> one printable character; 0 is EOS (never sampled in these tests' checks)."""

    eos_token_id = None

    def encode(self, text):
        return [ord(c) - 32 for c in text]

    def decode(self, ids):
        return "".join(chr(i + 32) for i in ids)


def test_stop_strings_cut_the_text_and_streaming_sees_every_token(gen, reference):
    tok = CharTokenizer()
    prompt = "Hello, world"
    ref = reference(tuple(tok.encode(prompt)), 16)
    full = tok.decode(ref)
    stop = full[6:8]
    cut = full.index(stop)
    engine = LLMEngine(gen, num_blocks=64, block_size=4, tokenizer=tok)
    stream = []
    rid = engine.add_request(prompt, SamplingParams(temperature=0, max_new_tokens=16, stop=[stop]),
                             stream_callback=stream.append)
    plain = engine.add_request(prompt, greedy_params(16))
    finals = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                finals[o.request_id] = o
    o = finals[rid]
    assert o.finish_reason == "stop" and o.text == full[:cut]
    assert o.token_ids == ref[:len(o.token_ids)] and len(o.token_ids) >= cut + 1
    assert "".join(s.delta_text for s in stream) == o.text
    assert [t for s in stream for t in s.new_token_ids] == o.token_ids
    assert stream[-1].finished and not any(s.finished for s in stream[:-1])
    assert finals[plain].text == full


def test_logprobs_and_metrics_reach_the_output(gen):
    engine = LLMEngine(gen, num_blocks=64, block_size=4)
    o = engine.generate([[1, 2, 3]], SamplingParams(temperature=0.8, seed=3, max_new_tokens=5, logprobs=2),
                        use_tqdm=False)[0]
    assert len(o.logprobs) == 5 and len(o.top_logprobs) == 5
    assert all(lp <= 0 for lp in o.logprobs) and all(len(d) == 2 for d in o.top_logprobs)
    for tok, lp, top in zip(o.token_ids, o.logprobs, o.top_logprobs):
        assert lp <= max(top.values()) + 1e-6
        if tok in top:
            assert top[tok] == pytest.approx(lp)
    m = o.metrics
    assert m.ttft > 0 and len(m.token_times) == 5 and len(m.itls) == 4 and m.finished_time >= m.token_times[-1]


def test_seeded_sampling_reproduces_across_engines_and_batch_mates(gen):
    p = SamplingParams(temperature=1.0, top_p=0.9, seed=42, max_new_tokens=10)
    alone = LLMEngine(gen, num_blocks=64, block_size=4).generate([[1, 2, 3]], p, use_tqdm=False)[0]
    crowd = LLMEngine(gen, num_blocks=64, block_size=4).generate(
        [[9, 9], [1, 2, 3], [4, 5, 6, 7]], [SamplingParams(temperature=1.0), p, SamplingParams(temperature=0.5)],
        use_tqdm=False)[1]
    assert alone.token_ids == crowd.token_ids


def test_engine_arguments_are_checked(gen):
    with pytest.raises(ValueError, match="max_seq_len"):
        LLMEngine(gen, num_blocks=8, max_seq_len=10**6)
    with pytest.raises(ValueError, match="max_num_seqs"):
        LLMEngine(gen, num_blocks=8, max_num_seqs=0)
    with pytest.raises(ValueError, match="drafter"):
        LLMEngine(gen, num_blocks=8, speculative=object())


# speculative decoding ---------------------------------------------------------------------------


def test_speculative_decoding_keeps_greedy_outputs_and_saves_forwards(gen, reference):
    from text_generator.speculative import NgramDrafter

    rng = random.Random(3)
    motif = [rng.randrange(VOCAB) for _ in range(5)]
    prompts = [motif * 4 + [rng.randrange(VOCAB) for _ in range(n)] for n in (0, 1, 3)] + make_prompts()[:4]
    params = [greedy_params(20) for _ in prompts]
    params[1] = SamplingParams(temperature=1.0, seed=5, max_new_tokens=20)  # samples: never drafts
    params[2] = SamplingParams(temperature=0.0, max_new_tokens=20, stop_token_ids=[reference(tuple(prompts[2]), 20)[9]])
    plain = LLMEngine(gen, num_blocks=256, block_size=4)
    want = plain.generate(prompts, params, use_tqdm=False)
    spy = SpyGenerator(gen)
    spec = LLMEngine(spy, num_blocks=256, block_size=4, speculative=NgramDrafter(max_ngram=3, depth=4, branches=2))
    steps_with_news = [0] * len(prompts)
    got = [None] * len(prompts)

    def on_output(i):
        def cb(o):
            steps_with_news[i] += 1
            if o.finished:
                got[i] = o
        return cb

    for i, (p, sp) in enumerate(zip(prompts, params)):
        spec.add_request(p, sp, stream_callback=on_output(i))
    while spec.has_unfinished():
        spec.step()
    for i, (w, g) in enumerate(zip(want, got)):
        assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason, i
        if params[i].greedy and not params[i].stop_token_ids:
            assert g.token_ids == reference(tuple(prompts[i]), 20)
    assert spec.num_accepted_tokens > 0 and spec.num_draft_tokens >= spec.num_accepted_tokens
    # the repeating prompt's request got several tokens from some forward steps
    assert steps_with_news[0] < len(got[0].token_ids)
    assert steps_with_news[1] == len(got[1].token_ids)  # the sampled one: one token per step
    assert any(c["num_out"] is None and max(c["q_lens"]) > 1 for c in spy.calls)  # tree steps ran
    assert spec.block_manager.num_used_blocks == 0 and not spec._drafting


@pytest.mark.parametrize("budget", [6, 7])
def test_draft_model_drafter_survives_chains_trimmed_to_the_token_budget(gen, reference, budget):
    """The target drafting for itself (every draft right) with a budget that trims one request's
    chain: its next token is then the trimmed-off draft, whose K/V the drafter already wrote. The
    drafter must still feed that token next time (an empty step was refused with
    TG_INVALID_Q_LENS); outputs equal plain greedy decoding."""
    from kv_manager import BlockManager
    from text_generator.speculative import DraftModelDrafter

    drafter = DraftModelDrafter(gen, gen.allocate_kv_cache(64, 4), BlockManager(64, 4), k=4)
    engine = LLMEngine(gen, num_blocks=64, block_size=4, max_num_batched_tokens=budget, speculative=drafter)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    outs = engine.generate(prompts, greedy_params(12), use_tqdm=False)
    for p, o in zip(prompts, outs):
        assert o.finish_reason == "length" and o.token_ids == reference(tuple(p), 12), o.error
    assert engine.num_accepted_tokens > 0
    assert engine.block_manager.num_used_blocks == 0 and drafter.bm.num_used_blocks == 0


# fault isolation --------------------------------------------------------------------------------


def test_a_raising_stream_callback_fails_only_its_request(gen, reference):
    engine = LLMEngine(gen, num_blocks=64, block_size=4)
    calls = []

    def bad(o):
        calls.append(o)
        if len(calls) == 2:
            raise RuntimeError("client went away")

    seen = []
    doomed = engine.add_request([3, 1, 4, 1, 5], greedy_params(10), stream_callback=bad)
    kept = engine.add_request([9, 2, 6], greedy_params(6), stream_callback=seen.append)
    other = engine.add_request([2, 7, 1, 8], greedy_params(6))
    finals = {}
    while engine.has_unfinished():
        for o in engine.step():  # must not raise
            if o.finished:
                finals[o.request_id] = o
    assert finals[doomed].finish_reason == "error" and "client went away" in finals[doomed].error
    assert "stream_callback" in finals[doomed].error and len(calls) == 2  # never called again
    assert finals[kept].token_ids == reference((9, 2, 6), 6) and seen[-1].finished
    assert [t for o in seen for t in o.new_token_ids] == finals[kept].token_ids
    assert finals[other].token_ids == reference((2, 7, 1, 8), 6)
    assert engine.block_manager.num_used_blocks == 0 and not engine.requests


@pytest.mark.parametrize("prompt,params,adapter,fragment", [
    ([1, 2], {"bogus": 1}, None, "bogus"),
    ([1, 2], {"temperature": "hot"}, None, "temperature"),
    (5, None, None, "prompt"),
    ([1.5, 2], None, None, "prompt"),
    (None, None, None, "prompt"),
    ([1, 2], None, ["a"], "adapter"),
    ([1, 2], None, 7, "adapter"),
])
def test_a_bad_request_fails_alone_and_leaves_its_id_free(gen, reference, prompt, params, adapter, fragment):
    engine = LLMEngine(gen, num_blocks=64, block_size=4)
    rid = engine.add_request(prompt, params, adapter=adapter, request_id="x")
    good = engine.add_request([9, 2, 6], greedy_params(3))
    assert "x" not in engine.requests  # not a zombie: the id is free again
    finals = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                finals[o.request_id] = o
    assert rid == "x" and finals["x"].finish_reason == "error" and fragment in finals["x"].error
    assert finals[good].token_ids == reference((9, 2, 6), 3)
    again = engine.add_request([1, 2], greedy_params(2), request_id="x")
    out = engine.generate([[9, 2, 6]], greedy_params(1), use_tqdm=False)
    while engine.has_unfinished():
        engine.step()
    assert again == "x" and out[0].token_ids == reference((9, 2, 6), 1)


class FlakyTokenizer(CharTokenizer):
    """Decoding a sequence that contains `poison` raises: one request's text breaks, not the engine."""

    def __init__(self, poison: int):
        self.poison = poison

    def decode(self, ids):
        if self.poison in ids:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return super().decode(ids)


def test_a_tokenizer_failing_on_one_requests_text_fails_only_that_request(gen, reference):
    a, b = (5, 17, 33, 2), (9, 2, 6)
    ref_a, ref_b = reference(a, 6), reference(b, 6)
    poison = next(t for t in ref_a if t not in ref_b)
    engine = LLMEngine(gen, num_blocks=64, block_size=4, tokenizer=FlakyTokenizer(poison))
    ra, rb = engine.add_request(list(a), greedy_params(6)), engine.add_request(list(b), greedy_params(6))
    finals = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                finals[o.request_id] = o
    assert finals[ra].finish_reason == "error" and "UnicodeDecodeError" in finals[ra].error
    assert finals[rb].finish_reason == "length" and finals[rb].token_ids == ref_b
    assert engine.block_manager.num_used_blocks == 0


def test_a_draft_model_drafter_with_a_full_pool_degrades_to_plain_decoding(gen, reference):
    """The draft model's own KV pool holds 3 blocks of 4 tokens: admitting a request there fails
    (OUT_OF_BLOCKS) or leaves no room for drafts. Those requests decode without drafts; no step
    fails and the outputs are plain greedy decoding."""
    from kv_manager import BlockManager
    from text_generator.speculative import DraftModelDrafter

    drafter = DraftModelDrafter(gen, gen.allocate_kv_cache(3, 4), BlockManager(3, 4), k=4)
    engine = LLMEngine(gen, num_blocks=64, block_size=4, speculative=drafter)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12], [4, 4]]
    outs = engine.generate(prompts, greedy_params(8), use_tqdm=False)
    for p, o in zip(prompts, outs):
        assert o.finish_reason == "length" and o.token_ids == reference(tuple(p), 8), o.error
    assert engine.block_manager.num_used_blocks == 0 and drafter.bm.num_used_blocks == 0


class BrokenDrafter:
    """An n-gram drafter whose propose raises every other call."""

    def __init__(self):
        from text_generator.speculative import NgramDrafter

        self.inner, self.calls = NgramDrafter(), 0

    def start(self, *a):
        self.inner.start(*a)

    def update(self, *a):
        self.inner.update(*a)

    def finish(self, *a):
        self.inner.finish(*a)

    def propose(self, *a):
        self.calls += 1
        if self.calls % 2:
            raise RuntimeError("drafter bug")
        return self.inner.propose(*a)


def test_a_raising_drafter_costs_drafts_not_requests(gen, reference):
    rng = random.Random(4)
    motif = [rng.randrange(VOCAB) for _ in range(5)]
    prompts = [motif * 3, [9, 2, 6]]
    drafter = BrokenDrafter()
    engine = LLMEngine(gen, num_blocks=64, block_size=4, speculative=drafter)
    outs = engine.generate(prompts, greedy_params(10), use_tqdm=False)
    for p, o in zip(prompts, outs):
        assert o.finish_reason == "length" and o.token_ids == reference(tuple(p), 10), o.error
    assert drafter.calls >= 2 and engine.block_manager.num_used_blocks == 0
    assert not engine.abort(["unhashable"])
