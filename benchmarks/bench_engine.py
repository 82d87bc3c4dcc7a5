"""LLMEngine against transformers' generate on the same offline load, in one run.

    python benchmarks/bench_engine.py                      # GPU: Llama-3-8B shape, bf16, random weights
    python benchmarks/bench_engine.py --device cpu --tiny  # a smoke run anywhere

Load: --num-prompts random prompts of --input-len tokens, all arriving at t = 0, each generating
exactly --output-len tokens greedily (EOS ignored). The engine runs them with continuous
batching over the paged cache; transformers runs them in batches of --hf-batch-size with a
static cache (its fastest plain path), one batch after another. For both: output tokens/s,
time to first token (from t = 0) and inter-token latency, p50 / p99. Writes
benchmarks/results/engine.json and engine.png (engine_tiny.* with --tiny).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import LLAMA3_8B, make_random_checkpoint, percentile, pyplot  # noqa: E402

TINY = dict(LLAMA3_8B, vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, bos_token_id=1,
            eos_token_id=2)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="a tiny model and load (smoke test)")
    p.add_argument("--num-prompts", type=int, default=None, help="default 512 (tiny: 8)")
    p.add_argument("--input-len", type=int, default=None, help="default 512 (tiny: 32)")
    p.add_argument("--output-len", type=int, default=None, help="default 256 (tiny: 16)")
    p.add_argument("--hf-batch-size", type=int, default=None, help="default 32 (tiny: 4)")
    p.add_argument("--hf-cache", default="static", choices=["static", "dynamic"])
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--memory-fraction", type=float, default=0.85, help="of free GPU memory for the KV cache")
    p.add_argument("--checkpoint", default=None, help="folder for the random checkpoint (made once, reused)")
    p.add_argument("--out", default=None, help="output stem (default benchmarks/results/engine[_tiny])")
    a = p.parse_args()
    big = dict(num_prompts=512, input_len=512, output_len=256, hf_batch_size=32)
    small = dict(num_prompts=8, input_len=32, output_len=16, hf_batch_size=4)
    for k, v in (small if a.tiny else big).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    name = "engine_tiny" if a.tiny else "engine"
    a.out = a.out or os.path.join(ROOT, "benchmarks", "results", name)
    a.checkpoint = a.checkpoint or os.path.join(tempfile.gettempdir(), "tg-bench-" + ("tiny" if a.tiny else "llama3-8b"))
    return a


def stats(ttft: list[float], itl: list[float], n_tokens: int, elapsed: float, n_req: int) -> dict:
    return {
        "elapsed_s": elapsed, "output_tokens": n_tokens, "requests_per_s": n_req / elapsed,
        "output_tokens_per_s": n_tokens / elapsed,
        "ttft_p50_ms": 1e3 * percentile(ttft, 50), "ttft_p99_ms": 1e3 * percentile(ttft, 99),
        "itl_p50_ms": 1e3 * percentile(itl, 50), "itl_p99_ms": 1e3 * percentile(itl, 99),
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_engine(args, path: str, prompts: list[list[int]], dtype: torch.dtype) -> dict:
    from kv_manager import profile_num_blocks
    from text_generator import TextGenerator
    from text_generator.engine import LLMEngine
    from text_generator.sampling import SamplingParams
    from text_generator.serve.warmup import warm_up

    device = torch.device(args.device)
    gen = TextGenerator.from_pretrained(path, device=device, dtype=dtype)
    max_len = args.input_len + args.output_len
    if device.type == "cuda":
        num_blocks = profile_num_blocks(gen.kv_cache_spec, args.block_size, device=device,
                                        memory_fraction=args.memory_fraction, max_seq_len=max_len)
    else:
        num_blocks = -(-max_len // args.block_size) * min(args.num_prompts, args.max_num_seqs) + 1
    engine = LLMEngine(gen, num_blocks=num_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens, max_seq_len=max_len)
    params = SamplingParams(temperature=0.0, max_new_tokens=args.output_len, ignore_eos=True)
    # warm-up: the server's start-up pass (every decode-graph bucket and mixed-step graph captured, every
    # kernel compiled), then nothing of it remains (prefix cache reset); a short warm-up left the timed run
    # capturing a bucket each time its batch shrank (the session-32 "cold start")
    warm_up(engine)
    sync(device)
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params, use_tqdm=False)
    sync(device)
    elapsed = time.perf_counter() - t0
    assert all(o.finish_reason == "length" for o in outs), [o.error for o in outs if o.error][:1]
    res = stats([o.metrics.first_token_time - t0 for o in outs], [x for o in outs for x in o.metrics.itls],
                sum(len(o.token_ids) for o in outs), elapsed, len(outs))
    res.update(num_blocks=num_blocks, num_steps=engine.num_steps - 1, num_preemptions=engine.num_preemptions,
               first_output=outs[0].token_ids[:8])
    del engine, gen
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


class TokenClock:
    """A transformers streamer that timestamps every generated step (the first put is the prompt)."""

    def __init__(self, device: torch.device):
        self.device, self.times, self._prompt_seen = device, [], False

    def put(self, value):
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        sync(self.device)
        self.times.append(time.perf_counter())

    def end(self):
        pass


def run_hf(args, path: str, prompts: list[list[int]], dtype: torch.dtype) -> dict:
    import transformers

    device = torch.device(args.device)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    kw = dict(max_new_tokens=args.output_len, min_new_tokens=args.output_len, do_sample=False, pad_token_id=0)
    if args.hf_cache == "static":
        kw["cache_implementation"] = "static"
    B = args.hf_batch_size
    batches = [prompts[i:i + B] for i in range(0, len(prompts), B)]

    def generate(batch, streamer=None):
        ids = torch.tensor(batch, device=device)
        with torch.inference_mode():
            return model.generate(ids, attention_mask=torch.ones_like(ids), streamer=streamer, **kw)

    generate(batches[0])  # warm-up at the measured shape (static cache: compiles once here)
    sync(device)
    ttft, itl = [], []
    n_tokens = 0
    t0 = time.perf_counter()
    first_out = None
    for batch in batches:
        clock = TokenClock(device)
        out = generate(batch, clock)
        first_out = first_out or out[0, args.input_len:args.input_len + 8].tolist()
        n_tokens += len(batch) * (out.shape[1] - args.input_len)
        ttft += [clock.times[0] - t0] * len(batch)
        itl += [b - a for a, b in zip(clock.times, clock.times[1:])] * len(batch)
    elapsed = time.perf_counter() - t0
    res = stats(ttft, itl, n_tokens, elapsed, len(prompts))
    res.update(batch_size=B, cache=args.hf_cache, first_output=first_out)
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return res


def plot(results: dict, path: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    names = [n for n in ("engine", "transformers") if n in results]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    colors = {"engine": "tab:blue", "transformers": "tab:orange"}
    axes[0].bar(names, [results[n]["output_tokens_per_s"] for n in names], color=[colors[n] for n in names])
    axes[0].set_title("output tokens/s (higher is better)")
    for ax, metric in ((axes[1], "ttft"), (axes[2], "itl")):
        width = 0.35
        for j, n in enumerate(names):
            vals = [results[n][f"{metric}_p50_ms"], results[n][f"{metric}_p99_ms"]]
            ax.bar([x + j * width for x in (0, 1)], vals, width, label=n, color=colors[n])
        ax.set_xticks([width / 2, 1 + width / 2], ["p50", "p99"])
        ax.set_title(f"{metric.upper()} ms (lower is better)")
        ax.legend()
    load = results["load"]
    fig.suptitle(f"{load['model']}, {load['num_prompts']} prompts x {load['input_len']} in / "
                 f"{load['output_len']} out, {load['device_name']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cfg = TINY if args.tiny else LLAMA3_8B
    t = time.perf_counter()
    path = make_random_checkpoint(args.checkpoint, cfg, dtype, device=device)
    print(f"checkpoint {path} ready in {time.perf_counter() - t:.1f} s")
    rng = random.Random(0)
    prompts = [[rng.randrange(cfg["vocab_size"]) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    results = {"load": dict(
        model="Llama-3-8B shape (random)" if not args.tiny else "tiny Llama (random)", num_prompts=args.num_prompts,
        input_len=args.input_len, output_len=args.output_len, dtype=str(dtype).replace("torch.", ""),
        device=str(device), device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        torch=torch.__version__)}
    results["engine"] = run_engine(args, path, prompts, dtype)
    if not args.skip_hf:
        import transformers

        results["load"]["transformers"] = transformers.__version__
        results["transformers"] = run_hf(args, path, prompts, dtype)
    print(f"{'':14s} {'tok/s':>10s} {'req/s':>8s} {'TTFT p50':>10s} {'TTFT p99':>10s} {'ITL p50':>9s} {'ITL p99':>9s}")
    for n in ("engine", "transformers"):
        if n in results:
            r = results[n]
            print(f"{n:14s} {r['output_tokens_per_s']:10.1f} {r['requests_per_s']:8.2f} {r['ttft_p50_ms']:9.1f}ms "
                  f"{r['ttft_p99_ms']:9.1f}ms {r['itl_p50_ms']:7.2f}ms {r['itl_p99_ms']:7.2f}ms")
    if "transformers" in results:
        same = results["engine"]["first_output"] == results["transformers"]["first_output"]
        results["first_output_match"] = same
        print(f"first request's first 8 greedy tokens equal in both: {same} (bf16 may differ)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=2)
    plot(results, args.out + ".png")
    print(f"wrote {args.out}.json and .png")


if __name__ == "__main__":
    main()
