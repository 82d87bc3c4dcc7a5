"""The OpenAI-compatible server, driven by the official `openai` client against a real uvicorn on
127.0.0.1: greedy text equals transformers' greedy generate (peft's for a LoRA model name),
logprobs equal log_softmax of transformers' logits, streams concatenate to the plain answer,
errors carry OpenAI's body with our codes, and disconnects and a concurrent load give every KV
block back."""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time

import httpx
import openai
import pytest

from conftest import hf_generate, hf_model
from serve_fixtures import (Server, fail_first_forward, greedy, slow_forward, logprobs_of, make_chat_checkpoint, make_lora,
                            make_tokenizer, unread_bytes)

MAX_MODEL_LEN = 1024  # the tiny model's limit: a disconnected request could run long
MAX_NUM_SEQS, MAX_QUEUE = 16, 48
PROMPTS = ["the quick brown fox", "hello world, how are", "one two three"]
EXTENSIONS = ("top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids")  # vLLM's fields


def split(kw: dict) -> dict:
    """Request fields -> the openai client's keyword arguments (extensions go in extra_body)."""
    out = {k: v for k, v in kw.items() if k not in EXTENSIONS}
    extra = {k: v for k, v in kw.items() if k in EXTENSIONS}
    return {**out, "extra_body": extra} if extra else out


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    base = make_chat_checkpoint(tmp_path_factory.mktemp("serve_llama"))
    return base, make_lora(base, tmp_path_factory.mktemp("serve_lora"))


@pytest.fixture(scope="module")
def server(ckpt, one_thread):
    base, lora = ckpt
    s = Server([base, "--device", "cpu", "--dtype", "float32", "--served-model-name", "tiny",
                "--lora", f"sql={lora}", "--max-model-len", str(MAX_MODEL_LEN), "--block-size", "4",
                "--max-num-seqs", str(MAX_NUM_SEQS), "--max-queue", str(MAX_QUEUE)])
    yield s
    s.close()


@pytest.fixture(scope="module")
def slow_server(ckpt, one_thread):
    """A server whose steps take >= 5 ms each: a request of MAX_MODEL_LEN - 16 tokens runs for
    seconds, however fast the machine."""
    s = Server([ckpt[0], "--device", "cpu", "--served-model-name", "tiny", "--max-model-len", str(MAX_MODEL_LEN),
                "--block-size", "4", "--max-num-seqs", "4"], on_start=slow_forward)
    yield s
    s.close()


@pytest.fixture(scope="module")
def client(server):
    return server.client()


@pytest.fixture(scope="module")
def oracle(ckpt):
    base, lora = ckpt
    from peft import PeftModel

    return {"tiny": hf_model(base), "sql": PeftModel.from_pretrained(hf_model(base), lora).eval(),
            "tok": make_tokenizer()}


def expected_text(oracle, model: str, ids: list[int], n: int) -> tuple[list[int], str]:
    new = greedy(oracle[model], ids, n)
    return new, oracle["tok"].decode(new, skip_special_tokens=True)


def chat_ids(oracle, messages) -> list[int]:
    out = oracle["tok"].apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


# -- answers ---------------------------------------------------------------------------------
def test_models_lists_the_base_and_the_lora_adapters(client):
    ids = {m.id for m in client.models.list().data}
    assert ids == {"tiny", "sql"}


@pytest.mark.parametrize("model", ["tiny", "sql"])
def test_completion_greedy_text_is_transformers_greedy(client, oracle, model):
    """A batch of prompts (one choice each) under the base model and under the LoRA model name
    (peft's greedy)."""
    r = client.completions.create(model=model, prompt=PROMPTS, max_tokens=12, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    for p, c in zip(PROMPTS, r.choices):
        new, text = expected_text(oracle, model, oracle["tok"](p).input_ids, 12)
        assert c.text == text
        assert c.finish_reason == ("stop" if new[-1] == 2 else "length")
    assert r.usage.prompt_tokens == sum(len(oracle["tok"](p).input_ids) for p in PROMPTS)


def test_chat_greedy_text_is_transformers_greedy_over_the_chat_template(client, oracle):
    messages = [{"role": "system", "content": "one two"}, {"role": "user", "content": "hello world"}]
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
    ids = chat_ids(oracle, messages)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == expected_text(oracle, "tiny", ids, 10)[1]
    assert r.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_streamed_chunks_concatenate_to_the_plain_answer_and_end_with_usage(client, chat):
    kw = dict(model="tiny", max_tokens=16, temperature=0.9, top_p=0.9, seed=7, n=2)
    if chat:
        kw["messages"] = [{"role": "user", "content": "the lazy dog"}]
        plain = client.chat.completions.create(**kw)
        stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    else:
        kw["prompt"] = "the lazy dog"
        plain = client.completions.create(**kw)
        stream = client.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
    texts, reasons, chunks = ["", ""], [None, None], list(stream)
    for ch in chunks[:-1]:
        for c in ch.choices:
            texts[c.index] += (c.delta.content or "") if chat else c.text
            reasons[c.index] = c.finish_reason or reasons[c.index]
    want = [c.message.content if chat else c.text for c in plain.choices]
    assert texts == want
    assert reasons == [c.finish_reason for c in plain.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_n_choices_are_independent_requests_on_one_prompt(client, oracle):
    r = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=0, n=2)
    text = expected_text(oracle, "tiny", oracle["tok"](PROMPTS[0]).input_ids, 8)[1]
    assert [(c.index, c.text) for c in r.choices] == [(0, text), (1, text)]
    seeded = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=1.0, seed=3, n=2)
    again = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=1.0, seed=3, n=2)
    assert [c.text for c in seeded.choices] == [c.text for c in again.choices]


