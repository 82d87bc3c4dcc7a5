"""Multi-LoRA decode cost: base model vs 1, 4, 16 distinct adapters in one batch.

A Llama-3-8B-shaped model with random bf16 weights (benchmarks.common.make_random_checkpoint,
drawn on the GPU, loaded through TextGenerator.from_pretrained), batch 32 decoding at 2k
context; adapters of rank 16 and 64 on all 7 projections, filled with random weights directly in
the manager's slots. Requests use the adapters round-robin (request i -> adapter i % n). Each
kernel ("triton" Punica-style shrink/expand, "flashinfer" segment GEMM, "torch" per-adapter loop)
is timed separately. With the triton kernel each projection's LoRA shrink runs on a side stream,
overlapping the base GEMM; --no-overlap keeps it on one stream (A/B). In decode graphs the qkv and
gate_up expands of rank <= 16 run inside RoPE + K/V store and SiLU-and-mul; --no-fuse gives them
expand kernels of their own (A/B). Where max_loras * max_rank <= 256 (16 x rank 16 here) the A
stacks are folded into the base weights (LoraManager.fold_into): each base GEMM computes every
slot's shrink, no shrink kernels, no side stream in the graphs; --no-fold keeps them apart (A/B).

    python benchmarks/bench_lora.py                       # CUDA, the full-size model
    python benchmarks/bench_lora.py --kernels triton --ranks 16 64 --adapters 1 4 16 \
        [--no-overlap] [--no-fuse] [--no-fold]
    python benchmarks/bench_lora.py --device cpu --tiny   # smoke test of the script itself
    python benchmarks/bench_lora.py --replot benchmarks/results/lora.json   # redraw the PNG only

Prints a table; writes benchmarks/results/lora.json and lora.png (lora_no_overlap.* with
--no-overlap, lora_no_fuse.* with --no-fuse, lora_no_fold.* with --no-fold; the PNG if matplotlib
is installed). Each step is one forward_tensor call with its
per-step inputs on the CPU, as a scheduler passes them; decode steps replay CUDA graphs where the
kernel allows (the base model, triton), else run eagerly. Two times per row: "sync" = wall-clock
of one call synchronised before and after (median over --steps), "pipelined" = --steps calls back
to back with one synchronize at the end, divided by --steps (host work hidden behind the GPU's);
"replay" = the decode graph replayed alone (GPU time only, best of 3 x 50; graphs only), the
number that does not move with the host's load.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from adapters import PEFT_MODULES, LoraManager, PeftAdapter  # noqa: E402
from benchmarks.common import LLAMA3_8B, make_random_checkpoint, pyplot  # noqa: E402
from text_generator import TextGenerator  # noqa: E402

TINY = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=512, hidden_size=128,
            intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
            hidden_act="silu")


def random_adapter(name: str, manager: LoraManager, rank: int, device) -> PeftAdapter:
    """Rank-`rank` LoRA on all 7 projections of every layer, made on the device."""
    g = torch.Generator(device=device).manual_seed(sum(name.encode()))
    weights = {}
    for layer in range(manager.shapes.num_layers):
        for proj in PEFT_MODULES:
            in_f, out_f = manager.shapes.peft_shape(proj)
            a = torch.randn(rank, in_f, device=device, generator=g) / math.sqrt(in_f)
            b = torch.randn(out_f, rank, device=device, generator=g) * 0.01
            weights[(layer, proj)] = (a, b)
    return PeftAdapter(name=name, path="<random>", weights=weights)


def save_peft_folder(path: str, adapter: PeftAdapter, rank: int, dtype: torch.dtype) -> str:
    """The adapter as a PEFT folder (for timing load_adapter from disk)."""
    os.makedirs(path, exist_ok=True)
    tensors = {}
    for (layer, proj), (a, b) in adapter.weights.items():
        parent = "self_attn" if proj in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
        key = f"base_model.model.model.layers.{layer}.{parent}.{proj}"
        tensors[key + ".lora_A.weight"] = a.to("cpu", dtype).contiguous()
        tensors[key + ".lora_B.weight"] = b.to("cpu", dtype).contiguous()
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": sorted(PEFT_MODULES),
                   "bias": "none"}, f)
    return path


class DecodeBench:
    """A fixed decode batch at `context` tokens per request, contiguous blocks per request.

    Every input is a CPU tensor, as a scheduler hands them over: validation then needs no
    device-to-host copy (a sync per step) and the step's ints go to the GPU in one pinned copy.
    """

    def __init__(self, gen: TextGenerator, batch: int, context: int, block_size: int):
        self.gen, self.B, self.L = gen, batch, context
        bps = math.ceil(context / block_size)
        self.kv_cache = gen.allocate_kv_cache(batch * bps, block_size)
        self.block_tables = torch.arange(batch * bps, dtype=torch.int32).reshape(batch, bps)
        pos = context - 1
        self.input_ids = torch.randint(0, gen.vocab_size, (batch,))
        self.positions = torch.full((batch,), pos, dtype=torch.int64)
        self.slots = self.block_tables[:, pos // block_size].long() * block_size + pos % block_size
        self.input_lengths = torch.full((batch,), context, dtype=torch.int32)

    def replay_ms(self, adapter_ids, n: int = 50) -> float | None:
        """GPU time of the decode graph alone (no host work): best of 3 runs of n back-to-back
        replays of the graph the last step used; None without graphs (eager kernels, CPU)."""
        graphs = self.gen.model_wrapper.graphs
        self.step(adapter_ids)  # (captures if needed, and sets the adapter mapping)
        if graphs is None or not graphs._graphs or (adapter_ids is not None and graphs.lora is None):
            return None
        g = graphs._graphs[graphs.bucket_for(self.B)].graph
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                g.replay()
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / n * 1e3)
        return best

    def step(self, adapter_ids):
        return self.gen.forward_tensor(self.input_ids, self.positions, False, self.kv_cache, self.block_tables,
                                       self.slots, self.input_lengths, self.L, adapter_ids=adapter_ids)

    def time(self, adapter_ids, steps: int, warmup: int) -> tuple[float, float]:
        """-> (median ms of one step synchronised before and after, mean ms of `steps` steps run back
        to back with one synchronize at the end); the same position is rewritten each time."""
        sync = torch.cuda.synchronize if self.gen.device.type == "cuda" else (lambda: None)
        times = []
        for k in range(warmup + steps):
            sync()
            t0 = time.perf_counter()
            self.step(adapter_ids)
            sync()
            if k >= warmup:
                times.append((time.perf_counter() - t0) * 1e3)
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step(adapter_ids)
        sync()
        return statistics.median(times), (time.perf_counter() - t0) * 1e3 / steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny model and batch (checks the script runs)")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--context", type=int)
    ap.add_argument("--ranks", type=int, nargs="+")
    ap.add_argument("--adapters", type=int, nargs="+", help="distinct adapters per batch")
    ap.add_argument("--kernels", nargs="+",
                    help="default on CUDA: triton, flashinfer (those installed) and torch; torch on CPU")
    ap.add_argument("--no-fuse", action="store_true", help="the qkv / o / gate_up / down expands as kernels of their own (A/B)")
    ap.add_argument("--no-fold", action="store_true",
                    help="triton: keep the A stacks out of the base weights (LoraManager.fold_into), "
                         "shrinks as kernels")
    ap.add_argument("--no-overlap", action="store_true",
                    help="triton: LoRA shrinks on the current stream, not on a side stream beside the base GEMM")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--model-dir", help="where the random checkpoint is written (reused if present)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--replot", metavar="JSON", help="only redraw the PNG beside a JSON this script wrote")
    args = ap.parse_args(argv)
    if args.replot:
        with open(args.replot) as f:
            res = json.load(f)
        counts = sorted({r["num_adapters"] for r in res["rows"][1:]})
        plot(res["rows"], counts, os.path.splitext(args.replot)[0] + ".png",
             f"LoRA decode, batch {res['batch']} @ {res['context']} ({res['device']})"
             f"{'' if res['overlap'] else ', no overlap'}")
        return
    device = torch.device(args.device)
    tiny = args.tiny
    batch = args.batch or (4 if tiny else 32)
    context = args.context or (64 if tiny else 2048)
    ranks = args.ranks or ([4, 8] if tiny else [16, 64])
    counts = args.adapters or ([1, 2, 4] if tiny else [1, 4, 16])
    steps = args.steps or (3 if tiny else 20)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if args.kernels:
        kernels = args.kernels
    elif device.type == "cuda":
        kernels = [k for k in ("triton", "flashinfer") if importlib.util.find_spec(k) is not None] + ["torch"]
    else:
        kernels = ["torch"]

    model_cfg = TINY if tiny else LLAMA3_8B
    tmp = tempfile.TemporaryDirectory(prefix="bench_lora_")
    model_dir = args.model_dir or os.path.join(tmp.name, "model")
    t0 = time.perf_counter()
    make_random_checkpoint(model_dir, model_cfg, dtype, device=device)
    gen = TextGenerator.from_pretrained(model_dir, device=device, dtype=dtype)
    print(f"model ready in {time.perf_counter() - t0:.1f}s on {device}", flush=True)
    bench = DecodeBench(gen, batch, context, args.block_size)
    cfg = gen.config
    shapes = dict(num_layers=cfg.num_layers, hidden_size=cfg.hidden_size, q_size=cfg.num_heads * cfg.head_dim,
                  kv_size=cfg.num_kv_heads * cfg.head_dim, intermediate_size=cfg.intermediate_size)

    overlap = not args.no_overlap
    base_ms, base_pipe = bench.time(None, steps, args.warmup)
    base_replay = bench.replay_ms(None)
    rows = [dict(kernel="-", rank=0, num_adapters=0, overlap=False, ms_per_step=base_ms,
                 pipelined_ms_per_step=base_pipe, replay_ms=base_replay)]
    load_ms = {}
    for kernel in kernels:
        for rank in ranks:
            manager = LoraManager(**shapes, max_loras=max(counts), max_rank=rank, device=device, dtype=dtype,
                                  kernel=kernel, overlap=overlap, fuse_expand=not args.no_fuse,
                                  fold=False if args.no_fold else "auto")
            # as gen.enable_lora does: wrap the projections (once), fold (where manager.folds), attach the
            # graphs (they carry LoRA when the kernel allows: triton)
            gen.model_wrapper.enable_lora(manager)
            gen.lora_manager = manager  # the generator's documented attribute; one manager per (kernel, rank)
            for a in range(max(counts)):
                manager.add_adapter(random_adapter(f"a{a}", manager, rank, device))
            if kernel == kernels[0]:  # load_adapter from a PEFT folder on disk, into a freed slot
                folder = save_peft_folder(os.path.join(tmp.name, f"peft_r{rank}"),
                                          random_adapter("disk", manager, rank, device), rank, dtype)
                manager.unload_adapter(f"a{max(counts) - 1}")
                sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
                sync()
                t = time.perf_counter()
                manager.load_adapter(f"a{max(counts) - 1}", folder)
                sync()
                load_ms[rank] = (time.perf_counter() - t) * 1e3
            for n in counts:
                ids = [f"a{i % n}" for i in range(batch)]
                ms, pipe = bench.time(ids, steps, args.warmup)
                replay = bench.replay_ms(ids)
                rows.append(dict(kernel=manager.kernel, rank=rank, num_adapters=n, overlap=manager.overlap,
                                 folded=bool(manager.folded),
                                 ms_per_step=ms, pipelined_ms_per_step=pipe, replay_ms=replay))
                print(f"  {manager.kernel:>10} rank {rank:>3} adapters {n:>3}: {ms:8.2f} ms sync, "
                      f"{pipe:8.2f} ms pipelined, replay {replay or float('nan'):.2f} ms", flush=True)
            gen.lora_manager = None
            if gen.model_wrapper.graphs is not None:
                gen.model_wrapper.graphs.attach_lora(None)
            del manager
            if device.type == "cuda":
                torch.cuda.empty_cache()
    # the base model once more at the end: the lower of the two is the reference (warm caches, clocks)
    base_after, pipe_after = bench.time(None, steps, args.warmup)
    rows[0]["ms_per_step"] = base_ms = min(base_ms, base_after)
    rows[0]["pipelined_ms_per_step"] = base_pipe = min(base_pipe, pipe_after)
    replay_after = bench.replay_ms(None)
    if base_replay is not None and replay_after is not None:
        rows[0]["replay_ms"] = base_replay = min(base_replay, replay_after)
    for r in rows:
        r["tokens_per_s"] = batch / (r["ms_per_step"] / 1e3)
        r["overhead_vs_base"] = r["ms_per_step"] / base_ms - 1.0
        r["pipelined_tokens_per_s"] = batch / (r["pipelined_ms_per_step"] / 1e3)
        r["pipelined_overhead_vs_base"] = r["pipelined_ms_per_step"] / base_pipe - 1.0
        r["replay_overhead_vs_base"] = (None if r.get("replay_ms") is None or base_replay is None
                                        else r["replay_ms"] / base_replay - 1.0)

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"\nLoRA decode, batch {batch} at context {context}, {device_name}, {dtype}, "
          f"{'tiny' if tiny else 'Llama-3-8B-shaped'} model, adapters on all 7 projections, "
          f"triton shrink overlap {'on' if overlap else 'off'}, expands fused into their consumers "
          f"{'off' if args.no_fuse else 'on (rank <= 16)'}, A folded into the base GEMMs "
          f"{'off' if args.no_fold else 'where max_loras x max_rank <= 256'}")
    print(f"{'kernel':>10} {'rank':>5} {'adapters':>8} {'sync ms':>9} {'tok/s':>9} {'vs base':>8} "
          f"{'pipe ms':>9} {'tok/s':>9} {'vs base':>8} {'replay ms':>10} {'vs base':>8}")
    for r in rows:
        rep = r.get("replay_ms")
        rep_s = f"{rep:10.2f} {r['replay_overhead_vs_base']:+8.1%}" if rep is not None else f"{'-':>10} {'-':>8}"
        print(f"{r['kernel']:>10} {r['rank'] or '-':>5} {r['num_adapters'] or 'base':>8} {r['ms_per_step']:9.2f} "
              f"{r['tokens_per_s']:9.0f} {r['overhead_vs_base']:+8.1%} {r['pipelined_ms_per_step']:9.2f} "
              f"{r['pipelined_tokens_per_s']:9.0f} {r['pipelined_overhead_vs_base']:+8.1%} {rep_s}")
    for rank, ms in load_ms.items():
        print(f"load_adapter (rank {rank}, PEFT folder on disk): {ms:.0f} ms")

    os.makedirs(args.out, exist_ok=True)
    result = dict(benchmark="lora_decode", device=device_name, dtype=str(dtype), tiny=tiny, batch=batch,
                  context=context, block_size=args.block_size, steps=steps, warmup=args.warmup, overlap=overlap,
                  fuse_expand=not args.no_fuse, fold=not args.no_fold,
                  model={k: v for k, v in model_cfg.items()}, target_modules=sorted(PEFT_MODULES),
                  rows=rows, load_adapter_ms={str(k): v for k, v in load_ms.items()})
    name = "lora" if overlap else "lora_no_overlap"
    if args.no_fuse:
        name += "_no_fuse"
    if args.no_fold:
        name += "_no_fold"
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=2)
    plot(rows, counts, os.path.join(args.out, f"{name}.png"),
         f"LoRA decode, batch {batch} @ {context} ({device_name}){'' if overlap else ', no overlap'}")
    print(f"wrote {os.path.join(args.out, name + '.json')}")
    tmp.cleanup()


def plot(rows, counts, path, title):
    """Left: ms per step, graph replay (GPU only; sync times where there is none) and back to back;
    right: the replay's overhead over the base model, beside the +10% target at 16 adapters."""
    plt = pyplot()
    if plt is None:
        return
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    base = rows[0]
    key = "replay_ms" if base.get("replay_ms") is not None else "ms_per_step"
    what = "replay" if key == "replay_ms" else "synchronised"
    ax.axhline(base[key], color="gray", linestyle="--", label=f"base model, {what} ({base[key]:.2f} ms)")
    ax.axhline(base["pipelined_ms_per_step"], color="gray", linestyle=":",
               label=f"base model, back to back ({base['pipelined_ms_per_step']:.2f} ms)")
    for kernel, rank in sorted({(r["kernel"], r["rank"]) for r in rows[1:]}):
        mine = [r for r in rows if r["kernel"] == kernel and r["rank"] == rank]
        n = [r["num_adapters"] for r in mine]
        ms = [r[key] if r.get(key) is not None else r["ms_per_step"] for r in mine]
        line, = ax.plot(n, ms, marker="o", label=f"{kernel}, rank {rank}, {what}")
        ax.plot(n, [r["pipelined_ms_per_step"] for r in mine], marker="x", linestyle=":", color=line.get_color(),
                label=f"{kernel}, rank {rank}, back to back")
        ax2.plot(n, [100 * (m / base[key] - 1) for m in ms], marker="o", color=line.get_color(),
                 label=f"{kernel}, rank {rank}")
    ax2.axhline(10, color="red", linestyle="--", label="target at 16 adapters, rank 16 (+10%)")
    for a in (ax, ax2):
        a.set_xscale("log", base=2)
        a.set_xticks(counts, [str(c) for c in counts])
        a.set_xlabel("distinct adapters in the batch")
        a.legend(fontsize=8)
    ax.set_ylabel("ms per decode step")
    ax2.set_ylabel(f"{what} overhead over the base model (%)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
