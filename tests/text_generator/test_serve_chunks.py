"""How a stream that fell behind merges the outputs queued for it (responses.merge_outputs): per
request, in order, the texts and logprob rows concatenate to what the separate chunks would have
carried, the last output sets finish reason and token count, and a failure is its own entry after
the text that came before it. Expected values are computed here from the outputs themselves."""

from __future__ import annotations

from text_generator.engine import RequestOutput
from text_generator.serve.responses import merge_outputs, new_logprobs


def step_outputs(rid: str, pieces: list[tuple[int, str]], reason: str | None = None) -> list[RequestOutput]:
    """One RequestOutput per (token, delta text), as the engine client builds them step by step."""
    outs, ids, lps, tops = [], [], [], []
    for k, (tok, text) in enumerate(pieces):
        ids, lps, tops = ids + [tok], lps + [-0.1 * (k + 1)], tops + [{tok: -0.1 * (k + 1), 99: -5.0}]
        last = k == len(pieces) - 1
        outs.append(RequestOutput(request_id=rid, prompt_token_ids=[], new_token_ids=[tok], token_ids=list(ids),
                                  finished=last and reason is not None, finish_reason=reason if last else None,
                                  delta_text=text, logprobs=list(lps), top_logprobs=list(tops)))
    return outs


def test_queued_outputs_merge_per_request_into_what_the_separate_chunks_carried():
    a = step_outputs("a", [(5, "he"), (6, "ll"), (7, "o")], "length")
    b = step_outputs("b", [(8, "x"), (9, "")])
    interleaved = [a[0], b[0], a[1], b[1], a[2]]
    merged = {m.request_id: m for m in merge_outputs(interleaved, want_logprobs=True)}
    assert set(merged) == {"a", "b"}
    for rid, outs in (("a", a), ("b", b)):
        m = merged[rid]
        assert m.text == "".join(o.delta_text for o in outs)
        assert m.rows == [row for o in outs for row in new_logprobs(o)]
        assert m.num_tokens == len(outs[-1].token_ids) and not m.failed
    assert merged["a"].finish == "length" and merged["b"].finish is None
    assert [m.rows for m in merge_outputs(interleaved, want_logprobs=False)] == [[], []]


def test_a_failure_follows_the_text_that_came_before_it():
    a = step_outputs("a", [(5, "he"), (6, "ll")])
    failed = RequestOutput(request_id="a", prompt_token_ids=[], new_token_ids=[], token_ids=[5, 6], finished=True,
                           finish_reason="error", error="engine step failed: boom")
    merged = merge_outputs(a + [failed], want_logprobs=False)
    assert [(m.text, m.failed, m.error) for m in merged] == [("hell", False, None),
                                                             ("", True, "engine step failed: boom")]


def test_chunk_json_is_what_the_standard_encoder_writes():
    """responses._json reuses one C encoder: its text must equal json.dumps' with the same settings
    (the oracle) for every kind of value a chunk carries, and an unencodable value still raises TypeError."""
    import json
    import math

    import pytest

    from text_generator.serve.responses import _json

    values = [None, True, 0, -3, 2.5, 1e-320, -0.0, 1e300, math.inf, -math.inf, math.nan, "", "a\u00e9\"\\\n\t\u2028",
              "\U0001F600 \x00", [], {}, {"content": "hi"}, {"role": "assistant", "content": ""},
              {"tokens": ["a", " b"], "token_logprobs": [-0.5, -1e-9], "top_logprobs": [{"a": -0.5}, {" b": 0.0}],
               "text_offset": [0, 1]}, {1: None, 2.5: [True, False], "k": {"n": [[], {}]}}]
    for v in values:
        assert _json(v) == json.dumps(v, ensure_ascii=False, separators=(",", ":")), v
    with pytest.raises(TypeError):
        _json({"a": object()})
