"""Speculative decoding: tokens per target forward and wall-clock speedup over plain decoding.

Batch 1, greedy, a Llama-3-8B-shaped model with random bf16 weights (written once by
benchmarks.common.make_random_checkpoint to a temp folder, loaded with
TextGenerator.from_pretrained), through SpeculativeDecoder at its defaults (adaptive draft
lengths, as the engine: a request whose drafts keep failing stops drafting and probes now and then).
Methods: plain decoding (one token per forward), n-gram prompt lookup as a chain and as a tree,
a small draft model (2 layers, same vocabulary) proposing a greedy chain, and an EAGLE-3 head
(random weights in the public layout: fc over 3 target states, one decoder layer, a 32k draft
vocabulary) proposing a greedy chain (k4) or a tree of 3 chains of 3 (tree 3x3). A random
head's acceptance is meaningless (near zero): its rows measure what EAGLE-3 drafting costs, and
the separate "eagle3 step cost" line gives one draft step (per request, batch 1) against one
target decode step.

Scenarios, and why there is an "echo" model:
  random / random-model   random prompt. A random model's greedy output has no reason to repeat
                          its prompt; whatever n-gram hits it gets come from its own loops.
  copy / random-model     a prompt made of one random 64-token segment repeated. Same model, so
                          same caveat: reported honestly, whatever the acceptance is.
  copy / echo-model       a random model cannot copy, so copy-heavy acceptance is measured on a
                          model that provably continues its prompt: the residual branches are
                          switched off (o_proj = down_proj = 0, so every layer still runs its full
                          attention and MLP FLOPs but the hidden state stays the token's
                          embedding) and lm_head rows are the embedding rows permuted so that the
                          argmax after token x is f(x), f a fixed cyclic permutation of C =
                          prompt_len / 2 tokens. The prompt is two turns of that cycle, so the
                          output repeats the prompt exactly: the upper bound a copy-heavy workload
                          (code edits, RAG quoting) approaches. Its draft model is echo-modified
                          with the same f, hence a perfect drafter.
The cost per forward is the real 8B cost in every scenario; only acceptance differs.

Engine rows (LLMEngine, greedy, EOS ignored, prefix caching off, async scheduling at its
default: on for CUDA): the engine with the n-gram drafter (chain, depth 4; "adaptive": the
default adaptive draft length, which stops drafting for requests whose drafts keep failing;
"fixed": adaptive_speculation=False, every step drafts) against the engine without one, at
batch 8 and 32 (all requests at t = 0), on the random model with random prompts (little to
accept: what drafting costs) and on the echo model with rotated copies of its cycle (everything
accepted: the upper bound); then continuous arrivals (Poisson, --arrival-rate requests/s,
--arrivals requests) on the echo model with and without the drafter. tokens/s is the median of
--repeats runs after a short warm-up. Each reports
output tokens/s, TPOT (per request, (last - first token time) / (tokens - 1), median) and ITL
p50 / p99 over the gaps between a request's token deliveries (a speculative step delivers its
accepted run at once, so a gap is one engine step of that request), and the CUDA graphs the timed
run captured (the target's and an EAGLE-3 head's; 0 expected: a capture stalls its step). One
drafter serves a method's warm-up and timed runs, as a server keeps one.

    python benchmarks/bench_speculative.py                       # CUDA, the full-size model
    python benchmarks/bench_speculative.py --device cpu --tiny   # smoke test of the script itself
    python benchmarks/bench_speculative.py --engine-only --out X.json   # only the engine rows
    python benchmarks/bench_speculative.py --methods plain "eagle3 k4 random" --scenarios random
                                                                 # some batch-1 rows only

Prints a table; writes benchmarks/results/speculative.json and speculative.png (if matplotlib is
installed). tokens/forward counts decode forwards only (the prefill forward and its token are
left out); speedup is plain decoding's wall time over the method's, both for the whole
generate() call (prefill included, prefix caching off), median of --repeats runs after one
full-length warm-up. "same out" compares with plain decoding's tokens: speculation is exact in
exact arithmetic, but on a random bf16 model the top-2 logits are often closer than the
difference between the decode kernel and the tree (custom-mask) kernel, so a near-tie can flip;
the script prints that difference and the top-2 gap once (tree_vs_plain_numerics in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import LLAMA3_8B, make_random_checkpoint, pyplot  # noqa: E402
from benchmarks.common import percentile  # noqa: E402
from kv_manager import BlockManager  # noqa: E402
from text_generator import TextGenerator  # noqa: E402
from text_generator.engine import LLMEngine  # noqa: E402
from text_generator.sampling import SamplingParams  # noqa: E402
from text_generator.speculative import (  # noqa: E402
    DraftModelDrafter, DraftTree, Eagle3Drafter, NgramDrafter, SpeculativeDecoder, build_tree_batch,
)

DRAFT_8B = dict(LLAMA3_8B, hidden_size=1024, intermediate_size=3584, num_hidden_layers=2,
                num_attention_heads=8, num_key_value_heads=8)
TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=512, hidden_size=256,
            intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
            hidden_act="silu", initializer_range=0.02)
DRAFT_TINY = dict(TINY, hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2)  # head_dim 64 in both, a size every attention kernel has


def make_random_eagle3_head(path: str, target: dict, dtype: torch.dtype, *, draft_vocab: int, aux=None,
                            seed: int = 2) -> str:
    """A random EAGLE-3 head for `target` (a config dict) in the public layout (config.json +
    model.safetensors; see model_wrapper/eagle3_loader.py); its decoder layer has the target's shape."""
    from safetensors.torch import save_file

    H, I = target["hidden_size"], target["intermediate_size"]
    heads, kv_heads = target["num_attention_heads"], target["num_key_value_heads"]
    hd = H // heads
    cfg = dict(architectures=["LlamaForCausalLMEagle3"], model_type="llama", hidden_size=H, intermediate_size=I,
               num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=1,
               vocab_size=target["vocab_size"], draft_vocab_size=draft_vocab, target_hidden_size=H,
               rms_norm_eps=target["rms_norm_eps"], rope_theta=target["rope_theta"],
               max_position_embeddings=target["max_position_embeddings"], hidden_act="silu",
               tie_word_embeddings=False, torch_dtype=str(dtype).replace("torch.", ""))
    if aux is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = list(aux)
    cfg_path = os.path.join(path, "config.json")
    if os.path.isfile(cfg_path):
        with open(cfg_path) as f:
            if json.load(f) == cfg:
                return path
    g = torch.Generator().manual_seed(seed)
    a = "midlayer.self_attn."
    shapes = {"fc.weight": (H, 3 * H), a + "q_proj.weight": (heads * hd, 2 * H), a + "k_proj.weight": (kv_heads * hd, 2 * H),
              a + "v_proj.weight": (kv_heads * hd, 2 * H), a + "o_proj.weight": (H, heads * hd),
              "midlayer.mlp.gate_proj.weight": (I, H), "midlayer.mlp.up_proj.weight": (I, H),
              "midlayer.mlp.down_proj.weight": (H, I), "lm_head.weight": (draft_vocab, H)}
    t = {n: (torch.randn(s, generator=g) * 0.02).to(dtype) for n, s in shapes.items()}
    for n in ("midlayer.input_layernorm", "midlayer.hidden_norm", "midlayer.post_attention_layernorm", "norm"):
        t[n + ".weight"] = torch.ones(H, dtype=dtype)
    kept = torch.randperm(target["vocab_size"], generator=g)[:draft_vocab].sort().values
    t["d2t"] = kept - torch.arange(draft_vocab)
    t["t2d"] = torch.zeros(target["vocab_size"], dtype=torch.bool).index_fill_(0, kept, True)
    os.makedirs(path, exist_ok=True)
    save_file(t, os.path.join(path, "model.safetensors"))
    with open(cfg_path, "w") as f:  # last: its presence marks a complete folder
        json.dump(cfg, f, indent=1)
    return path


