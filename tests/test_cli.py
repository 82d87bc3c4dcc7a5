"""The CLI (`python -m text_generator generate / bench`), the demo checkpoint and the tokenizers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from text_generator.demo import DEMO_CONFIG, ensure_demo_checkpoint, is_complete
from text_generator.tokenizer import ByteTokenizer, decode_tokens, load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tg_cache"))


def cli(args: list[str], cache: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, TEXT_GENERATOR_CACHE=cache, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "text_generator", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


# tokenizers -------------------------------------------------------------------------------------


def test_byte_tokenizer_round_trips_utf8_and_drops_specials():
    tok = ByteTokenizer()
    text = "héllo, wörld ✓"
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id and all(0 <= i < 256 for i in ids[1:])
    assert tok.decode(ids + [tok.eos_token_id, 300]) == text
    assert tok.decode([0xE2, 0x9C]) == "\ufffd"  # incomplete UTF-8 is replaced, never raises
    assert tok.encode("a", add_special_tokens=False) == [97]


def test_load_tokenizer_reads_byte_and_hf_folders_and_none_otherwise(tmp_path):
    (tmp_path / "none").mkdir()
    assert load_tokenizer(str(tmp_path / "none")) is None
    (tmp_path / "byte").mkdir()
    ByteTokenizer().save_pretrained(str(tmp_path / "byte"))
    assert isinstance(load_tokenizer(str(tmp_path / "byte")), ByteTokenizer)

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[UNK]": 0, "</s>": 1, "hello": 2, "world": 3}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", eos_token="</s>").save_pretrained(
        str(tmp_path / "hf"))
    tok = load_tokenizer(str(tmp_path / "hf"))
    assert tok.encode("hello world", add_special_tokens=False) == [2, 3]
    assert tok.eos_token_id == 1
    assert decode_tokens(tok, [2, 3, 1]) == "hello world"


def test_decode_tokens_accepts_a_minimal_tokenizer():
    class Minimal:
        def decode(self, ids):
            return "".join(map(str, ids))

    assert decode_tokens(Minimal(), [1, 2]) == "12"


# demo checkpoint --------------------------------------------------------------------------------


def test_demo_checkpoint_is_made_once_and_loads(cache):
    path = ensure_demo_checkpoint(os.path.join(cache, "direct"))
    assert is_complete(path)
    stamp = os.path.getmtime(os.path.join(path, "model.safetensors"))
    assert ensure_demo_checkpoint(path) == path
    assert os.path.getmtime(os.path.join(path, "model.safetensors")) == stamp
    cfg = json.load(open(os.path.join(path, "config.json")))
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["vocab_size"] == DEMO_CONFIG["vocab_size"]
    assert isinstance(load_tokenizer(path), ByteTokenizer)
    assert not any(n.startswith(".demo-") for n in os.listdir(os.path.dirname(path)))  # no temp leftovers


def test_demo_dir_follows_the_cache_variable(monkeypatch, tmp_path):
    from text_generator.demo import default_demo_dir

    monkeypatch.setenv("TEXT_GENERATOR_CACHE", str(tmp_path))
    assert default_demo_dir() == os.path.join(str(tmp_path), "demo-llama")


# the CLI ----------------------------------------------------------------------------------------


def test_generate_with_the_demo_checkpoint(cache):
    r = cli(["generate", "hello", "two words", "--max-new-tokens", "6", "--seed", "1", "--device", "cpu"], cache)
    assert r.returncode == 0, r.stderr
    assert "RANDOM" in r.stderr and "demo" in r.stderr
    assert r.stdout.count("=== [") == 2 and "'hello'" in r.stdout
    assert "6 tokens, finish_reason=length" in r.stdout
    assert os.path.isdir(os.path.join(cache, "demo-llama"))


@pytest.fixture
def run_main(cache, monkeypatch, capsys):
    """main() in this process (no interpreter start-up): -> (exit code, stdout, stderr)."""
    from text_generator.cli import main

    monkeypatch.setenv("TEXT_GENERATOR_CACHE", cache)

    def run(args: list[str]):
        code = main(args + ["--device", "cpu"])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def test_generate_greedy_from_a_file_and_token_ids(run_main, tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("first prompt\n\nsecond\n")
    code, out, err = run_main(["generate", "--file", str(f), "--temperature", "0", "--max-new-tokens", "3"])
    assert code == 0, err
    assert "'first prompt'" in out and "'second'" in out and out.count("=== [") == 2
    code, spec_out, err = run_main(["generate", "--file", str(f), "--temperature", "0", "--max-new-tokens", "3",
                                    "--speculative"])
    assert code == 0 and spec_out == out, err  # speculative greedy decoding: the same text
    code, out, err = run_main(["generate", "72,105", "--token-ids", "--temperature", "0", "--max-new-tokens", "3"])
    assert code == 0 and "[72, 105]" in out, err


@pytest.mark.parametrize("args,fragment", [
    (["generate"], "give prompts"),
    (["generate", "x", "--lora", "nameonly"], "NAME=PATH"),
    (["generate", "x", "--top-p", "0"], "SamplingParams.top_p"),
    (["generate", "x", "--model", "/nonexistent/folder"], "/nonexistent/folder"),
    (["bench", "--num-prompts", "0"], "--num-prompts"),
])
def test_bad_arguments_are_reported_cleanly(run_main, args, fragment):
    code, out, err = run_main(args)
    assert code == 2 and fragment in err and "Traceback" not in err, err


def test_generate_reports_an_unknown_adapter_per_prompt(run_main):
    code, out, err = run_main(["generate", "x", "y", "--adapter", "nope", "--max-new-tokens", "2"])
    assert code == 1 and out.count("error:") == 2 and "'nope'" in out


def test_bench_reports_throughput_and_latency(cache, tmp_path):
    out = tmp_path / "bench.json"
    r = cli(["bench", "--num-prompts", "4", "--input-len", "12", "--output-len", "5", "--device", "cpu",
             "--json", str(out)], cache)
    assert r.returncode == 0, r.stderr
    assert "req/s" in r.stdout and "TTFT" in r.stdout and "ITL" in r.stdout
    res = json.loads(out.read_text())
    assert res["num_requests"] == 4 and res["output_tokens"] == 20
    for k in ("requests_per_s", "output_tokens_per_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"):
        assert res[k] > 0, k
