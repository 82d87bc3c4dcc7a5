"""For the server tests: a tiny chat checkpoint (a BPE tokenizer trained here with `tokenizers`:
special tokens, a BOS post-processor, a chat template in tokenizer_config.json; a random llama
whose vocabulary is the tokenizer's; a peft LoRA adapter over it), transformers' greedy and
logprobs as the oracle, and `Server`: uvicorn in a thread over its engine process. Nothing is
downloaded."""

from __future__ import annotations

import socket
import threading
import time

import torch

from conftest import hf_generate, hf_model, make_checkpoint

SPECIALS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]  # ids 0..5: bos 1, eos 2
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
CORPUS = [
    "the quick brown fox jumps over the lazy dog", "a server streams tokens to many clients at once",
    "paged attention keeps every block of the cache in a table", "hello world, how are you today?",
    "one two three four five six seven eight nine ten", "json objects have keys and values: {\"a\": 1}",
] * 4


def make_tokenizer(chat_template: str | None = CHAT_TEMPLATE):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    # GPT-2 style byte-level BPE; its alphabet is only the (ASCII) bytes of the corpus, so every
    # token decodes to whole characters
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=160, special_tokens=SPECIALS))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   chat_template=chat_template)


def make_chat_checkpoint(path, chat_template: str | None = CHAT_TEMPLATE) -> str:
    tok = make_tokenizer(chat_template)
    make_checkpoint(path, "llama", vocab_size=len(tok), bos_token_id=1, eos_token_id=2)
    tok.save_pretrained(str(path))
    return str(path)


def make_lora(base: str, out_dir, seed: int = 1) -> str:
    """A peft LoRA (rank 4 on q / v / down) with random nonzero B, saved to out_dir."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(hf_model(base), LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                      target_modules=["q_proj", "v_proj", "down_proj"]))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    model.save_pretrained(str(out_dir))
    return str(out_dir)


def greedy(model, ids: list[int], n: int, eos: int = 2) -> list[int]:
    """transformers' greedy generate: the new tokens (ending at EOS if it came)."""
    return hf_generate(model, ids, n, eos)


def logprobs_of(model, ids: list[int], new: list[int]) -> tuple[list[float], list[torch.Tensor]]:
    """log_softmax of transformers' logits: each new token's logprob and each position's full row."""
    with torch.no_grad():
        logits = model(torch.tensor([ids + new])).logits[0, len(ids) - 1:len(ids) + len(new) - 1].float()
    rows = torch.log_softmax(logits, dim=-1)
    return [float(rows[i, t]) for i, t in enumerate(new)], list(rows)


def fail_first_forward(engine) -> None:
    """An engine process's on_start: its model's first forward_tensor raises (a device fault in
    the server's dependency), the later ones run."""
    forward = engine.generator.forward_tensor
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected device fault")
        return forward(*args, **kwargs)

    engine.generator.forward_tensor = failing_once


def slow_forward(engine) -> None:
    """An engine process's on_start: every forward_tensor takes 5 ms longer, so that a long
    request is still running seconds after it started (the disconnect tests hang up mid-way)."""
    forward = engine.generator.forward_tensor

    def slow(*args, **kwargs):
        time.sleep(0.005)
        return forward(*args, **kwargs)

    engine.generator.forward_tensor = slow


def unread_bytes(fd: int) -> int:
    """Bytes written into a pipe and not read yet (Linux FIONREAD)."""
    import array
    import fcntl
    import termios

    n = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, n, True)
    return n[0]


class Server:
    """uvicorn in a thread, on a socket bound to a free port; the engine in its own process.
    on_start(engine): a module-level function the engine process runs once its engine is built."""

    def __init__(self, argv: list[str], on_start=None):
        import uvicorn

        from text_generator.cli import build_parser
        from text_generator.serve import build_app, build_state

        self.state = build_state(build_parser().parse_args(["serve", *argv]), on_start=on_start)
        self.engine = self.state.engine  # the EngineClient
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(build_app(self.state), log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)

    def client(self, **kw):
        import httpx
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0,
                             http_client=httpx.Client(trust_env=False, timeout=60), **kw)

    def stats(self) -> dict:
        """What the engine process reports of itself: engine_worker.Stats' fields and requests
        ({live request id: its output tokens so far})."""
        return self.engine.call_sync("stats")

    def wait_idle(self, timeout: float = 30.0) -> dict:
        """Until the engine holds no request and no KV block (every block free or only cached)
        and every request's final output reached the HTTP side -> the engine's stats then."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.stats()
            if not st["requests"] and not st["used_blocks"] and not self.engine.num_live:
                return st
            assert time.monotonic() < deadline, f"{len(st['requests'])} requests and {st['used_blocks']} blocks held"
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()
