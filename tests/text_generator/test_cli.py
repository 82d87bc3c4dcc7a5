"""The CLI (`python -m text_generator generate / bench`), the demo checkpoint and the tokenizers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from text_generator.demo import DEMO_CONFIG, ensure_demo_checkpoint, is_complete
from text_generator.tokenizer import ByteTokenizer, decode_tokens, load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repository


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
    (["generate", "x", "--chat"], "chat template"),  # the demo's byte tokenizer has none
    (["generate", "x", "--chat", "--token-ids"], "--chat and --token-ids"),
    (["generate", "x", "--json", "--stream"], "--stream and --json"),
    (["generate", "x", "--stop", ""], "--stop"),
    (["generate", "x", "--max-model-len", "100000"], "--max-model-len"),
    (["generate", "hello world", "--max-model-len", "8"], "argument 1: expected at most 7 tokens"),
    (["generate", "--file", "/nonexistent/prompts.txt"], "/nonexistent/prompts.txt"),
    (["generate", "--file", "/dev/null"], "at least one non-empty line"),
    (["bench", "--input-len", "2000", "--output-len", "100"], "--input-len + --output-len"),
])
def test_bad_arguments_are_reported_cleanly(run_main, args, fragment):
    code, out, err = run_main(args)
    assert code == 2 and fragment in err and "Traceback" not in err, err


def test_generate_refuses_an_adapter_that_no_lora_names(run_main):
    code, out, err = run_main(["generate", "x", "y", "--adapter", "nope", "--max-new-tokens", "2"])
    assert code == 2 and "--adapter" in err and "'nope'" in err and out == ""


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


# command-line errors: one line on stderr, exit code 2, no traceback ------------------------------


def _one_clean_line(r: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln and not ln.startswith("note:")]
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(lines) == 1, r.stderr
    return lines[0]


@pytest.mark.parametrize("args,fragment", [
    (["generate", "x", "--block-size", "0"], "--block-size: expected an int >= 1, got 0"),
    (["generate", "x", "--num-blocks", "0"], "--num-blocks: expected an int >= 1, got 0"),
    (["generate", "x", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["generate", "x", "--logprobs", "-1"], "--logprobs"),
    (["generate", "x", "--device", "tpu"], "--device"),
    (["generate", "x", "--dtype", "int8"], "--dtype"),
    (["bench", "--num-prompts", "0"], "--num-prompts"),
])
def test_bad_flags_cost_one_line_and_exit_code_2(capsys, args, fragment):
    from text_generator.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and fragment in err, err


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_on_a_cpu_only_machine_is_one_clear_line(cache):
    line = _one_clean_line(cli(["generate", "x", "--device", "cuda"], cache))
    assert "--device" in line and "no CUDA" in line and "--device cpu" in line


def test_pickle_only_checkpoint_gets_a_conversion_hint(run_main, checkpoint_dir, tmp_path, capsys):
    import shutil

    import torch
    from safetensors.torch import load_file

    old = str(tmp_path / "old")
    shutil.copytree(checkpoint_dir("llama"), old)
    torch.save(load_file(os.path.join(old, "model.safetensors")), os.path.join(old, "pytorch_model.bin"))
    os.remove(os.path.join(old, "model.safetensors"))
    capsys.readouterr()  # making the checkpoint printed progress
    code, out, err = run_main(["generate", "1,2", "--token-ids", "--model", old])
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "pytorch_model" in err and "safe_serialization=True" in err


def test_an_endless_file_is_refused_not_read_into_memory(run_main, tmp_path):
    import threading

    code, out, err = run_main(["generate", "--file", "/dev/zero"])  # one endless line
    assert code == 2 and "line 1 of /dev/zero" in err and "longer than" in err, err
    fifo = str(tmp_path / "endless")
    os.mkfifo(fifo)

    def write_forever():  # endless lines, until the reader goes away
        try:
            with open(fifo, "w") as f:
                while True:
                    f.write("hello\n")
        except OSError:
            pass

    threading.Thread(target=write_forever, daemon=True).start()
    code, out, err = run_main(["generate", "--file", fifo, "--max-prompts", "5"])
    assert code == 2 and "--max-prompts: expected at most 5 prompts" in err, err


def test_a_file_line_over_max_model_len_is_named(run_main, tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("short\n\n" + "x" * 40 + "\n")
    code, out, err = run_main(["generate", "--file", str(f), "--max-model-len", "32"])
    assert code == 2 and f"line 3 of {f}" in err and "expected at most 31 tokens" in err and out == ""


# output: JSON lines, streaming, stop strings, logprobs, chat --------------------------------------


@pytest.fixture(scope="module")
def demo_reference(cache):
    """prompt text -> (transformers' greedy token ids, per-step log-softmax) on the demo checkpoint."""
    import torch
    import transformers

    path = ensure_demo_checkpoint(os.path.join(cache, "demo-llama"))
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = ByteTokenizer()

    def run(prompt: str, n: int):
        ids = tok.encode(prompt)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                 eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        toks = out.sequences[0, len(ids):].tolist()
        return toks, [torch.log_softmax(x[0].float(), -1) for x in out.logits]

    return run


def _json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_json_lines_carry_text_tokens_and_logprobs(run_main, demo_reference):
    code, out, err = run_main(["generate", "hello", "wörld", "--json", "--temperature", "0", "--max-new-tokens", "6",
                               "--logprobs", "2", "--ignore-eos"])
    assert code == 0, err
    recs = _json_lines(out)
    assert [r["index"] for r in recs] == [0, 1] and [r["prompt"] for r in recs] == ["hello", "wörld"]
    for r in recs:
        ref, logps = demo_reference(r["prompt"], 6)
        assert r["token_ids"] == ref and r["finish_reason"] == "length"
        assert r["prompt_token_ids"] == ByteTokenizer().encode(r["prompt"])
        assert r["text"] == ByteTokenizer().decode(ref)
        for tok, lp, top, ref_lp in zip(r["token_ids"], r["logprobs"], r["top_logprobs"], logps):
            assert lp == pytest.approx(ref_lp[tok].item(), abs=1e-4)
            best = ref_lp.topk(2)
            assert sorted(map(int, top)) == sorted(best.indices.tolist())


def test_stop_strings_cut_the_printed_text(run_main, demo_reference):
    ref, _ = demo_reference("hello", 12)
    full = ByteTokenizer().decode(ref)
    # the first stretch after the first character without a replacement character (the demo's text is noise)
    stop = next(c for n in (2, 1) for i in range(1, len(full) - n + 1) if "\ufffd" not in (c := full[i:i + n]))
    code, out, err = run_main(["generate", "hello", "--json", "--temperature", "0", "--max-new-tokens", "12",
                               "--ignore-eos", "--stop", stop, "--stop", "never-there"])
    assert code == 0, err
    (r,) = _json_lines(out)
    assert r["finish_reason"] == "stop" and r["text"] == full[:full.index(stop)]


def test_streaming_prints_the_same_page_as_not_streaming(run_main):
    args = ["generate", "one", "two", "three", "--temperature", "0", "--max-new-tokens", "3", "--max-num-seqs", "2"]
    code, streamed, err = run_main(args + ["--stream"])
    assert code == 0, err
    code, whole, err = run_main(args + ["--no-stream"])
    assert code == 0 and streamed == whole and whole.count("=== [") == 3


def test_chat_renders_the_tokenizers_template(run_main, bpe_checkpoint, bpe_tokenizer, tmp_path):
    import shutil

    path = str(tmp_path / "chat")
    shutil.copytree(bpe_checkpoint, path)
    tok = load_tokenizer(path)
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    tok.save_pretrained(path)
    code, out, err = run_main(["generate", "Grüße", "--chat", "--json", "--model", path, "--max-new-tokens", "2"])
    assert code == 0, err
    (r,) = _json_lines(out)
    assert r["prompt_token_ids"] == bpe_tokenizer.encode("<user>Grüße<assistant>")


# help, logging and progress ---------------------------------------------------------------------


def test_help_shows_every_default(capsys):
    from text_generator.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for fragment in ("--block-size BLOCK_SIZE tokens per KV block (default: 16)", "(default: 64)",
                     "(default: WARNING)", "(default: 10000)", "(default: None)"):
        assert fragment in text, fragment


def test_a_normal_run_prints_no_info_line_and_log_level_shows_them(run_main):
    code, out, err = run_main(["generate", "x", "--max-new-tokens", "2"])
    assert code == 0 and "INFO" not in err and "loaded" not in err
    for argv in (["--log-level", "INFO", "generate", "x", "--max-new-tokens", "2"],  # global, before the command
                 ["generate", "x", "--max-new-tokens", "2", "--log-level", "INFO"]):  # or after it
        code, out, err = run_main(argv)
        assert code == 0 and "| INFO" in err and "loaded LlamaForCausalLM" in err


def test_bench_shows_progress_on_stderr_unless_told_not_to(run_main):
    code, out, err = run_main(["bench", "--num-prompts", "2", "--input-len", "4", "--output-len", "2"])
    assert code == 0 and "generate" in err and "2/2" in err and "req/s" in out
    code, out, err = run_main(["bench", "--num-prompts", "2", "--input-len", "4", "--output-len", "2", "--no-progress"])
    assert code == 0 and "2/2" not in err