def test_n_choices_share_the_prompts_kv_blocks_through_the_prefix_cache(client, server):
    """The first choice computes the prompt; the other three find its full blocks in the cache."""
    cached = server.state.metrics.cached_prompt_tokens
    before = cached._value.get()
    prompt = [(7 * i) % 150 + 6 for i in range(41)]  # 10 full blocks of 4 tokens and one more
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=1.0, seed=1, n=4)
    assert len(r.choices) == 4
    assert cached._value.get() - before == 3 * 40


def test_stop_strings_and_stop_token_ids_cut_the_greedy_text(client, oracle):
    ids = oracle["tok"](PROMPTS[1]).input_ids
    new, text = expected_text(oracle, "tiny", ids, 24)
    if 2 in new:
        new, text = new[:new.index(2)], oracle["tok"].decode(new[:new.index(2)], skip_special_tokens=True)
    assert len(text) >= 6, "the oracle's text is too short for this test"
    stop = text[3:5]
    r = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=24, temperature=0, stop=[stop])
    assert r.choices[0].text == text[:text.find(stop)] and r.choices[0].finish_reason == "stop"
    r = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=24, temperature=0,
                                  extra_body={"stop_token_ids": [new[4]]})
    k = new.index(new[4])
    assert r.choices[0].text == oracle["tok"].decode(new[:k], skip_special_tokens=True)
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == k + 1


def test_logprobs_are_log_softmax_of_transformers_logits(client, oracle):
    ids = oracle["tok"](PROMPTS[2]).input_ids
    new = greedy(oracle["tiny"], ids, 6)
    want, rows = logprobs_of(oracle["tiny"], ids, new)
    r = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=6, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx(want, abs=1e-4)
    for top, row in zip(lp.top_logprobs, rows):  # token strings may collide: compare the values
        assert sorted(top.values(), reverse=True) == pytest.approx(row.topk(3).values.tolist()[:len(top)], abs=1e-4)
    messages = [{"role": "user", "content": "seven eight"}]
    cids = chat_ids(oracle, messages)
    cnew = greedy(oracle["tiny"], cids, 5)
    cwant, crows = logprobs_of(oracle["tiny"], cids, cnew)
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=5, temperature=0, logprobs=True,
                                       top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx(cwant, abs=1e-4)
    for c, row in zip(content, crows):
        assert [t.logprob for t in c.top_logprobs] == pytest.approx(row.topk(2).values.tolist(), abs=1e-4)


# -- refusals ----------------------------------------------------------------------------------
def assert_error(exc_info, param: str | None, code: str) -> None:
    body = exc_info.value.body
    assert body["param"] == param and body["code"] == code and body["message"], body


def test_unknown_model_is_404_naming_the_model(client, server):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    assert_error(e, "model", "TG_MODEL_NOT_FOUND")
    assert "nope" in e.value.body["message"]


def test_too_long_prompts_and_bad_parameters_are_400_and_change_nothing(client, server):
    free = server.wait_idle()["free_blocks"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=list(range(10, 20)) * (MAX_MODEL_LEN // 10 + 1), max_tokens=2)
    assert_error(e, "prompt", "TG_PROMPT_TOO_LONG")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hi", max_tokens=MAX_MODEL_LEN)
    assert_error(e, "max_tokens", "TG_PROMPT_TOO_LONG")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, top_p=1.5)
    assert_error(e, "top_p", "TG_INVALID_REQUEST")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=[5, 10**6], max_tokens=2)
    assert_error(e, "prompt", "TG_INVALID_REQUEST")
    for bad in ([-1, 5], [[5, 6], [7, 10**6]]):  # a negative id; an id out of range in a batch's second prompt
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="tiny", prompt=bad, max_tokens=2)
        assert_error(e, "prompt", "TG_INVALID_REQUEST")
        assert str(-1 if bad[0] == -1 else 10**6) in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[], max_tokens=2)
    assert_error(e, "messages", "TG_INVALID_REQUEST")
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, logit_bias={"5": 10})
    assert_error(e, "logit_bias", "TG_INVALID_REQUEST")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                       top_logprobs=2)
    assert_error(e, "top_logprobs", "TG_INVALID_REQUEST")
    st = server.stats()
    assert st["free_blocks"] == free and not st["requests"]


