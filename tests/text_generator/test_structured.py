"""Structured output (SamplingParams.structured): outputs match their schema / regex, greedy
structured decoding equals an independent step-by-step computation (transformers' logits masked
by a GrammarMatcher the test builds itself, then argmax), plain rows of a mixed batch are not
touched, speculative decoding keeps the output exact, and bad specs are coded errors that leave
nothing behind.

The checkpoint is a tiny random Llama with a padded vocabulary (128 rows in lm_head, 98 tokens in
the tokenizer); the tokenizer is a character-level WordLevel model over printable ASCII built
here with `tokenizers`, wrapped as a PreTrainedTokenizerFast and saved next to the weights.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

xgr = pytest.importorskip("xgrammar")

from conftest import hf_model, make_checkpoint  # noqa: E402
from text_generator import TextGenerator  # noqa: E402
from text_generator.engine import LLMEngine  # noqa: E402
from text_generator.errors import ErrorCode, ForwardArgumentError, GeneratorStateError  # noqa: E402
from text_generator.sampling import SamplingParams  # noqa: E402
from text_generator.speculative import NgramDrafter  # noqa: E402
from text_generator.speculative.tree import DraftTree  # noqa: E402
from text_generator.speculative.verify import verify_greedy, verify_greedy_grammar  # noqa: E402
from text_generator.structured import GrammarCompiler, StructuredOutput, mask_logits_  # noqa: E402
from text_generator.tokenizer import ByteTokenizer, load_tokenizer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL_VOCAB = 128  # > the tokenizer's 98: ids 98..127 are lm_head padding
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8},
                   "age": {"type": "integer", "minimum": 0, "maximum": 150}},
    "required": ["name", "age"],
}
REGEX = r"[a-z]{2,5}@[a-z]{2,4}\.(com|org)"


def make_char_tokenizer(path: str):
    """Printable ASCII one character per token (ids 3..97) after <unk>, <s>, </s> (0, 1, 2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for c in range(32, 127):
        vocab[chr(c)] = len(vocab)
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tk.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                 clean_up_tokenization_spaces=False)
    hf.save_pretrained(path)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("structured_llama"), "llama", vocab_size=MODEL_VOCAB)
    make_char_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def tok(ckpt):
    t = load_tokenizer(ckpt)
    assert len(t) == 98 and t.eos_token_id == 2
    return t


@pytest.fixture(scope="module")
def gen(ckpt):
    return TextGenerator.from_pretrained(ckpt, device="cpu", dtype=torch.float32)


def engine(gen, tok, **kw) -> LLMEngine:
    kw.setdefault("async_scheduling", False)
    return LLMEngine(gen, num_blocks=64, block_size=8, tokenizer=tok, freeze_gc=False, **kw)


def run(eng: LLMEngine, prompts, params) -> list:
    return eng.generate(prompts, params, use_tqdm=False)


def check_person(text: str) -> dict:
    """json.loads + validation against SCHEMA (by hand; jsonschema too where installed)."""
    obj = json.loads(text)
    assert isinstance(obj, dict) and set(obj) == {"name", "age"}
    assert isinstance(obj["name"], str) and len(obj["name"]) <= 8
    assert isinstance(obj["age"], int) and not isinstance(obj["age"], bool) and 0 <= obj["age"] <= 150
    try:
        import jsonschema
    except ImportError:
        return obj
    jsonschema.validate(obj, SCHEMA)
    return obj


def allowed_ids(matcher, vocab: int) -> torch.Tensor:
    """Bool [vocab]: the matcher's next allowed tokens, unpacked from its bitmask bit by bit
    (independent of the library's mask_logits_)."""
    bm = xgr.allocate_token_bitmask(1, vocab)
    matcher.fill_next_token_bitmask(bm)
    ids = torch.arange(vocab)
    return ((bm[0][ids // 32] >> (ids % 32)) & 1).bool()


def oracle_greedy(ckpt, tok, prompt: str, schema: dict, max_new: int) -> list[int]:
    """Step-by-step structured greedy: transformers' logits of the whole sequence, masked by a
    GrammarMatcher built here, argmax; until the matcher terminates or max_new tokens."""
    model = hf_model(ckpt)
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=MODEL_VOCAB, stop_token_ids=[tok.eos_token_id])
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_json_schema(json.dumps(schema), any_whitespace=False))
    ids, out = tok.encode(prompt), []
    with torch.no_grad():
        for _ in range(max_new):
            logits = model(torch.tensor([ids + out])).logits[0, -1]
            t = int(logits.masked_fill(~allowed_ids(matcher, MODEL_VOCAB), float("-inf")).argmax())
            assert matcher.accept_token(t)
            out.append(t)
            if matcher.is_terminated():
                break
    return out


# -- the spec ------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    ({}, "structured"),
    ({"regex": "a+", "grammar": "root ::= \"a\""}, "structured"),
    ({"json_schema": SCHEMA, "json_object": True}, "structured"),
    ({"json_schema": 3}, "structured.json_schema"),
    ({"json_schema": "{not json"}, "structured.json_schema"),
    ({"json_object": 1}, "structured.json_object"),
    ({"regex": ""}, "structured.regex"),
    ({"grammar": b"root ::= \"a\""}, "structured.grammar"),
])
def test_a_spec_sets_exactly_one_valid_field(kwargs, field):
    with pytest.raises(ForwardArgumentError) as e:
        StructuredOutput(**kwargs)
    assert e.value.code is ErrorCode.INVALID_STRUCTURED_OUTPUT and e.value.argument == field