def eagle3_step_cost(gen, drafter: Eagle3Drafter, prompt, block_size, max_seq_len, sync, k=4, iters=20) -> dict:
    """Median ms of one target decode step (eager forward_tensor, batch 1, after the prompt) and of
    one EAGLE-3 draft step (a k-chain proposal / k, after an update of one accepted position)."""
    n, V = len(prompt), gen.vocab_size
    max_seq_len = n + iters * (k + 2) + 8  # this measurement's own limit (the drafter's must allow it)
    blocks = max_seq_len // block_size + 8
    bm, kv = BlockManager(blocks, block_size, enable_prefix_caching=False), gen.allocate_kv_cache(blocks, block_size)
    bm.admit("t", prompt)
    gen.forward_tensor(torch.tensor(prompt), torch.arange(n), True, kv, bm.block_tables(["t"]), bm.slots("t", 0, n),
                       torch.tensor([n], dtype=torch.int32), max_seq_len, torch.tensor([n - 1]))
    bm.commit("t", n)
    target_ms = []
    for i in range(iters):
        bm.append("t", [i % V])
        L = n + i + 1
        sync()
        t0 = time.perf_counter()
        gen.forward_tensor(torch.tensor([i % V]), torch.tensor([L - 1]), False, kv, bm.block_tables(["t"]),
                           bm.slots("t", L - 1, L), torch.tensor([L], dtype=torch.int32), max_seq_len)
        sync()
        target_ms.append(1e3 * (time.perf_counter() - t0))
        bm.commit("t", L)
    width = (len(drafter.hidden_layers), gen.config.hidden_size)
    states = torch.randn(n, *width, device=gen.device)
    drafter.start("d", prompt, hidden=states)
    drafter.update("d", [1])
    draft_ms = []
    for i in range(iters):
        sync()
        t0 = time.perf_counter()
        drafter.propose(["d"], [k + 1])
        sync()
        draft_ms.append(1e3 * (time.perf_counter() - t0) / k)
        drafter.update("d", [i % V], hidden=torch.randn(1, *width, device=gen.device))
    drafter.finish("d")
    t, d = statistics.median(target_ms[2:]), statistics.median(draft_ms[2:])
    return dict(target_decode_ms=t, eagle3_draft_step_ms=d, ratio=d / t, k=k)