def test_more_requests_than_the_queue_holds_is_503(client, server):
    with pytest.raises(openai.InternalServerError) as e:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, n=MAX_NUM_SEQS + MAX_QUEUE + 1)
    assert e.value.status_code == 503
    assert_error(e, None, "TG_QUEUE_FULL")


def structured_available() -> bool:
    """text_generator.structured and the engine's support for it (SamplingParams.structured)."""
    try:
        import text_generator.structured  # noqa: F401
    except ImportError:
        return False
    from text_generator.sampling import SamplingParams

    return "structured" in SamplingParams.__dataclass_fields__


def test_structured_output_follows_a_json_schema(client):
    if not structured_available():
        pytest.skip("text_generator.structured is not in this build")
    import json

    # a boolean (a random model could write an integer's digits until max_tokens)
    schema = {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"],
              "additionalProperties": False}
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "json"}], max_tokens=200, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
    value = json.loads(r.choices[0].message.content)
    assert set(value) == {"a"} and isinstance(value["a"], bool)


def test_structured_output_is_refused_clearly_without_its_module(client):
    if structured_available():
        pytest.skip("text_generator.structured exists")
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                       response_format={"type": "json_object"})
    assert_error(e, "response_format", "TG_STRUCTURED_OUTPUT_UNAVAILABLE")
    assert "structured output not available" in e.value.body["message"]