def test_sampling_params_take_a_spec_or_its_dict():
    assert SamplingParams(structured={"regex": "a+"}).structured == StructuredOutput(regex="a+")
    with pytest.raises(ForwardArgumentError) as e:
        SamplingParams(structured="a+")
    assert e.value.code is ErrorCode.INVALID_STRUCTURED_OUTPUT and e.value.argument == "SamplingParams.structured"
    with pytest.raises(ForwardArgumentError) as e:
        SamplingParams(structured={"pattern": "a+"})
    assert e.value.code is ErrorCode.INVALID_STRUCTURED_OUTPUT and "pattern" in str(e.value)


# -- the mask ------------------------------------------------------------------------------
def test_the_mask_allows_the_grammars_next_tokens_and_never_the_padded_ids(tok):
    compiler = GrammarCompiler(tok, MODEL_VOCAB, [tok.eos_token_id])
    g = compiler.compile(StructuredOutput(regex="[a-c]x|7"))
    logits = torch.zeros(3, MODEL_VOCAB)
    mask_logits_(logits, [None, g, None])
    allowed = set(torch.isfinite(logits[1]).nonzero().flatten().tolist())
    assert allowed == {tok.convert_tokens_to_ids(c) for c in "abc7"}
    assert torch.equal(logits[[0, 2]], torch.zeros(2, MODEL_VOCAB))  # unstructured rows untouched
    assert g.accept(tok.convert_tokens_to_ids("b")) and not g.accept(tok.convert_tokens_to_ids("b"))
    logits = torch.zeros(1, MODEL_VOCAB)
    mask_logits_(logits, [g])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [tok.convert_tokens_to_ids("x")]
    assert g.accept(tok.convert_tokens_to_ids("x")) and not g.terminated
    logits = torch.zeros(1, MODEL_VOCAB)
    mask_logits_(logits, [g])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [tok.eos_token_id]  # complete: only EOS
    assert g.accept(tok.eos_token_id) and g.terminated


# -- the engine ----------------------------------------------------------------------------
def test_greedy_json_schema_output_equals_masked_transformers_greedy(ckpt, tok, gen):
    prompt = "Person: "
    out = run(engine(gen, tok), [prompt], SamplingParams(temperature=0.0, max_new_tokens=60,
                                                         structured=StructuredOutput(json_schema=SCHEMA)))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] == tok.eos_token_id
    check_person(out.text)
    assert out.token_ids == oracle_greedy(ckpt, tok, prompt, SCHEMA, 60)


def test_sampled_json_schema_outputs_parse_and_validate(tok, gen):
    prompts = ["A: ", "B is ", "{", "name"]
    params = [SamplingParams(temperature=1.0, seed=s, max_new_tokens=60, structured=StructuredOutput(json_schema=SCHEMA))
              for s in range(len(prompts))]
    outs = run(engine(gen, tok), prompts, params)
    for o in outs:
        assert o.finish_reason == "stop", o.text
        check_person(o.text)
    assert len({o.text for o in outs}) > 1  # they were sampled, not all the same greedy string


def test_regex_outputs_fullmatch(tok, gen):
    params = [SamplingParams(temperature=0.0, max_new_tokens=30, structured=StructuredOutput(regex=REGEX))]
    params += [SamplingParams(temperature=1.5, seed=s, top_k=20, max_new_tokens=30, structured=StructuredOutput(regex=REGEX))
               for s in range(3)]
    for o in run(engine(gen, tok), ["mail: "] * 4, params):
        assert o.finish_reason == "stop" and re.fullmatch(REGEX, o.text), o.text


