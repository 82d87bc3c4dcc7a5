"""Running ahead of the sampled tokens: forward_tensor's prev_token_ids (ids taken on the device)
and the engine's async scheduling. Oracles: the same call with the real ids; the engine in the
plain order and transformers' greedy decoding (tests/text_generator/test_engine.py runs every engine test in
both modes; here: that running ahead really happens, and falls back where it must)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import make_checkpoint
from test_engine import SpyGenerator
from text_generator import TextGenerator
from text_generator.engine import LLMEngine
from text_generator.errors import ErrorCode, ForwardArgumentError
from text_generator.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    return TextGenerator.from_pretrained(make_checkpoint(tmp_path_factory.mktemp("ra"), "llama"), device="cpu",
                                         dtype=torch.float32)


def decode_args(gen, kv):
    """Two requests (5 and 3 cached tokens, blocks of 4) decoding one token each."""
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    lens = torch.tensor([6, 4], dtype=torch.int32)
    pos = torch.tensor([5, 3])
    slots = torch.tensor([1 * 4 + 1, 2 * 4 + 3])
    return pos, False, kv, tables, slots, lens, 64


def test_prev_token_ids_equal_the_real_ids_and_leave_the_callers_tensor(gen):
    kv = gen.allocate_kv_cache(8, 4)
    torch.manual_seed(0)
    for layer in kv:
        for t in layer:
            t.normal_()
    real = torch.tensor([17, 42])
    want = gen.forward_tensor(real, *decode_args(gen, [tuple(t.clone() for t in layer) for layer in kv]))
    sampled = torch.tensor([5, 42, 17])  # a previous step's tokens: rows 0 <- [2], 1 <- [1]
    ids = torch.tensor([0, 0])
    got = gen.forward_tensor(ids, *decode_args(gen, kv), prev_token_ids=(sampled, torch.tensor([0, 1]),
                                                                            torch.tensor([2, 1])))
    assert torch.equal(got, want)
    assert ids.tolist() == [0, 0]
    # only some rows from the device; the others as given
    kv2 = gen.allocate_kv_cache(8, 4)
    for a, b in zip(kv2, kv):
        for x, y in zip(a, b):
            x.copy_(y)
    got = gen.forward_tensor(torch.tensor([0, 42]), *decode_args(gen, kv2),
                             prev_token_ids=(sampled, torch.tensor([0]), torch.tensor([2])))
    assert torch.equal(got, want)


@pytest.mark.parametrize("value, text", [
    ((torch.tensor([1]), torch.tensor([0])), "expected a tuple (tokens, rows, index), got tuple of length 2"),
    ((torch.tensor([1.0]), torch.tensor([0]), torch.tensor([0])), "expected tokens as a 1-D integer tensor"),
    ((torch.tensor([1]), torch.tensor([2]), torch.tensor([0])), "expected rows in [0, num_tokens=2), got 2..2"),
    ((torch.tensor([1, 2]), torch.tensor([0, 0]), torch.tensor([0, 1])), "expected distinct rows"),
    ((torch.tensor([1]), torch.tensor([0]), torch.tensor([1])), "expected index in [0, len(tokens)=1), got 1..1"),
    ((torch.tensor([1]), torch.tensor([0, 1]), torch.tensor([0])), "expected rows and index of one length"),
])
def test_bad_prev_token_ids_are_refused_and_change_nothing(gen, value, text):
    kv = gen.allocate_kv_cache(8, 4)
    before = [t.clone() for layer in kv for t in layer]
    with pytest.raises(ForwardArgumentError) as err:
        gen.forward_tensor(torch.tensor([1, 2]), *decode_args(gen, kv), prev_token_ids=value)
    assert err.value.code is ErrorCode.INVALID_PREV_TOKEN_IDS and err.value.argument == "prev_token_ids"
    assert text in str(err.value)
    assert all(torch.equal(a, b) for a, b in zip(before, [t for layer in kv for t in layer]))


def device_rows(spy: SpyGenerator) -> list[int]:
    """Per forward_tensor call, how many input ids came from the device (prev_token_ids)."""
    return [c["device_rows"] for c in spy.calls]


def run(engine, prompts, params):
    return [o.token_ids for o in engine.generate(prompts, params, use_tqdm=False)]


def test_the_engine_runs_ahead_and_gives_the_plain_orders_outputs(gen):
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11] * 13, [3, 1, 4, 1, 5]]
    params = [SamplingParams(temperature=0.0, max_new_tokens=9), SamplingParams(temperature=0.8, seed=3,
              max_new_tokens=7), SamplingParams(temperature=1.0, top_k=5, seed=4, max_new_tokens=11, logprobs=2),
              SamplingParams(temperature=0.0, max_new_tokens=4, stop_token_ids=[7])]
    plain = run(LLMEngine(gen, num_blocks=64, block_size=4, async_scheduling=False), prompts, params)
    spy = SpyGenerator(gen)
    ahead = LLMEngine(spy, num_blocks=64, block_size=4, max_num_batched_tokens=16, async_scheduling=True)
    assert run(ahead, prompts, params) == plain
    # most decode rows took their id from the device (every decode after a request's first)
    assert sum(device_rows(spy)) >= sum(p.max_new_tokens for p in params) - 2 * len(prompts) - 4
    assert ahead.block_manager.num_used_blocks == 0 and ahead._inflight is None


def test_penalties_make_the_engine_wait_for_its_tokens(gen):
    """A request whose sampling reads its own outputs cannot run ahead: while one is live, every
    step reads its tokens back first (and the outputs equal the plain order's)."""
    prompts = [[1, 2, 3, 1, 2, 3], [9, 8, 7]]
    params = [SamplingParams(temperature=0.0, max_new_tokens=8, repetition_penalty=1.5, frequency_penalty=0.5),
              SamplingParams(temperature=0.0, max_new_tokens=12)]
    plain = run(LLMEngine(gen, num_blocks=64, block_size=4, async_scheduling=False), prompts, params)
    spy = SpyGenerator(gen)
    ahead = LLMEngine(spy, num_blocks=64, block_size=4, async_scheduling=True)
    assert run(ahead, prompts, params) == plain
    # the penalised request lives for its 8 tokens: no device rows until it finished
    first_ahead = next(i for i, n in enumerate(device_rows(spy)) if n)
    assert first_ahead >= 8


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_loads_give_the_same_outputs_in_both_orders(gen, data):
    """Random arrivals, lengths, stop tokens, seeded sampling and a pool small enough to preempt:
    running ahead changes no request's final output, and every block comes back."""
    n = data.draw(st.integers(2, 6))
    reqs = []
    for i in range(n):
        prompt = data.draw(st.lists(st.integers(0, 95), min_size=1, max_size=12))
        params = SamplingParams(temperature=data.draw(st.sampled_from([0.0, 0.7])), seed=i,
                                max_new_tokens=data.draw(st.integers(1, 10)),
                                stop_token_ids=data.draw(st.lists(st.integers(0, 95), max_size=3)))
        reqs.append((data.draw(st.integers(0, 4)), prompt, params))  # (arrival step, prompt, params)
    num_blocks = data.draw(st.integers(8, 24))
    budget = data.draw(st.integers(4, 16))

    def serve(run_ahead):
        engine = LLMEngine(gen, num_blocks=num_blocks, block_size=2, watermark=0.0, max_num_batched_tokens=budget,
                           async_scheduling=run_ahead)
        ids, finals, step = {}, {}, 0
        while len(finals) < n:
            for i, (arrive, prompt, params) in enumerate(reqs):
                if arrive == step:
                    ids[engine.add_request(prompt, params)] = i
            finals.update({ids[o.request_id]: (o.token_ids, o.finish_reason) for o in engine.step() if o.finished})
            step += 1
            assert step < 500
        assert engine.block_manager.num_used_blocks == 0 and not engine.has_unfinished()
        return finals

    assert serve(True) == serve(False)


def test_nothing_is_left_unfinished_when_the_last_request_stops_on_a_token_run_ahead_of(gen):
    """The last live request stops on a stop token while the next step (with its row) is already
    launched: the engine then has nothing unfinished (found by the random-load test above)."""
    engine = LLMEngine(gen, num_blocks=8, block_size=2, watermark=0.0, max_num_batched_tokens=4,
                       async_scheduling=True)
    params = SamplingParams(temperature=0.0, max_new_tokens=20)
    first = engine.generate([[8]], params, use_tqdm=False)[0].token_ids
    stop = first[2]
    finals = []
    engine.add_request([8], SamplingParams(temperature=0.0, max_new_tokens=20, stop_token_ids=[stop]))
    while not finals:
        finals += [o for o in engine.step() if o.finished]
    assert engine._inflight is not None  # the step launched with the stopped request's next row
    assert not engine.has_unfinished()
    assert [o.token_ids for o in finals] == [first[:first.index(stop) + 1]]
    assert finals[0].finish_reason == "stop" and engine.block_manager.num_used_blocks == 0
    assert engine.generate([[8]], params, use_tqdm=False)[0].token_ids == first  # and it serves on