# -- adapters, health, metrics ----------------------------------------------------------------
def test_lora_adapters_load_and_unload_at_run_time(client, server, ckpt, oracle):
    _, lora = ckpt
    http = httpx.Client(base_url=server.url, trust_env=False, timeout=60)
    assert http.post("/v1/load_lora_adapter", json={"lora_name": "sql2", "lora_path": lora}).status_code == 200
    assert {m.id for m in client.models.list().data} == {"tiny", "sql", "sql2"}
    r = client.completions.create(model="sql2", prompt=PROMPTS[0], max_tokens=8, temperature=0)
    assert r.choices[0].text == expected_text(oracle, "sql", oracle["tok"](PROMPTS[0]).input_ids, 8)[1]
    bad = http.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/nonexistent"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "TG_ADAPTER_REFUSED"
    assert http.post("/v1/unload_lora_adapter", json={"lora_name": "sql2"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="sql2", prompt="hi", max_tokens=2)
    gone = http.post("/v1/unload_lora_adapter", json={"lora_name": "sql2"})
    assert gone.status_code == 404 and gone.json()["error"]["param"] == "lora_name"


def test_health_and_metrics(client, server):
    client.completions.create(model="tiny", prompt="hi", max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    http = httpx.Client(base_url=server.url, trust_env=False, timeout=60)
    assert http.get("/health").status_code == 200
    text = http.get("/metrics").text
    for name in ("tg_requests_total", "tg_time_to_first_token_seconds_count", "tg_inter_token_latency_seconds_count",
                 "tg_e2e_request_latency_seconds_count", "tg_num_requests_waiting", "tg_num_requests_running",
                 "tg_kv_cache_usage_ratio", "tg_prefix_cache_hit_rate", "tg_spec_decode_acceptance_rate"):
        assert name in text, name
    count = next(float(line.split()[-1]) for line in text.splitlines()
                 if line.startswith("tg_time_to_first_token_seconds_count"))
    assert count >= 1
    steps = next(float(line.split()[-1]) for line in text.splitlines() if line.startswith("tg_engine_steps "))
    assert steps >= 3  # (no speculation here: a step gives a request one token at most)


def test_a_stream_behind_the_engine_sends_the_queued_tokens_as_one_chunk(slow_server, oracle):
    """The HTTP side is held up (its event loop blocked) while the engine steps on: once it resumes,
    the stream sends everything queued meanwhile as one chunk, and the chunks still concatenate to
    transformers' greedy text with log_softmax logprobs (tokens, values, text offsets)."""
    server = slow_server
    server.wait_idle()
    n = 40
    ids = oracle["tok"](PROMPTS[0]).input_ids
    new = hf_generate(oracle["tiny"], ids, n)  # exactly n tokens: the request ignores EOS
    want, rows = logprobs_of(oracle["tiny"], ids, new)
    kw = dict(model="tiny", prompt=PROMPTS[0], max_tokens=n, temperature=0, logprobs=2, extra_body={"ignore_eos": True})
    plain = server.client().completions.create(**kw).choices[0]
    resume = threading.Event()
    chunks = []
    with server.client().completions.create(stream=True, **kw) as stream:
        it = iter(stream)
        chunks.append(next(it))  # the request runs; now hold the HTTP process's event loop
        held = threading.Event()
        server.engine._loop.call_soon_threadsafe(lambda: held.set() or resume.wait(60))
        assert held.wait(60)
        # the loop reads the engine's messages, so its stats cannot be asked now: count the steps'
        # messages piling up in the out pipe instead (one write() each, so each growth of the
        # unread bytes is at least one more step, i.e. one more token of the request)
        fd, grown, last = server.engine._out.fileno(), 0, unread_bytes(server.engine._out.fileno())
        deadline = time.monotonic() + 60
        while grown < 5:  # >= 5 more tokens behind the HTTP side's back
            now = unread_bytes(fd)
            grown, last = grown + (now > last), now
            assert time.monotonic() < deadline, "the engine made no progress"
            time.sleep(0.001)
        resume.set()
        chunks += list(it)
    choices = [c.choices[0] for c in chunks if c.choices]
    per_chunk = [len(c.logprobs.tokens) for c in choices if c.logprobs is not None]
    assert sum(per_chunk) == n and max(per_chunk) >= 5, per_chunk  # one chunk carried what queued up
    text = "".join(c.text for c in choices)
    assert text == plain.text
    assert [lp for c in choices if c.logprobs for lp in c.logprobs.token_logprobs] == pytest.approx(want, abs=1e-4)
    offsets = [o for c in choices if c.logprobs for o in c.logprobs.text_offset]
    assert offsets == plain.logprobs.text_offset
    tops = [top for c in choices if c.logprobs for top in c.logprobs.top_logprobs]
    for top, row in zip(tops, rows):
        assert sorted(top.values(), reverse=True) == pytest.approx(row.topk(2).values.tolist()[:len(top)], abs=1e-4)
    assert choices[-1].finish_reason == "length"


# -- disconnects and load ------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_a_client_that_disconnects_gives_every_block_back(slow_server, stream):
    """A long request whose client hangs up (mid-stream, or while waiting for the whole answer)
    is aborted: its blocks come back long before it could have run to its length."""
    server = slow_server
    server.wait_idle()
    lengths = server.state.metrics.requests.labels(finish_reason="length")
    aborts = server.state.metrics.requests.labels(finish_reason="abort")
    before, aborted = lengths._value.get(), aborts._value.get()
    body = {"model": "tiny", "prompt": "one two three four", "max_tokens": MAX_MODEL_LEN - 16, "stream": stream,
            "ignore_eos": True, "temperature": 0}
    if stream:
        with httpx.Client(base_url=server.url, trust_env=False, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=body) as r:
                lines = r.iter_lines()  # kept: closing this iterator (a break out of it) closes the connection
                events = 0
                while events < 3:
                    events += next(lines).startswith("data: ")
                assert server.stats()["requests"], "the request should still be running"
    else:  # a raw socket, closed once the engine runs the request
        import json

        payload = json.dumps(body).encode()
        conn = socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
        deadline = time.monotonic() + 30
        while not any(server.stats()["requests"].values()):
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.005)
        conn.close()
    st = server.wait_idle()  # the engine process's own count: no block held, every block free or cached
    assert st["used_blocks"] == 0 and st["free_blocks"] + st["cached_blocks"] == st["num_blocks"]
    assert lengths._value.get() == before and aborts._value.get() == aborted + 1  # aborted, not run to its length


def test_concurrent_streaming_clients_with_disconnects_lose_no_tokens(server, client):
    """32 streaming clients x 2 requests with mixed parameters, a quarter hanging up after a
    few chunks; every finished stream equals the same request run alone, every block comes back
    and /health answers."""
    rng = random.Random(0)
    kinds = [dict(temperature=0), dict(temperature=0.8, top_k=20, seed=11), dict(temperature=1.0, top_p=0.8, seed=5),
             dict(temperature=0.7, min_p=0.1, seed=9), dict(temperature=0, frequency_penalty=0.5, presence_penalty=0.3),
             dict(temperature=0, stop=["e"])]
    jobs = [(rng.choice(PROMPTS) + " " * rng.randrange(2), rng.choice(kinds), rng.randrange(4, 20),
             rng.random() < 0.25) for _ in range(64)]

    async def run_all():
        aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0,
                                     http_client=httpx.AsyncClient(trust_env=False, timeout=120))

        async def one(job):
            prompt, kw, n, hang_up = job
            stream = await aclient.completions.create(model="tiny", prompt=prompt, max_tokens=n, stream=True,
                                                     **split(kw))
            text, k = "", 0
            async for ch in stream:
                text += ch.choices[0].text
                k += 1
                if hang_up and k == 2:
                    await stream.close()
                    return None
            return text

        async def worker(i):
            return [await one(job) for job in jobs[2 * i:2 * i + 2]]

        results = await asyncio.gather(*(worker(i) for i in range(32)))
        await aclient.close()
        return [t for pair in results for t in pair]

    streamed = asyncio.run(run_all())
    server.wait_idle()
    assert sum(t is not None for t in streamed) >= 32
    for i, ((p, kw, n, _), s) in enumerate(zip(jobs, streamed)):
        if s is not None:  # a client that hung up has no text to compare
            assert s == client.completions.create(model="tiny", prompt=p, max_tokens=n, **split(kw)).choices[0].text, \
                (i, jobs[i])
    server.wait_idle()
    assert httpx.get(f"{server.url}/health", trust_env=False).status_code == 200