def test_json_object_and_grammar_outputs(tok, gen):
    grammar = 'root ::= "yes" | "no" | [0-9] [0-9]'
    outs = run(engine(gen, tok), ["Q? ", "Q? "], [
        SamplingParams(temperature=0.0, max_new_tokens=8, structured=StructuredOutput(grammar=grammar)),
        SamplingParams(temperature=0.0, max_new_tokens=40, structured=StructuredOutput(json_object=True))])
    assert outs[0].finish_reason == "stop" and re.fullmatch(r"yes|no|[0-9]{2}", outs[0].text)
    if outs[1].finish_reason == "stop":  # a random model may still be inside the object at 40 tokens
        assert isinstance(json.loads(outs[1].text), dict)
    else:
        assert outs[1].text.startswith("{")


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["plain", "run_ahead"])
def test_plain_rows_of_a_mixed_batch_are_untouched(tok, gen, async_scheduling):
    prompts = ["hello world", "abc", "The quick brown fox"]
    plain = [SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True),
             SamplingParams(temperature=0.8, seed=7, max_new_tokens=12, ignore_eos=True),
             SamplingParams(temperature=0.0, max_new_tokens=12, ignore_eos=True, logprobs=2)]
    alone = run(engine(gen, tok, async_scheduling=async_scheduling), prompts, plain)
    structured = SamplingParams(temperature=0.0, max_new_tokens=60, structured=StructuredOutput(json_schema=SCHEMA))
    mixed = run(engine(gen, tok, async_scheduling=async_scheduling), prompts[:2] + ["P: "] + prompts[2:],
                plain[:2] + [structured] + plain[2:])
    assert [o.token_ids for o in mixed[:2] + mixed[3:]] == [o.token_ids for o in alone]
    assert mixed[3].logprobs == pytest.approx(alone[2].logprobs, abs=1e-5)
    check_person(mixed[2].text)


def test_logprobs_of_a_structured_row_are_those_of_the_masked_distribution(ckpt, tok, gen):
    out = run(engine(gen, tok), ["x"], SamplingParams(temperature=0.0, max_new_tokens=1, logprobs=3,
                                                        structured=StructuredOutput(regex="[ab]+")))[0]
    a, b = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("b")
    with torch.no_grad():
        logits = hf_model(ckpt)(torch.tensor([tok.encode("x")])).logits[0, -1]
    expected = torch.log_softmax(logits[[a, b]], dim=-1)  # direct: softmax over the two allowed tokens
    top = out.top_logprobs[0]
    assert top[a] == pytest.approx(float(expected[0]), abs=1e-5)
    assert top[b] == pytest.approx(float(expected[1]), abs=1e-5)
    assert all(v == float("-inf") for k, v in top.items() if k not in (a, b))
    assert out.token_ids[0] in (a, b) and out.logprobs[0] == top[out.token_ids[0]]


def test_speculative_structured_greedy_equals_plain_structured_greedy(tok, gen):
    # a prompt full of the structure's own n-grams, so the drafter proposes often
    prompt = '{"name": "ab", "age": 12} {"name": "abc", "age": 120} {"name": "a", "age": 1} '
    params = [SamplingParams(temperature=0.0, max_new_tokens=60, structured=StructuredOutput(json_schema=SCHEMA)),
              SamplingParams(temperature=0.0, max_new_tokens=30, structured=StructuredOutput(regex=REGEX)),
              SamplingParams(temperature=0.0, max_new_tokens=20)]
    prompts = [prompt, "me@ab.com you@cd.org ", prompt]
    plain = run(engine(gen, tok), prompts, params)
    spec_engine = engine(gen, tok, speculative=NgramDrafter(max_ngram=3, depth=4, branches=2))
    spec = run(spec_engine, prompts, params)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert [o.finish_reason for o in spec] == [o.finish_reason for o in plain]
    assert spec_engine.num_draft_tokens > 0
    check_person(spec[0].text)


def test_grammar_verification_rejects_drafts_outside_the_grammar(tok):
    """Drafts that are the raw argmax (plain greedy verification accepts them) but that the grammar
    forbids are rejected; the output is the masked step-by-step greedy."""
    compiler = GrammarCompiler(tok, MODEL_VOCAB, [tok.eos_token_id])
    regex = "[ab]c*"
    g = compiler.compile(StructuredOutput(regex=regex))
    torch.manual_seed(0)
    logits = torch.randn(4, MODEL_VOCAB)
    z = tok.convert_tokens_to_ids("z")
    logits[:, z] = 10.0  # the raw argmax everywhere: 'z', outside the grammar
    tree = DraftTree([5, z, z, tok.convert_tokens_to_ids("a")], [-1, 0, 1, 0])
    assert verify_greedy(tree, logits).path == [0, 1, 2]  # unmasked: both z drafts accepted
    v = verify_greedy_grammar(tree, logits, g)
    # oracle: an independent matcher, the mask unpacked bit by bit, argmax per node on the path
    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=MODEL_VOCAB, stop_token_ids=[tok.eos_token_id])
    m = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_regex(regex))
    first = int(logits[0].masked_fill(~allowed_ids(m, MODEL_VOCAB), float("-inf")).argmax())
    if first == tree.tokens[3]:  # the 'a' draft is the masked argmax: accepted, then node 3's row decides
        m.accept_token(first)
        second = int(logits[3].masked_fill(~allowed_ids(m, MODEL_VOCAB), float("-inf")).argmax())
        assert v.path == [0, 3] and v.tokens == [first, second]
    else:
        assert v.path == [0] and v.tokens == [first]
    assert g.accept(v.tokens[0])  # the walk left the grammar at the root's state