def make_echo(gen: TextGenerator, perm: torch.Tensor) -> None:
    """In place: hidden state = the token's embedding in every layer; argmax after x is perm[x]."""
    model = gen.model_wrapper.model
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel(), device=perm.device)
        model.lm_head.weight.copy_(emb[inv.to(emb.device)])  # row y = e_{f^-1(y)}: best y = f(x)


def cyclic_perm(vocab: int, cycle: int, g: torch.Generator) -> tuple[torch.Tensor, list[int]]:
    """f: a single cycle over `cycle` random tokens, identity elsewhere; -> (f, the cycle order)."""
    members = torch.randperm(vocab, generator=g)[:cycle]
    perm = torch.arange(vocab)
    perm[members] = torch.roll(members, -1)
    return perm, members.tolist()


def tree_vs_plain(gen, prompt, block_size, max_seq_len) -> dict:
    """The root's logits from a plain decode step vs from a 4-node chain tree step (spec_mask)
    at the same state: how far kernel numerics alone move them, against the top-2 logit gap
    that decides greedy decoding. Explains 'same out' = False on a random model in bf16."""
    out = {}
    for mode in ("plain", "tree"):
        bm = BlockManager(64 + max_seq_len // block_size, block_size, enable_prefix_caching=False)
        kv = gen.allocate_kv_cache(64 + max_seq_len // block_size, block_size)
        n = len(prompt)
        bm.admit("x", prompt)
        logits = gen.forward_tensor(torch.tensor(prompt), torch.arange(n), True, kv, bm.block_tables(["x"]),
                                    bm.slots("x", 0, n), torch.tensor([n], dtype=torch.int32), max_seq_len,
                                    torch.tensor([n - 1]))
        root = int(logits[0].argmax())
        bm.commit("x", n)
        tree = DraftTree.chain([root, 1, 2, 3] if mode == "tree" else [root])
        bm.append("x", tree.tokens)
        b = build_tree_batch([tree], [n], [bm.slots("x", n, n + tree.size)], bm.block_tables(["x"]))
        kw = {"spec_mask": b.spec_mask} if b.spec_mask is not None else {}
        out[mode] = gen.forward_tensor(b.input_ids, b.position_ids, False, kv, b.block_tables, b.slots,
                                       b.input_lengths, max_seq_len, q_lens=b.q_lens, **kw)[0].float()
    top2 = torch.topk(out["plain"], 2).values
    return dict(max_abs_diff=float((out["plain"] - out["tree"]).abs().max()), top2_gap=float(top2[0] - top2[1]),
                logit_std=float(out["plain"].std()), same_argmax=bool(out["plain"].argmax() == out["tree"].argmax()))


def timed_generate(gen, kv, drafter_fn, prompt, new_tokens, max_seq_len, block_size, sync):
    bm = BlockManager(kv[0][0].shape[0], block_size, enable_prefix_caching=False)
    drafter = drafter_fn()
    dec = SpeculativeDecoder(gen, kv, bm, drafter, max_seq_len=max_seq_len)
    sync()
    t0 = time.perf_counter()
    out = dec.generate([prompt], new_tokens)[0]
    sync()
    return time.perf_counter() - t0, out, dec.stats


def engine_run(gen, prompts, new_tokens, drafter, *, block_size, max_seq_len, sync, arrival_times=None,
               adaptive=True) -> dict:
    """Serve greedy requests with an LLMEngine (drafter None: no speculation); arrival_times:
    seconds after the start at which prompt i arrives (None: all at once) -> the metrics."""
    B = len(prompts)
    n_seqs = B if arrival_times is None else min(B, 64)
    engine = LLMEngine(gen, num_blocks=n_seqs * (-(-max_seq_len // block_size) + 1) + 8, block_size=block_size,
                       max_num_seqs=n_seqs, max_num_batched_tokens=max(2048, 2 * len(prompts[0])),
                       max_seq_len=max_seq_len, enable_prefix_caching=False, speculative=drafter,
                       adaptive_speculation=adaptive)
    params = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, ignore_eos=True)
    times = arrival_times or [0.0] * B
    outs, nxt = [], 0
    graphs_before = num_graphs(gen, drafter)
    sync()
    t0 = time.perf_counter()
    while len(outs) < B:
        now = time.perf_counter() - t0
        while nxt < B and times[nxt] <= now:
            engine.add_request(prompts[nxt], params)
            nxt += 1
        if not engine.has_unfinished():
            time.sleep(max(0.0, times[nxt] - now))
            continue
        outs += [o for o in engine.step() if o.finished]
    sync()
    elapsed = time.perf_counter() - t0
    gaps, tpot = [], []
    for o in outs:
        t = sorted(set(o.metrics.token_times))
        gaps += [b - a for a, b in zip(t, t[1:])]
        tpot.append((o.metrics.token_times[-1] - o.metrics.token_times[0]) / max(1, len(o.token_ids) - 1))
    n_tok = sum(len(o.token_ids) for o in outs)
    return dict(tokens_per_s=n_tok / elapsed, seconds=elapsed, tpot_ms=1e3 * statistics.median(tpot),
                itl_p50_ms=1e3 * percentile(gaps, 50), itl_p99_ms=1e3 * percentile(gaps, 99),
                accepted_per_step=engine.num_accepted_tokens / max(1, engine.num_steps), steps=engine.num_steps,
                drafted=engine.num_draft_tokens, captures=num_graphs(gen, drafter) - graphs_before)


def num_graphs(gen, drafter=None) -> int:
    """CUDA graph captures so far by the target (decode, verify and mixed graphs) and an EAGLE-3
    drafter's head: more after a run = captured in it (each capture stalls its step: a timed run
    should capture none). Captures, not graphs held: graphs dropped (another KV cache address) and
    captured again leave the number held unchanged."""
    runners = [gen.model_wrapper.graphs, getattr(getattr(drafter, "runner", None), "graphs", None)]
    runners += [getattr(r, "mixed", None) for r in runners if r is not None]
    return sum(_captures(r) for r in runners if r is not None)


def capture_keys(gen, drafter=None) -> list:
    """Every capture counted so far (num_graphs), as (runner class, batch size, q, layers) for decode / verify
    graphs and (runner class, tokens, requests) for mixed-step graphs."""
    runners = [gen.model_wrapper.graphs, getattr(getattr(drafter, "runner", None), "graphs", None)]
    runners += [getattr(r, "mixed", None) for r in runners if r is not None]
    return [k for r in runners if r is not None for k in getattr(r, "bench_capture_keys", [])]


def _captures(runner) -> int:
    """Calls of runner._capture (counted from the first call here on); runner.bench_capture_keys lists
    each call's (runner class, size / tokens, q / requests) in order, to name what a timed run captured."""
    if not hasattr(runner, "bench_captures"):
        runner.bench_captures, runner.bench_capture_keys = 0, []
        capture = runner._capture

        def counted(*args, **kwargs):
            runner.bench_captures += 1
            if type(runner).__name__ == "MixedGraphRunner":
                key = (args[0], args[1])
            else:
                key = (args[0], args[3] if len(args) > 3 else kwargs.get("q", 1), args[4] if len(args) > 4 else None)
            runner.bench_capture_keys.append((type(runner).__name__, *key))
            return capture(*args, **kwargs)

        runner._capture = counted
    return runner.bench_captures


ENGINE_METHODS = (("engine plain", lambda: None, True),
                  ("engine ngram d4", lambda: NgramDrafter(max_ngram=3, depth=4), True),
                  ("ngram d4 fixed", lambda: NgramDrafter(max_ngram=3, depth=4), False))


def engine_rows(gen, scenario, prompts, new_tokens, batches, args, max_seq_len, sync, extra=(),
                extra_batches=()) -> list[dict]:
    """The engine without a drafter, with the n-gram drafter (adaptive) and with it drafting in
    every step (fixed), then at the batch sizes in extra_batches the `extra` methods ((name,
    drafter factory taking the batch size, adaptive)); prompts: a list long enough for the
    largest batch."""
    rows = []
    for B in batches:
        base = None
        methods = [(m, lambda b, f=f: f(), a) for m, f, a in ENGINE_METHODS]
        if B in extra_batches:
            methods += list(extra)
        for method, make, adaptive in methods:
            kw = dict(block_size=args.block_size, max_seq_len=max_seq_len, sync=sync, adaptive=adaptive)
            try:
                # one drafter for the warm-up and the timed runs, as a server keeps one: an EAGLE-3
                # head's CUDA graphs are captured in the warm-up (each run finishes its requests)
                drafter = make(B)
                engine_run(gen, prompts[:B], 8, drafter, **kw)  # warm-up
                runs = [engine_run(gen, prompts[:B], new_tokens, drafter, **kw) for _ in range(args.repeats)]
            except Exception as e:  # one failing method must not lose the other rows
                print(f"{scenario} batch {B} {method}: FAILED {type(e).__name__}: {e}")
                continue
            r = sorted(runs, key=lambda x: x["tokens_per_s"])[len(runs) // 2]
            base = base or r["tokens_per_s"]
            rows.append(dict(scenario=scenario, load=f"batch {B}", method=method, speedup=r["tokens_per_s"] / base, **r))
            print_engine_row(rows[-1])
    return rows


def arrival_rows(gen, prompts, new_tokens, args, max_seq_len, sync) -> list[dict]:
    """Continuous arrivals (Poisson at --arrival-rate) with and without the drafter. Each method
    runs the schedule untimed first (twice if the first run captured graphs): the batch sizes and
    token counts it passes through capture their decode, verify and mixed CUDA graphs there
    (lazily, a capture stalls a step by tens to hundreds of ms), not in the timed run, whichever
    method came first; the row's `captures` counts those the timed run still made."""
    g = torch.Generator().manual_seed(1)
    gaps = torch.empty(len(prompts)).exponential_(generator=g) / args.arrival_rate
    times = torch.cumsum(gaps, 0).tolist()
    rows, base = [], None
    for method, drafter_fn, adaptive in ENGINE_METHODS:
        kw = dict(block_size=args.block_size, max_seq_len=max_seq_len, sync=sync, arrival_times=times,
                  adaptive=adaptive)
        for _ in range(2):  # warm-up, again if it still captured graphs (the timed run reports its own)
            if engine_run(gen, prompts, new_tokens, drafter_fn(), **kw)["captures"] == 0:
                break
        r = engine_run(gen, prompts, new_tokens, drafter_fn(), **kw)
        base = base or r["tokens_per_s"]
        rows.append(dict(scenario="copy / echo-model", load=f"{len(prompts)} arrivals at {args.arrival_rate:g}/s",
                         method=method, speedup=r["tokens_per_s"] / base, **r))
        print_engine_row(rows[-1])
    return rows


def print_engine_row(r: dict) -> None:
    print(f"{r['scenario']:22s} {r['load']:24s} {r['method']:26s} {r['tokens_per_s']:9.1f} {r['speedup']:7.2f}x "
          f"{r['tpot_ms']:8.2f} {r['itl_p50_ms']:8.2f} {r['itl_p99_ms']:8.2f} {r['accepted_per_step']:8.2f} "
          f"{r['captures']:8d}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny model (smoke test)")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt-len", type=int, default=None, help="default 512 (tiny: 128)")
    ap.add_argument("--new-tokens", type=int, default=None, help="default 256 (tiny: 48)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--engine-only", action="store_true", help="only the engine rows")
    ap.add_argument("--no-engine", action="store_true", help="no engine rows")
    ap.add_argument("--no-arrivals", action="store_true", help="no continuous-arrivals engine rows")
    ap.add_argument("--engine-eagle3", action="store_true", help="engine rows with an EAGLE-3 drafter too "
                    "(random model, random head: what its drafting and hidden states cost)")
    ap.add_argument("--engine-eagle3-batches", type=int, nargs="+", default=[8],
                    help="the --engine-batches that get the EAGLE-3 rows")
    ap.add_argument("--methods", nargs="+", default=None, help="batch-1 methods to run (default: all; plain is "
                    "always run first, as the baseline)")
    ap.add_argument("--scenarios", nargs="+", default=None, choices=["random", "copy", "echo"],
                    help="batch-1 scenarios (default: all)")
    ap.add_argument("--engine-batches", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--engine-new-tokens", type=int, default=None, help="default 128 (tiny: 24)")
    ap.add_argument("--arrivals", type=int, default=None, help="requests in the arrivals run; default 64 (tiny: 16)")
    ap.add_argument("--arrival-rate", type=float, default=None, help="requests/s; default 16 (tiny: 40)")
    ap.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "bench_speculative"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "speculative.json"))
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    device = args.device
    prompt_len = args.prompt_len or (128 if args.tiny else 512)
    new_tokens = args.new_tokens or (48 if args.tiny else 256)
    cfg, dcfg = (TINY, DRAFT_TINY) if args.tiny else (LLAMA3_8B, DRAFT_8B)
    if device == "cpu":
        torch.set_num_threads(1)  # small matmuls: extra threads only spin on a shared CPU
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    tag = "tiny" if args.tiny else "8b"
    target_path = make_random_checkpoint(os.path.join(args.workdir, f"target_{tag}"), cfg, dtype, device=device, seed=0)
    draft_path = make_random_checkpoint(os.path.join(args.workdir, f"draft_{tag}"), dcfg, dtype, device=device, seed=1)
    load = dict(device=device, dtype=dtype, attention_backend=args.attention_backend)
    gen = TextGenerator.from_pretrained(target_path, **load)
    draft = TextGenerator.from_pretrained(draft_path, **load)
    max_seq_len = prompt_len + new_tokens + 8
    bs = args.block_size
    num_blocks = (max_seq_len + 64) // bs + 4
    kv = gen.allocate_kv_cache(num_blocks, bs)
    dkv = draft.allocate_kv_cache(num_blocks, bs)
    head_path = make_random_eagle3_head(os.path.join(args.workdir, f"eagle3_{tag}"), cfg, dtype,
                                        draft_vocab=min(32000, cfg["vocab_size"] // 2),
                                        aux=(0, 1, 2) if cfg["num_hidden_layers"] < 3 else None)
    # max_seq_len + 128: room for eagle3_step_cost (generate() keeps its own limit)
    eagle = Eagle3Drafter(gen, head_path, k=4, num_blocks=num_blocks, block_size=bs, max_seq_len=max_seq_len + 128)
    eagle_tree = Eagle3Drafter(gen, head_path, k=3, branches=3, num_blocks=3 * num_blocks, block_size=bs,
                               max_seq_len=max_seq_len)

    g = torch.Generator().manual_seed(0)
    V = cfg["vocab_size"]
    random_prompt = torch.randint(V, (prompt_len,), generator=g).tolist()
    seg = torch.randint(V, (64,), generator=g).tolist()
    copy_prompt = (seg * (prompt_len // 64 + 1))[:prompt_len]
    perm, cycle = cyclic_perm(V, prompt_len // 2, g)
    echo_prompt = (cycle * 3)[:prompt_len]

    methods = {
        "plain": lambda: None,
        "ngram chain d4": lambda: NgramDrafter(max_ngram=3, depth=4, branches=1),
        "ngram chain d8": lambda: NgramDrafter(max_ngram=3, depth=8, branches=1),
        "ngram tree 4x4": lambda: NgramDrafter(max_ngram=3, depth=4, branches=4),
        "draft model k4": lambda: DraftModelDrafter(
            draft, dkv, BlockManager(num_blocks, bs, enable_prefix_caching=False), k=4, max_seq_len=max_seq_len),
        "eagle3 k4 random": lambda: eagle,  # one head, reused: generate() finishes its requests
        "eagle3 tree 3x3": lambda: eagle_tree,
    }
    if args.methods is not None:
        unknown = set(args.methods) - set(methods)
        if unknown:
            ap.error(f"--methods: unknown {sorted(unknown)}; choose from {list(methods)}")
        methods = {m: f for m, f in methods.items() if m == "plain" or m in args.methods}
    scenarios = [("random / random-model", random_prompt, False), ("copy / random-model", copy_prompt, False),
                 ("copy / echo-model", echo_prompt, True)]
    if args.scenarios is not None:  # (in this order: the echo scenario turns the model into the echo model)
        scenarios = [s for s, key in zip(scenarios, ("random", "copy", "echo")) if key in args.scenarios]
    numerics = tree_vs_plain(gen, random_prompt, bs, max_seq_len)
    try:
        eagle_cost = eagle3_step_cost(gen, eagle, random_prompt, bs, max_seq_len, sync)
    except Exception as e:  # one failing measurement must not lose the other rows
        print(f"eagle3 step cost: FAILED {type(e).__name__}: {e}")
        eagle_cost = dict(target_decode_ms=float("nan"), eagle3_draft_step_ms=float("nan"), ratio=float("nan"), k=4,
                          error=f"{type(e).__name__}: {e}")
    rows = []
    print(f"device={device} model={'tiny' if args.tiny else 'Llama-3-8B-shaped'} dtype={args.dtype} "
          f"prompt={prompt_len} new_tokens={new_tokens} batch=1 backend={gen.model_wrapper.backend.name}")
    print("root logits, plain decode vs tree step (random model): max |diff| {max_abs_diff:.4f}, top-2 gap "
          "{top2_gap:.4f}, logit std {logit_std:.4f}, same argmax {same_argmax}".format(**numerics))
    print("eagle3 step cost: target decode step {target_decode_ms:.3f} ms, one EAGLE-3 draft step "
          "{eagle3_draft_step_ms:.3f} ms ({ratio:.2f}x; chains of {k}, {how})".format(
              how="graphed" if eagle.runner.graphs is not None else "eager", **eagle_cost))

    # engine rows, random model first (the batch-1 loop below turns the model into the echo model)
    e_new = args.engine_new_tokens or (24 if args.tiny else 128)
    e_len = prompt_len + e_new + 8
    n_arr = args.arrivals or (16 if args.tiny else 64)
    rate = args.arrival_rate or (40.0 if args.tiny else 16.0)
    args.arrival_rate = rate
    n_prompts = max(max(args.engine_batches), n_arr)
    print(f"{'engine: scenario':22s} {'load':24s} {'method':26s} {'tok/s':>9s} {'speedup':>8s} {'TPOT ms':>8s} "
          f"{'ITL p50':>8s} {'ITL p99':>8s} {'acc/step':>8s} {'captures':>8s}")
    random_prompts = [torch.randint(V, (prompt_len,), generator=g).tolist() for _ in range(n_prompts)]
    # EAGLE-3 in the engine (random head: nothing accepted; its cost, hidden states in every step)
    eagle_engine = [(f"engine eagle3 k{k} {'adaptive' if a else 'fixed'}",
                     lambda B, k=k: Eagle3Drafter(gen, head_path, k=k, block_size=bs, max_seq_len=e_len,
                                                  num_blocks=B * (-(-e_len // bs) + 1) + 8), a)
                    for k, a in ((4, True), (4, False))] if args.engine_eagle3 else []
    e_rows = [] if args.no_engine else \
        engine_rows(gen, "random / random-model", random_prompts, e_new, args.engine_batches, args, e_len, sync,
                    eagle_engine, args.engine_eagle3_batches)

    if not args.engine_only:
        print(f"{'scenario':24s} {'method':16s} {'tok/fwd':>8s} {'accept':>7s} {'time s':>8s} {'tok/s':>8s} {'speedup':>8s} {'same out':>8s}")
        for scen, prompt, echo in scenarios:
            if echo:
                make_echo(gen, perm.to(device))
                make_echo(draft, perm.to(device))
            base_time, base_out = None, None
            for name, fn in methods.items():
                try:
                    timed_generate(gen, kv, fn, prompt, new_tokens, max_seq_len, bs, sync)  # warm-up: every shape once
                    runs = [timed_generate(gen, kv, fn, prompt, new_tokens, max_seq_len, bs, sync)
                            for _ in range(args.repeats)]
                except Exception as e:  # one failing method must not lose the other rows
                    print(f"{scen} {name}: FAILED {type(e).__name__}: {e}")
                    continue
                t = statistics.median(r[0] for r in runs)
                _, out, st = runs[0]
                if name == "plain":
                    base_time, base_out = t, out
                decode_fwd = max(1, st.forwards - 1)
                row = dict(scenario=scen, method=name, tokens_per_forward=(st.emitted - 1) / decode_fwd,
                           acceptance=st.accepted / max(1, st.drafted), forwards=st.forwards, seconds=t,
                           tokens_per_s=len(out) / t, speedup=base_time / t, same_output=out == base_out,
                           first_difference=next((i for i, (a, b) in enumerate(zip(out, base_out)) if a != b), None))
                rows.append(row)
                print(f"{scen:24s} {name:16s} {row['tokens_per_forward']:8.2f} {row['acceptance']:7.2f} {t:8.3f} "
                      f"{row['tokens_per_s']:8.1f} {row['speedup']:7.2f}x {str(row['same_output']):>8s}")

    if args.engine_only or not any(echo for *_, echo in scenarios):  # the echo engine rows need the echo model
        make_echo(gen, perm.to(device))
    echo_prompts = [(cycle[i % len(cycle):] + cycle * 4)[:prompt_len] for i in range(n_prompts)]
    if not args.no_engine:
        e_rows += engine_rows(gen, "copy / echo-model", echo_prompts, e_new, args.engine_batches, args, e_len, sync)
        if not args.no_arrivals:
            e_rows += arrival_rows(gen, echo_prompts[:n_arr], e_new, args, e_len, sync)
    result = dict(device=torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
                  model="tiny" if args.tiny else "Llama-3-8B-shaped (random)", dtype=args.dtype,
                  prompt_len=prompt_len, new_tokens=new_tokens, batch=1, block_size=bs,
                  attention_backend=gen.model_wrapper.backend.name, repeats=args.repeats,
                  tree_vs_plain_numerics=numerics, eagle3_step_cost=eagle_cost, rows=rows, engine_new_tokens=e_new,
                  engine_rows=e_rows)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    if rows:
        plot(rows, args.out[: -len(".json")] + ".png", f"speculative decoding, batch 1 ({result['model']}, {result['device']})")
    if e_rows:
        plot_engine(e_rows, args.out[: -len(".json")] + "_engine.png",
                    f"engine with / without speculation ({result['model']}, {result['device']})")
    print(f"wrote {args.out}")


def plot_engine(rows, path, title):
    plt = pyplot()
    if plt is None:
        return
    loads = list(dict.fromkeys((r["scenario"], r["load"]) for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, label in ((axes[0], "tokens_per_s", "output tokens/s"), (axes[1], "itl_p99_ms", "ITL p99 (ms)")):
        methods = list(dict.fromkeys(r["method"] for r in rows))
        w = 0.8 / len(methods)
        for m_i, m in enumerate(methods):
            vals = [next((r[key] for r in rows if (r["scenario"], r["load"]) == ld and r["method"] == m), 0.0)
                    for ld in loads]
            ax.bar([i + m_i * w for i in range(len(loads))], vals, w, label=m)
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(loads))], [f"{a}\n{b}" for a, b in loads], fontsize=7)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def plot(rows, path, title):
    plt = pyplot()
    if plt is None:
        return
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(methods)
    for ax, key, label in ((axes[0], "tokens_per_forward", "tokens per target forward"),
                           (axes[1], "speedup", "wall-clock speedup over plain decoding")):
        for m_i, m in enumerate(methods):
            vals = [next((r[key] for r in rows if r["scenario"] == s and r["method"] == m), 0.0) for s in scenarios]
            ax.bar([s_i + m_i * width for s_i in range(len(scenarios))], vals, width, label=m)
        ax.set_xticks([s_i + 0.4 - width / 2 for s_i in range(len(scenarios))], scenarios, fontsize=8)
        ax.set_ylabel(label)
        ax.axhline(1.0, color="gray", lw=0.8)
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
