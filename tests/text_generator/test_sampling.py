"""Sampler and SamplingParams: greedy, seeds, the allowed set of top-k / top-p / min-p, penalties
and logprobs, each checked against a direct computation."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from text_generator.sampling import Sampler, SamplingParams, apply_filters, apply_penalties


pytestmark = pytest.mark.usefixtures("one_thread")


def sample(logits, params, **kw):
    return Sampler(use_flashinfer=False)(logits, params, **kw)


# SamplingParams ---------------------------------------------------------------------------------


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", float("nan")), ("temperature", "hot"),
    ("top_k", -2), ("top_k", 1.5), ("top_k", True),
    ("top_p", 0.0), ("top_p", 1.1),
    ("min_p", -0.1), ("min_p", 1.5),
    ("repetition_penalty", 0.0), ("repetition_penalty", float("inf")),
    ("frequency_penalty", 2.5), ("presence_penalty", -3),
    ("seed", -1), ("seed", 1.0),
    ("logprobs", -1), ("max_new_tokens", 0),
    ("stop_token_ids", [-1]), ("stop", [""]), ("ignore_eos", 1),
])
def test_params_reject_bad_fields_naming_field_expected_and_got(field, value):
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: value})
    msg = str(e.value)
    assert f"SamplingParams.{field}" in msg and "expected" in msg and "got" in msg


def test_params_defaults_and_normalisation():
    p = SamplingParams(stop="###", stop_token_ids=(3, 4))
    assert p.stop == ["###"] and p.stop_token_ids == [3, 4]
    assert not p.greedy and SamplingParams(temperature=0).greedy
    assert not p.has_penalties and SamplingParams(presence_penalty=0.5).has_penalties


# greedy and seeds -------------------------------------------------------------------------------


def test_greedy_is_argmax_even_mixed_with_sampled_rows():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0), SamplingParams(temperature=0, top_k=3),
              SamplingParams(temperature=0.7, top_p=0.5), SamplingParams(temperature=0, top_p=0.1, min_p=0.5),
              SamplingParams(temperature=0)]
    out = sample(logits, params)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    assert out.token_ids.dtype == torch.int64
    assert out.token_ids[greedy].tolist() == logits.argmax(-1)[greedy].tolist()


def test_top_k_one_is_argmax():
    logits = torch.randn(4, 30)
    out = sample(logits, [SamplingParams(temperature=2.0, top_k=1, seed=i) for i in range(4)],
                 generators=[SamplingParams(seed=i).make_generator("cpu") for i in range(4)])
    assert out.token_ids.tolist() == logits.argmax(-1).tolist()


def test_seeded_rows_reproduce_whatever_their_batch_neighbours():
    torch.manual_seed(1)
    row = torch.randn(1, 40)
    p = SamplingParams(temperature=1.0, seed=1234)

    def run(batch_logits, pos, steps=5):
        g = p.make_generator("cpu")
        gens = [None] * batch_logits.shape[0]
        gens[pos] = g
        params = [SamplingParams(temperature=1.0)] * batch_logits.shape[0]
        params[pos] = p
        return [sample(batch_logits, params, generators=gens).token_ids[pos].item() for _ in range(steps)]

    alone = run(row, 0)
    batched = torch.cat([torch.randn(3, 40), row, torch.randn(2, 40)])
    assert run(batched, 3) == alone
    assert run(row, 0) == alone
    # and a different seed gives a different stream (overwhelmingly likely over 5 draws)
    g = SamplingParams(seed=99).make_generator("cpu")
    other = [sample(row, [SamplingParams(seed=99)], generators=[g]).token_ids.item() for _ in range(5)]
    assert other != alone


def test_unseeded_draws_follow_the_softmax_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    n = 20000
    out = sample(logits.expand(n, 5).contiguous(), [SamplingParams(temperature=1.0)] * n)
    freq = torch.bincount(out.token_ids, minlength=5).float() / n
    assert torch.allclose(freq, torch.softmax(logits[0], -1), atol=0.015)
    hot = sample(logits.expand(n, 5).contiguous(), [SamplingParams(temperature=0.5)] * n)
    freq = torch.bincount(hot.token_ids, minlength=5).float() / n
    assert torch.allclose(freq, torch.softmax(logits[0] / 0.5, -1), atol=0.015)


# the allowed set --------------------------------------------------------------------------------


def allowed_set(logits: list[float], p: SamplingParams) -> set[int]:
    """Direct definition, tie-tolerant: a token passes a filter if the tokens STRICTLY better than
    it leave it room (any tie-break the sampler picks is then inside this set)."""
    t = 1.0 if p.greedy else p.temperature
    # scaled in float32, as the sampler sees them: a tiny logit over a temperature can round to a
    # tie (-1.4e-45 / 2.5 is -0.0 in float32, not the float64 -5.6e-46)
    x = (torch.tensor(logits, dtype=torch.float32) / t).tolist()
    m = max(x)
    z = sum(math.exp(v - m) for v in x)
    prob = [math.exp(v - m) / z for v in x]
    ids = [i for i in range(len(x)) if prob[i] >= p.min_p * max(prob) * (1 - 1e-5)]
    if p.top_k > 0:
        ids = [i for i in ids if sum(1 for j in ids if x[j] > x[i]) < p.top_k]
    if p.top_p < 1.0:
        mass = sum(prob[j] for j in ids)
        ids = [i for i in ids if sum(prob[j] for j in ids if x[j] > x[i]) / mass < p.top_p + 1e-5]
    return set(ids)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    vocab=st.integers(2, 24),
    rows=st.integers(1, 4),
)
def test_filters_never_emit_a_token_outside_the_allowed_set(data, vocab, rows):
    logits = data.draw(st.lists(st.lists(st.floats(-8, 8, width=32), min_size=vocab, max_size=vocab),
                                min_size=rows, max_size=rows))
    params = [SamplingParams(
        temperature=data.draw(st.sampled_from([0.0, 0.3, 1.0, 2.5])),
        top_k=data.draw(st.sampled_from([-1, 0, 1, 2, 3, 5, 40])),
        top_p=data.draw(st.sampled_from([1.0, 0.95, 0.5, 0.2, 0.01])),
        min_p=data.draw(st.sampled_from([0.0, 0.05, 0.3, 0.9])),
    ) for _ in range(rows)]
    reps = 64
    big = torch.tensor(logits, dtype=torch.float32).repeat_interleave(reps, 0)
    out = sample(big, [p for p in params for _ in range(reps)], generators=None)
    for r, p in enumerate(params):
        allowed = allowed_set(logits[r], p)
        got = set(out.token_ids[r * reps:(r + 1) * reps].tolist())
        assert got <= allowed, (logits[r], p, got, allowed)


def test_filters_keep_exactly_the_expected_set_on_distinct_logits():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    probs = torch.softmax(logits[0], -1)
    kept = lambda p: (apply_filters(logits, [p])[0] > float("-inf")).nonzero().flatten().tolist()  # noqa: E731
    assert kept(SamplingParams(top_k=3)) == [0, 1, 2]
    assert kept(SamplingParams(top_p=float(probs[0]) + 1e-4)) == [0, 1]  # mass before token 1 < top_p
    assert kept(SamplingParams(top_p=float(probs[0]) - 1e-4)) == [0]
    assert kept(SamplingParams(min_p=float(probs[2] / probs[0]) - 1e-4)) == [0, 1, 2]
    assert kept(SamplingParams(top_k=100)) == list(range(6))  # top_k above the vocabulary: off


# penalties --------------------------------------------------------------------------------------


def direct_penalties(logits: list[float], p: SamplingParams, prompt: list[int], output: list[int]) -> list[float]:
    out = []
    for tok, v in enumerate(logits):
        if tok in prompt or tok in output:
            v = v / p.repetition_penalty if v > 0 else v * p.repetition_penalty
        c = output.count(tok)
        v -= p.frequency_penalty * c
        v -= p.presence_penalty * (1 if c > 0 else 0)
        out.append(v)
    return out


def test_penalties_match_a_direct_computation_and_leave_other_rows_alone():
    torch.manual_seed(2)
    V = 12
    logits = torch.randn(4, V) * 3
    params = [SamplingParams(repetition_penalty=1.7, frequency_penalty=0.4, presence_penalty=-0.3),
              SamplingParams(),
              SamplingParams(repetition_penalty=0.6),
              SamplingParams(frequency_penalty=-1.0, presence_penalty=2.0)]
    prompts = [[1, 2, 2, 5], [0, 1], [], [7]]
    outputs = [[2, 3, 3, 3, 11], [4], [9, 9], [7, 7, 0]]
    got = apply_penalties(logits, params, prompts, outputs)
    for r in range(4):
        want = direct_penalties(logits[r].tolist(), params[r], prompts[r], outputs[r])
        assert torch.allclose(got[r], torch.tensor(want), atol=1e-5), r
    assert torch.equal(got[1], logits[1])


def test_greedy_with_penalties_picks_the_argmax_of_the_penalised_logits():
    logits = torch.tensor([[5.0, 4.9, 1.0, 0.0]])
    p = SamplingParams(temperature=0, presence_penalty=1.0)
    assert sample(logits, [p], prompt_ids=[[]], output_ids=[[0]]).token_ids.item() == 1
    p = SamplingParams(temperature=0, repetition_penalty=2.0)
    assert sample(logits, [p], prompt_ids=[[0]], output_ids=[[]]).token_ids.item() == 1


# logprobs ---------------------------------------------------------------------------------------


def test_logprobs_are_log_softmax_of_the_processed_logits():
    torch.manual_seed(3)
    V = 30
    logits = torch.randn(3, V) * 2
    params = [SamplingParams(temperature=0.8, top_k=10, top_p=0.9, logprobs=5, repetition_penalty=1.3),
              SamplingParams(temperature=0, logprobs=0),
              SamplingParams(temperature=1.5, min_p=0.1, logprobs=3)]
    prompts, outputs = [[1, 2], [], [3]], [[4, 4], [], []]
    out = sample(logits, params, prompt_ids=prompts, output_ids=outputs)
    for r, p in enumerate(params):
        x = torch.tensor(direct_penalties(logits[r].tolist(), p, prompts[r], outputs[r]))
        x = x / (1.0 if p.greedy else p.temperature)
        allowed = allowed_set(x.mul(1.0 if p.greedy else p.temperature).tolist(), p)
        mask = torch.tensor([i in allowed for i in range(V)])
        want = torch.log_softmax(x.masked_fill(~mask, float("-inf")), -1)
        tok = out.token_ids[r].item()
        assert tok in allowed
        assert out.logprobs[r].item() == pytest.approx(want[tok].item(), abs=1e-5)
        n = p.logprobs
        top = torch.topk(want, n)
        assert out.top_token_ids[r, :n].tolist() == top.indices.tolist()
        assert torch.allclose(out.top_logprobs[r, :n], top.values, atol=1e-5)


def test_no_logprobs_unless_asked():
    out = sample(torch.randn(2, 8), [SamplingParams(), SamplingParams(temperature=0)])
    assert out.logprobs is None and out.top_token_ids is None


def test_flashinfer_path_is_off_on_cpu_and_refuses_to_pretend():
    s = Sampler(use_flashinfer=True)
    assert s._flashinfer(torch.device("cpu")) is None  # CPU logits always take the torch path


@pytest.mark.cuda
def test_flashinfer_sampling_on_cuda_respects_the_allowed_set_and_greedy():
    pytest.importorskip("flashinfer")
    torch.manual_seed(0)
    V, reps = 64, 256
    base = torch.randn(4, V) * 3
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, top_k=5),
              SamplingParams(temperature=0.7, top_p=0.5), SamplingParams(temperature=1.2, min_p=0.2, top_k=10)]
    big = base.repeat_interleave(reps, 0).cuda()
    s = Sampler(use_flashinfer=True)
    out = s(big, [p for p in params for _ in range(reps)])
    assert s._fi is not None
    toks = out.token_ids.cpu()
    assert (toks[:reps] == base[0].argmax()).all()
    for r, p in enumerate(params):
        got = set(toks[r * reps:(r + 1) * reps].tolist())
        assert got <= allowed_set(base[r].tolist(), p), (r, got)


@pytest.mark.cuda
def test_seeded_rows_on_cuda_take_the_torch_path_and_reproduce():
    torch.manual_seed(0)
    logits = (torch.randn(3, 1000) * 2).cuda()
    params = [SamplingParams(temperature=0.9, top_p=0.8, seed=7), SamplingParams(temperature=0),
              SamplingParams(temperature=1.0, top_k=50)]

    def run():
        gens = [params[0].make_generator("cuda"), None, None]
        return [Sampler()(logits, params, generators=gens).token_ids.cpu() for _ in range(4)]

    a, b = run(), run()
    assert [t[0].item() for t in a] == [t[0].item() for t in b]
    assert all(t[1].item() == logits[1].argmax().item() for t in a)
    assert all(t[0].item() in allowed_set(logits[0].cpu().tolist(), params[0]) for t in a)


@pytest.mark.cuda
def test_sampler_on_cuda_never_waits_for_the_device_and_matches_the_cpu():
    """The engine's run-ahead needs the Sampler to queue its work without a stream synchronize
    (per-row parameter tensors are copied from pinned memory): under sync_debug_mode "error" any
    synchronizing call raises. Greedy rows with logprobs (the server's usual request) must still be
    the argmax and the log_softmax of the logits; filtered and penalised rows stay in their sets."""
    torch.manual_seed(0)
    logits = torch.randn(4, 300) * 2
    params = [SamplingParams(temperature=0, logprobs=2), SamplingParams(temperature=0.8, top_k=20, top_p=0.9,
                                                                        logprobs=1),
              SamplingParams(temperature=1.1, min_p=0.1), SamplingParams(temperature=0, repetition_penalty=1.3,
                                                                         frequency_penalty=0.5)]
    prompts, outputs = [[1, 2]] * 4, [[5, 5, 7]] * 4
    dev_logits = logits.cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = Sampler(use_flashinfer=False)(dev_logits, params, prompt_ids=prompts, output_ids=outputs)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    toks = out.token_ids.cpu()
    assert toks[0].item() == logits[0].argmax().item()
    expected = torch.log_softmax(logits[0].double(), -1)[toks[0]].item()
    assert out.logprobs[0].item() == pytest.approx(expected, abs=1e-4)
    assert toks[1].item() in allowed_set(logits[1].tolist(), params[1])
    assert toks[2].item() in allowed_set(logits[2].tolist(), params[2])
    pen = logits[3].clone()
    for t in (1, 2, 5, 7):  # repetition penalty on every seen token, then frequency on the output's
        pen[t] = pen[t] / 1.3 if pen[t] > 0 else pen[t] * 1.3
    pen[5] -= 0.5 * 2
    pen[7] -= 0.5
    assert toks[3].item() == pen.argmax().item()