def test_a_byte_tokenizer_engine_supports_structured_output(tmp_path):
    path = make_checkpoint(tmp_path, "llama", vocab_size=ByteTokenizer.vocab_size + 6)
    g = TextGenerator.from_pretrained(path, device="cpu", dtype=torch.float32)
    eng = LLMEngine(g, num_blocks=32, block_size=8, tokenizer=ByteTokenizer(), freeze_gc=False, async_scheduling=False)
    out = run(eng, ["date: "], SamplingParams(temperature=0.0, max_new_tokens=12,
                                             structured=StructuredOutput(regex=r"20[0-9]{2}-[01][0-9]")))[0]
    assert out.finish_reason == "stop" and re.fullmatch(r"20[0-9]{2}-[01][0-9]", out.text)


# -- errors --------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, field", [
    (StructuredOutput(json_schema={"type": "nonsense"}), "structured.json_schema"),
    (StructuredOutput(regex="[a-"), "structured.regex"),
    (StructuredOutput(grammar="root ::= undefined_rule"), "structured.grammar"),
])
def test_a_spec_that_does_not_compile_is_a_coded_error_leaving_no_request(tok, gen, spec, field):
    eng = engine(gen, tok)
    with pytest.raises(ForwardArgumentError) as e:
        eng.add_request("hi", SamplingParams(structured=spec), request_id="bad", stream_callback=lambda o: None)
    assert e.value.code is ErrorCode.INVALID_STRUCTURED_OUTPUT and e.value.argument == field
    assert not eng.requests and not eng._callbacks and not eng.has_unfinished() and eng.step() == []
    eng.add_request("hi", SamplingParams(max_new_tokens=2), request_id="bad")  # the id is free again
    assert eng.has_unfinished()


def test_structured_output_needs_a_tokenizer(gen):
    eng = LLMEngine(gen, num_blocks=16, block_size=8, freeze_gc=False)
    with pytest.raises(GeneratorStateError) as e:
        eng.add_request([5, 6], SamplingParams(structured=StructuredOutput(regex="a+")))
    assert e.value.code is ErrorCode.STRUCTURED_OUTPUT_UNAVAILABLE and e.value.argument == "tokenizer"
    assert not eng.requests and not eng.has_unfinished()


def test_without_xgrammar_the_library_imports_and_structured_requests_are_refused(tok, gen, monkeypatch):
    import subprocess
    import sys

    blocked = "import sys; sys.modules['xgrammar'] = None; import text_generator, text_generator.structured; " \
              "text_generator.structured.StructuredOutput(regex='a'); print('ok')"
    assert subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True).stdout.strip() == "ok"
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar now raises ImportError
    eng = engine(gen, tok)
    with pytest.raises(GeneratorStateError) as e:
        eng.add_request("hi", SamplingParams(structured=StructuredOutput(regex="a+")))
    assert e.value.code is ErrorCode.STRUCTURED_OUTPUT_UNAVAILABLE and "xgrammar" in str(e.value)
    assert not eng.requests and not eng.has_unfinished()


def test_a_token_outside_the_grammar_fails_only_its_request(tok, gen):
    """A sampler that ignores the mask (here: always the token 'z') cannot break the grammar:
    the structured request fails with a message naming the token, a plain one goes on."""
    from text_generator.sampling import Sampler, SamplerOutput

    z = tok.convert_tokens_to_ids("z")

    class AlwaysZ(Sampler):
        def __call__(self, logits, params, **kw):
            return SamplerOutput(token_ids=torch.full((logits.shape[0],), z, dtype=torch.int64))

    outs = run(engine(gen, tok, sampler=AlwaysZ()), ["a", "b"], [
        SamplingParams(max_new_tokens=4, structured=StructuredOutput(regex="[0-9]+")),
        SamplingParams(max_new_tokens=4)])
    assert outs[0].finish_reason == "error" and f"token {z} " in outs[0].error
    assert outs[1].finish_reason == "length" and outs[1].token_ids == [z] * 4