def test_a_failed_engine_step_fails_its_requests_with_500_and_the_server_goes_on(ckpt, one_thread):
    """A fault injected into the model's forward in the engine process (the server's dependency,
    not the server)."""
    s = Server([ckpt[0], "--device", "cpu", "--served-model-name", "tiny", "--max-model-len", "64",
                "--max-num-seqs", "4"], on_start=fail_first_forward)
    try:
        client = s.client()
        with pytest.raises(openai.InternalServerError) as e:
            client.completions.create(model="tiny", prompt="hi", max_tokens=4)
        assert e.value.status_code == 500
        assert_error(e, None, "TG_ENGINE_FAILED")
        assert "injected device fault" in e.value.body["message"]
        s.wait_idle()
        r = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=4, temperature=0)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert httpx.get(f"{s.url}/health", trust_env=False).status_code == 200
    finally:
        s.close()


def test_a_dead_engine_process_gives_503s_and_an_unhealthy_health_not_a_hang(ckpt, one_thread):
    """The engine process is killed mid-request: the running stream ends with an error event,
    a waiting plain request gets 503, new requests get 503 and /health 503."""
    import json
    import os
    import signal
    import threading

    s = Server([ckpt[0], "--device", "cpu", "--served-model-name", "tiny", "--max-model-len", "256",
                "--max-num-seqs", "4"])
    try:
        client = s.client()
        assert httpx.get(f"{s.url}/health", trust_env=False).status_code == 200
        plain: list = []

        def plain_request():
            try:
                client.completions.create(model="tiny", prompt="one two", max_tokens=200, temperature=0,
                                          extra_body={"ignore_eos": True})
                plain.append(None)
            except openai.APIStatusError as e:
                plain.append(e)

        waiter = threading.Thread(target=plain_request)
        body = {"model": "tiny", "prompt": "one two three", "max_tokens": 200, "stream": True, "ignore_eos": True,
                "temperature": 0}
        events = []
        with httpx.Client(base_url=s.url, trust_env=False, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                for line in lines:
                    if line.startswith("data: "):
                        events.append(line[6:])
                    if len(events) == 2:
                        break
                waiter.start()
                deadline = time.monotonic() + 30
                while len(s.stats()["requests"]) < 2:
                    assert time.monotonic() < deadline, "the plain request never reached the engine"
                    time.sleep(0.01)
                os.kill(s.engine.info["pid"], signal.SIGKILL)
                events += [line[6:] for line in lines if line.startswith("data: ")]
        waiter.join(timeout=60)
        assert not waiter.is_alive(), "the plain request hangs"
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "TG_ENGINE_FAILED" and "engine process died" in error["message"]
        assert isinstance(plain[0], openai.APIStatusError) and plain[0].status_code == 503
        with pytest.raises(openai.InternalServerError) as e:
            client.completions.create(model="tiny", prompt="hi", max_tokens=2)
        assert e.value.status_code == 503
        assert_error(e, None, "TG_ENGINE_FAILED")
        health = httpx.get(f"{s.url}/health", trust_env=False)
        assert health.status_code == 503 and "engine process died" in health.json()["error"]["message"]
    finally:
        s.close()


def test_a_model_without_a_chat_template_refuses_chat_with_400(tmp_path, one_thread):
    s = Server([make_chat_checkpoint(tmp_path, chat_template=None), "--device", "cpu", "--max-model-len", "64",
                "--max-num-seqs", "2"])
    try:
        c = s.client()
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model=str(tmp_path), messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert_error(e, "messages", "TG_NO_CHAT_TEMPLATE")
        assert c.completions.create(model=str(tmp_path), prompt="hi", max_tokens=2).choices[0].text is not None
    finally:
        s.close()


@pytest.mark.parametrize("flags, message", [
    (["--tensor-parallel"], "--tensor-parallel: expected to run under torchrun"),
    (["--lora", "nameonly"], "--lora: expected NAME=PATH"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization: expected a fraction"),
])
def test_serve_flags_are_refused_clearly(ckpt, capsys, flags, message):
    from text_generator.cli import main

    assert main(["serve", ckpt[0], "--device", "cpu", *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("name", ["fp8", "fp8_e4m3"])
def test_serve_kv_cache_dtype_fp8_runs_on_an_e4m3_cache(ckpt, one_thread, name):
    """`serve --kv-cache-dtype fp8` (or vLLM's name, fp8_e4m3) builds its engine (what the engine process runs) over an e4m3 cache
    (the FP8 cache's numbers are checked in tests/model_wrapper/test_fp8_kv_cache.py)."""
    import torch

    from text_generator.cli import build_parser
    from text_generator.serve.engine_worker import build_engine

    args = build_parser().parse_args(["serve", ckpt[0], "--device", "cpu", "--max-model-len", "64",
                                      "--max-num-seqs", "2", "--kv-cache-dtype", name])
    engine, _ = build_engine(args)
    assert all(t.dtype == torch.float8_e4m3fn for pair in engine.kv_cache for t in pair)


def test_speculative_ngram_serving_keeps_greedy_text(ckpt, oracle, one_thread):
    s = Server([ckpt[0], "--device", "cpu", "--served-model-name", "tiny", "--max-model-len", "128",
                "--max-num-seqs", "4", "--speculative", "ngram"])
    try:
        prompt = "one two three one two three one two"
        r = s.client().completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0)
        assert r.choices[0].text == expected_text(oracle, "tiny", oracle["tok"](prompt).input_ids, 16)[1]
    finally:
        s.close()


class ServeProcess:
    """`python -m text_generator serve ...` (optionally under torchrun) in a subprocess on a free
    port, until close()."""

    def __init__(self, launcher: list[str], args: list[str]):
        import os
        import subprocess

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        sock.close()
        env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONPATH=root)
        self.proc = subprocess.Popen([*launcher, "-m", "text_generator", "serve", *args, "--port", str(self.port)],
                                     cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 180
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError(f"the server did not start:\n{self.proc.stdout.read()[-4000:]}")
            try:
                if httpx.get(f"{self.url}/health", trust_env=False).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)

    def client(self):
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0,
                             http_client=httpx.Client(trust_env=False, timeout=120))

    def close(self) -> None:
        import subprocess

        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def test_python_m_text_generator_serve_answers_over_http(ckpt):
    """The command line end to end: a subprocess serving until it is stopped."""
    import sys

    s = ServeProcess([sys.executable], [ckpt[0], "--device", "cpu", "--served-model-name", "tiny",
                                        "--max-model-len", "64"])
    try:
        c = s.client()
        assert [m.id for m in c.models.list().data] == ["tiny"]
        assert c.completions.create(model="tiny", prompt="hi", max_tokens=3).usage.completion_tokens >= 1
    finally:
        s.close()


def test_tensor_parallel_serving_under_torchrun_gives_transformers_greedy(ckpt, oracle):
    """`torchrun --nproc-per-node 2 -m text_generator serve --tensor-parallel` (gloo on the CPU):
    rank 0 serves HTTP, its engine process and rank 1 step in lockstep. Greedy text of the base
    model, of a LoRA model name (peft's) and of an adapter loaded at run time equals the oracle's;
    n=2 streams (the second choice joins through the prefix cache) equal the plain answer."""
    import sys

    base, lora = ckpt
    s = ServeProcess([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"],
                     [base, "--tensor-parallel", "--device", "cpu", "--dtype", "float32", "--served-model-name",
                      "tiny", "--lora", f"sql={lora}", "--max-model-len", "128", "--block-size", "4"])
    try:
        c = s.client()
        for model in ("tiny", "sql"):
            r = c.completions.create(model=model, prompt=PROMPTS, max_tokens=10, temperature=0)
            for p, ch in zip(PROMPTS, r.choices):
                assert ch.text == expected_text(oracle, model, oracle["tok"](p).input_ids, 10)[1], (model, p)
        assert httpx.post(f"{s.url}/v1/load_lora_adapter", json={"lora_name": "sql2", "lora_path": lora},
                          trust_env=False, timeout=60).status_code == 200
        r = c.completions.create(model="sql2", prompt=PROMPTS[0], max_tokens=8, temperature=0)
        assert r.choices[0].text == expected_text(oracle, "sql", oracle["tok"](PROMPTS[0]).input_ids, 8)[1]
        messages = [{"role": "user", "content": "hello world"}]
        want = expected_text(oracle, "tiny", chat_ids(oracle, messages), 8)[1]
        texts = ["", ""]
        for chunk in c.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0, n=2,
                                               stream=True):
            for ch in chunk.choices:
                texts[ch.index] += ch.delta.content or ""
        assert texts == [want, want]
    finally:
        s.close()


def test_the_engine_worker_packs_logprob_rows_only_for_requests_that_asked(ckpt, oracle, one_thread):
    """One step's message carries, per request, the new tokens' logprobs and top dicts when it asked
    (log_softmax of transformers' logits, concatenated over the steps) and None when it did not; a
    step in which nobody asks sends no rows at all."""
    from text_generator import SamplingParams, TextGenerator
    from text_generator.engine import LLMEngine
    from text_generator.serve.engine_worker import EngineWorker
    from text_generator.tokenizer import load_tokenizer

    engine = LLMEngine(TextGenerator.from_pretrained(ckpt[0], device="cpu"), num_blocks=64, block_size=4,
                       tokenizer=load_tokenizer(ckpt[0]), freeze_gc=False)
    sent = []
    worker = EngineWorker(engine, sent.append)
    ids = oracle["tok"](PROMPTS[2]).input_ids
    worker.apply([("add", [("lp", ids, SamplingParams(temperature=0, max_new_tokens=4, ignore_eos=True, logprobs=2)),
                           ("plain", ids + [5], SamplingParams(temperature=0, max_new_tokens=7, ignore_eos=True))],
                   None)])
    while worker.busy:
        worker.step()
    lps, tops, toks = [], [], []
    for kind, (rids, new_ids, _, rows, _), _ in sent:
        assert kind == "out"
        asked = [i for i, rid in enumerate(rids) if rid == "lp"]
        if not asked:
            assert rows is None  # only "plain" left: no column at all
            continue
        for i, rid in enumerate(rids):
            if rid == "plain":
                assert rows[i] is None
            else:
                lps += rows[i][0]
                tops += rows[i][1]
                toks += new_ids[i]
    want, full = logprobs_of(oracle["tiny"], ids, toks)
    assert toks == hf_generate(oracle["tiny"], ids, 4)
    assert lps == pytest.approx(want, abs=1e-4)
    for top, row in zip(tops, full):
        assert sorted(top.values(), reverse=True) == pytest.approx(row.topk(2).values.tolist(), abs=1e-4)


def _records(batch) -> list:
    """An "out" message's columns (engine_worker.pack) -> one Lean per reported request."""
    from text_generator.serve.engine_worker import Lean

    rids, new_ids, deltas, rows, ends = batch
    ended = {e[0]: e[1:] for e in ends}
    out = []
    for i, rid in enumerate(rids):
        reason, error, num_cached, prompt_len = ended.get(i, (None, None, 0, 0))
        out.append(Lean(rid, new_ids[i], deltas[i], reason, error, num_cached, prompt_len))
    return out


def test_the_engine_worker_ends_every_submitted_request_exactly_once(ckpt, oracle, one_thread):
    """The engine process's loop body, in this process: a group of three choices of one prompt
    (the first computes it, the others wait for its blocks), the third aborted while it waits,
    then a request aborted while it runs. Every request gets one final output; the finished
    choices are transformers' greedy."""
    from text_generator import SamplingParams, TextGenerator
    from text_generator.engine import LLMEngine
    from text_generator.serve.engine_worker import EngineWorker
    from text_generator.tokenizer import load_tokenizer

    engine = LLMEngine(TextGenerator.from_pretrained(ckpt[0], device="cpu"), num_blocks=64, block_size=4,
                       tokenizer=load_tokenizer(ckpt[0]), freeze_gc=False)
    sent = []
    worker = EngineWorker(engine, sent.append)
    ids = oracle["tok"](PROMPTS[0]).input_ids
    greedy6 = SamplingParams(temperature=0, max_new_tokens=6, ignore_eos=True)
    worker.apply([("add", [(f"c{i}", ids, greedy6) for i in range(3)], None), ("abort", "c2")])
    worker.apply([("add", [("long", ids, SamplingParams(temperature=0, max_new_tokens=50, ignore_eos=True))], None)])
    steps = 0
    while worker.busy:
        worker.step()
        steps += 1
        if steps == 3:
            worker.apply([("abort", "long")])
    outs = [o for kind, batch, _ in sent if kind == "out" for o in _records(batch)]
    finals = {}
    for o in outs:
        if o.finish_reason is not None:
            assert o.request_id not in finals, f"{o.request_id} ended twice"
            finals[o.request_id] = o
    assert {k: o.finish_reason for k, o in finals.items()} == {"c0": "length", "c1": "length", "c2": "abort",
                                                                 "long": "abort"}
    want = hf_generate(oracle["tiny"], ids, 6)  # exactly 6 tokens, as ignore_eos asks
    for rid in ("c0", "c1"):
        assert [t for o in outs if o.request_id == rid for t in o.new_token_ids] == want
    assert finals["c0"].num_cached == 0 and finals["c1"].num_cached == 4 * ((len(ids) - 1) // 4)  # its full blocks
    assert engine.block_manager.num_used_blocks == 0 and not engine.requests


def test_a_burst_of_submissions_enters_the_engine_together_and_is_admitted_in_one_step(ckpt, oracle, one_thread):
    """Submissions that pile up in the command pipe while the engine steps (one message per HTTP
    request) are all read before the next step, and that step admits every one the budget allows:
    its outputs carry each request's first token, transformers' greedy first token."""
    import multiprocessing

    from text_generator import SamplingParams, TextGenerator
    from text_generator.engine import LLMEngine
    from text_generator.serve.engine_worker import EngineWorker, intake

    engine = LLMEngine(TextGenerator.from_pretrained(ckpt[0], device="cpu"), num_blocks=256, block_size=4,
                       max_num_seqs=16, max_num_batched_tokens=512, freeze_gc=False)
    sent = []
    worker = EngineWorker(engine, sent.append)
    recv, send = multiprocessing.Pipe(duplex=False)
    prompts = [oracle["tok"](f"{p} {i}").input_ids for i in range(4) for p in PROMPTS]  # 12 distinct prompts
    params = SamplingParams(temperature=0, max_new_tokens=2, ignore_eos=True)
    for i, ids in enumerate(prompts):
        send.send(("add", [(f"r{i}", ids, params)], None))
    cmds = intake(recv, 0)
    assert [c[1][0][0] for c in cmds] == [f"r{i}" for i in range(len(prompts))]
    assert intake(recv, 0) == []  # nothing left behind
    worker.apply(cmds)
    worker.step()
    (kind, (rids, new_ids, *_), stats), = sent
    assert kind == "out" and sorted(rids) == sorted(f"r{i}" for i in range(len(prompts)))
    first = {rid: ids for rid, ids in zip(rids, new_ids)}
    for i, ids in enumerate(prompts):
        assert first[f"r{i}"] == hf_generate(oracle["tiny"], ids, 1)
    assert stats[1] == len(prompts)  # all running after one step
    send.close()
    assert intake(recv, 0) == [("stop",)]  # the HTTP process gone: stop


def test_the_step_trace_records_every_step_of_the_engine_loop(ckpt, oracle, one_thread, tmp_path, monkeypatch):
    """TG_SERVE_TRACE: the engine process's loop (run here on a thread, fed through a real pipe)
    writes one line per step: every submitted request counted once as added, the outputs of the
    steps adding up to every request's tokens plus its final report, each line's times in order."""
    import csv
    import multiprocessing

    from text_generator import SamplingParams, TextGenerator
    from text_generator.engine import LLMEngine
    from text_generator.serve.engine_worker import EngineWorker, _lead
    from text_generator.serve.profiling import StepTrace

    path = tmp_path / "steps.csv"
    monkeypatch.setenv("TG_SERVE_TRACE", str(path))
    engine = LLMEngine(TextGenerator.from_pretrained(ckpt[0], device="cpu"), num_blocks=128, block_size=4,
                       freeze_gc=False)
    sent = []
    recv, send = multiprocessing.Pipe(duplex=False)
    n_new = [3, 5, 2]
    for i, (p, n) in enumerate(zip(PROMPTS, n_new)):
        send.send(("add", [(f"r{i}", oracle["tok"](p).input_ids,
                            SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True))], None))
    loop = threading.Thread(target=_lead, args=(EngineWorker(engine, sent.append), recv, None))
    loop.start()
    deadline = time.monotonic() + 60
    while sum(len(msg[1][4]) for msg in list(sent)) < len(PROMPTS):  # until every request has ended
        assert time.monotonic() < deadline
        time.sleep(0.01)
    send.send(("stop",))
    loop.join(30)
    with open(path) as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(StepTrace.FIELDS)
    assert sum(int(r["added"]) for r in rows) == len(PROMPTS)
    assert len(rows) == sum(1 for kind, *_ in sent if kind == "out")  # a line per step, a message per step
    assert sum(int(r["outputs"]) for r in rows) == sum(n_new)  # one output per token (the last one is final)
    for r in rows:
        t = [float(r[k]) for k in ("t_loop", "t_step", "t_stepped", "t_sent")]
        assert t == sorted(t)


def test_the_http_trace_times_each_request_from_its_handler_to_its_last_write(ckpt, one_thread, tmp_path, monkeypatch):
    """TG_SERVE_TRACE on a whole server: the HTTP process writes a line per request when it ends, under
    the id its client saw in the chunks, with its times in the order they happen (handler, submission,
    final output read from the pipe, taken by its stream, last chunk written, [DONE] written), and a line
    per out-pipe message that names an engine step of the engine process's own trace, read after that
    step ended."""
    import csv

    from text_generator.serve.profiling import OutTrace, RequestTrace

    path = tmp_path / "steps.csv"
    monkeypatch.setenv("TG_SERVE_TRACE", str(path))
    s = Server([ckpt[0], "--device", "cpu", "--served-model-name", "tiny", "--max-model-len", "64",
                "--block-size", "4", "--max-num-seqs", "4"])
    try:
        client = s.client()
        stream = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=5, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        ids = {chunk.id for chunk in stream}
        plain = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=3, temperature=0)
        s.wait_idle()
    finally:
        s.close()
    with open(f"{path}.http") as f:
        reqs = list(csv.DictReader(f))
    assert list(reqs[0]) == list(RequestTrace.FIELDS)
    assert [r["id"] for r in reqs] == [*ids, plain.id] and len(ids) == 1
    for r in reqs:
        t = [float(r[k]) for k in ("t_handler", "t_submit", "t_final", "t_taken", "t_written", "t_done")]
        assert t == sorted(t) and int(r["engine_requests"]) == 1
    with open(path) as f:
        stepped = {int(r["steps"]): float(r["t_stepped"]) for r in csv.DictReader(f)}
    with open(f"{path}.out") as f:
        outs = list(csv.DictReader(f))
    assert list(outs[0]) == list(OutTrace.FIELDS)
    assert sorted(int(o["steps"]) for o in outs) == sorted(stepped)  # a message per step, every step
    assert sum(int(o["outputs"]) for o in outs) == 5 + 3  # one output per token (the last one is final)
    for o in outs:
        assert float(o["t_read"]) >= stepped[int(o["steps"])]
