"""The command line: `python -m text_generator generate ...` and `python -m text_generator bench ...`.

generate  runs prompts (arguments or --file, one per line) through the reference engine and
          prints each completion; without --model it uses the demo checkpoint (random weights:
          the text is noise, and the CLI says so).
serve     an OpenAI-compatible HTTP server (text_generator/serve, the `serve` extra).
bench     runs a synthetic offline load (random prompts of --input-len tokens, exactly
          --output-len new tokens each) and reports requests/s, output tokens/s, time to first
          token and inter-token latency (p50 / p99); --json writes them to a file.

generate and bench shard the model over the ranks of torchrun with --tensor-parallel (`torchrun
--nproc-per-node N -m text_generator generate ... --tensor-parallel`): every rank runs the same
engine in lockstep (SPMD, model_wrapper/parallel.py); rank 0 prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import time

_BACKENDS = ("auto", "torch", "flashinfer")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="local checkpoint folder (default: the random demo checkpoint)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: the checkpoint's)")
    p.add_argument("--attention-backend", default="auto", choices=_BACKENDS)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=None,
                   help="KV blocks (default: 90%% of free memory on CUDA, enough for the load on CPU)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                   help="load a PEFT LoRA adapter (repeatable)")
    p.add_argument("--adapter", default=None, help="adapter NAME every prompt runs under (default: base model)")
    p.add_argument("--speculative", action="store_true",
                   help="speculative decoding with n-gram prompt lookup (greedy requests: --temperature 0)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--tensor-parallel", action="store_true",
                   help="shard the model over the ranks of torchrun (NCCL on CUDA, gloo on CPU); rank 0 prints")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m text_generator", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text for prompts")
    g.add_argument("prompts", nargs="*", help="prompts (text; comma-separated token ids with --token-ids)")
    g.add_argument("--file", help="read prompts from a file, one per line")
    g.add_argument("--token-ids", action="store_true", help="prompts are comma-separated token ids")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--ignore-eos", action="store_true")
    _common(g)
    b = sub.add_parser("bench", help="synthetic throughput / latency benchmark")
    b.add_argument("--num-prompts", type=int, default=64)
    b.add_argument("--input-len", type=int, default=128)
    b.add_argument("--output-len", type=int, default=64)
    b.add_argument("--json", dest="json_path", help="write the results to this JSON file")
    _common(b)
    b.set_defaults(temperature=0.0)
    from text_generator.serve.args import add_serve_arguments

    add_serve_arguments(sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the serve extra)"))
    return parser


class CLIError(Exception):
    pass


def _load_model(args):
    """-> (generator, tokenizer or None); says when the weights are the random demo's."""
    from text_generator import TextGenerator
    from text_generator.tokenizer import load_tokenizer

    tp = _init_tensor_parallel(args) if args.tensor_parallel else None
    if args.model is None:
        from text_generator.demo import ensure_demo_checkpoint

        if tp is not None and tp.rank != 0:  # rank 0 writes the demo checkpoint, once
            _barrier()
        path = ensure_demo_checkpoint()
        if tp is not None and tp.rank == 0:
            _barrier()
        print(f"note: no --model given; using the demo checkpoint at {path}. Its weights are RANDOM, "
              f"so its text is random too.", file=sys.stderr)
    else:
        path = args.model
    gen = TextGenerator.from_pretrained(path, device=args.device, dtype=args.dtype,
                                        attention_backend=args.attention_backend, tp_group=tp)
    _load_loras(gen, args.lora)
    return gen, load_tokenizer(path)


def _init_tensor_parallel(args):
    """torchrun's environment -> the default process group and this rank's TPGroup. Ranks other
    than 0 stay silent (stdout to devnull, no --json) but compute the same steps."""
    import torch
    import torch.distributed as dist

    from model_wrapper import TPGroup

    if "WORLD_SIZE" not in os.environ:
        raise CLIError("--tensor-parallel: expected to run under torchrun (torchrun --nproc-per-node N "
                       "-m text_generator ...), got no WORLD_SIZE in the environment")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and (args.device is None or str(args.device).startswith("cuda"))
    if cuda:
        torch.cuda.set_device(local_rank)
        args.device = f"cuda:{local_rank}"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    tp = TPGroup.from_default_group()
    if tp.rank != 0:
        sys.stdout = open(os.devnull, "w")
        args.json_path = None
    return tp


def _barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def _make_engine(args, gen, tok, max_len: int, num_seqs: int):
    from text_generator.engine import LLMEngine

    drafter = None
    if args.speculative:
        from text_generator.speculative import NgramDrafter

        drafter = NgramDrafter()
        if args.temperature != 0:
            print("note: --speculative drafts for greedy requests only (--temperature 0)", file=sys.stderr)
    max_seq_len = min(gen.max_position_embeddings, max_len)
    num_blocks = args.num_blocks or _default_num_blocks(gen, args.block_size, max_seq_len,
                                                        min(num_seqs, args.max_num_seqs))
    if gen.tp_group.enabled:  # lockstep: every rank's scheduler must see the same number of blocks
        import torch
        import torch.distributed as dist

        n = torch.tensor([num_blocks], dtype=torch.int64, device=gen.device)
        dist.all_reduce(n, op=dist.ReduceOp.MIN, group=gen.tp_group.group)
        num_blocks = int(n.item())
    return LLMEngine(gen, num_blocks=num_blocks, block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                     max_num_batched_tokens=args.max_num_batched_tokens,
                     enable_prefix_caching=not args.no_prefix_caching, max_seq_len=max_seq_len, tokenizer=tok,
                     speculative=drafter)


def _default_num_blocks(gen, block_size: int, max_seq_len: int, num_seqs: int) -> int:
    per_seq = -(-max_seq_len // block_size)
    if gen.device.type == "cuda":
        from kv_manager import profile_num_blocks

        return profile_num_blocks(gen.kv_cache_spec, block_size, device=gen.device, memory_fraction=0.9,
                                  max_seq_len=max_seq_len)
    return per_seq * max(num_seqs, 1) + 1


def _load_loras(gen, specs: list[str]) -> None:
    if not specs:
        return
    if not (hasattr(gen, "enable_lora") and hasattr(gen, "load_adapter")):
        raise CLIError("--lora: this build's TextGenerator has no enable_lora / load_adapter (LoRA support missing)")
    pairs = []
    for s in specs:
        name, sep, path = s.partition("=")
        if not sep or not name or not path:
            raise CLIError(f"--lora: expected NAME=PATH, got {s!r}")
        pairs.append((name, path))
    ranks = []
    for _, path in pairs:
        try:
            with open(os.path.join(path, "adapter_config.json")) as f:
                ranks.append(int(json.load(f).get("r", 8)))
        except (OSError, ValueError):
            ranks.append(8)
    gen.enable_lora(max_loras=len(pairs), max_rank=max(ranks))
    for name, path in pairs:
        gen.load_adapter(name, path)


def _params(args, max_new_tokens: int, ignore_eos: bool):
    from text_generator.sampling import SamplingParams

    try:
        return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                              repetition_penalty=args.repetition_penalty, seed=args.seed,
                              max_new_tokens=max_new_tokens, ignore_eos=ignore_eos)
    except ValueError as e:
        raise CLIError(str(e)) from None


def cmd_generate(args) -> int:
    prompts = list(args.prompts)
    if args.file:
        with open(args.file) as f:
            prompts += [line.rstrip("\n") for line in f if line.strip()]
    if not prompts:
        raise CLIError("generate: give prompts as arguments or with --file")
    if args.token_ids:
        try:
            prompts = [[int(t) for t in p.replace(",", " ").split()] for p in prompts]
        except ValueError:
            raise CLIError("--token-ids: expected comma-separated integers") from None
    params = _params(args, args.max_new_tokens, args.ignore_eos)
    gen, tok = _load_model(args)
    if tok is None and not args.token_ids:
        raise CLIError("generate: this checkpoint has no tokenizer files; pass token ids with --token-ids")
    ids = prompts if args.token_ids else [list(tok.encode(p)) for p in prompts]
    engine = _make_engine(args, gen, tok, max(map(len, ids)) + args.max_new_tokens, len(ids))
    # one seed per prompt: the same seed would give every prompt the same random stream
    per_prompt = [params if params.seed is None else dataclasses.replace(params, seed=params.seed + i)
                  for i in range(len(ids))]
    outs = engine.generate(ids, per_prompt, adapters=args.adapter, use_tqdm=False)
    for i, (p, o) in enumerate(zip(prompts, outs)):
        print(f"=== [{i}] {p!r}")
        if o.finish_reason == "error":
            print(f"error: {o.error}")
            continue
        print(o.text if o.text is not None else o.token_ids)
        print(f"--- {len(o.token_ids)} tokens, finish_reason={o.finish_reason}")
    return 0 if all(o.finish_reason != "error" for o in outs) else 1


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(outputs, elapsed: float) -> dict:
    """Throughput and latency of finished RequestOutputs (all arrived at the start)."""
    ttft = [o.metrics.ttft for o in outputs if o.metrics.ttft is not None]
    itl = [x for o in outputs for x in o.metrics.itls]
    n_out = sum(len(o.token_ids) for o in outputs)
    return {
        "num_requests": len(outputs), "elapsed_s": elapsed, "output_tokens": n_out,
        "requests_per_s": len(outputs) / elapsed, "output_tokens_per_s": n_out / elapsed,
        "ttft_p50_ms": 1e3 * _pct(ttft, 50), "ttft_p99_ms": 1e3 * _pct(ttft, 99),
        "itl_p50_ms": 1e3 * _pct(itl, 50), "itl_p99_ms": 1e3 * _pct(itl, 99),
    }


def cmd_bench(args) -> int:
    if min(args.num_prompts, args.input_len, args.output_len) < 1:
        raise CLIError("bench: --num-prompts, --input-len and --output-len must be >= 1")
    params = _params(args, args.output_len, True)
    gen, tok = _load_model(args)
    engine = _make_engine(args, gen, tok, args.input_len + args.output_len, args.num_prompts)
    rng = random.Random(0 if args.seed is None else args.seed)
    prompts = [[rng.randrange(gen.vocab_size) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    engine.generate([prompts[0][:8]], dataclasses.replace(params, max_new_tokens=2), use_tqdm=False)
    engine.block_manager.reset_prefix_cache()  # the warm-up must not serve the load from cache
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params, adapters=args.adapter, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    errors = [o.error for o in outs if o.finish_reason == "error"]
    if errors:
        raise CLIError(f"bench: {len(errors)} requests failed, first: {errors[0]}")
    res = summarize(outs, elapsed)
    res.update(num_steps=engine.num_steps, num_preemptions=engine.num_preemptions,
               num_draft_tokens=engine.num_draft_tokens, num_accepted_tokens=engine.num_accepted_tokens,
               config={k: v for k, v in vars(args).items() if k not in ("func", "json_path")},
               device=str(gen.device), dtype=str(gen.dtype).replace("torch.", ""))
    print(f"{res['num_requests']} requests in {elapsed:.2f} s: {res['requests_per_s']:.2f} req/s, "
          f"{res['output_tokens_per_s']:.1f} output tok/s")
    print(f"TTFT p50 {res['ttft_p50_ms']:.1f} ms  p99 {res['ttft_p99_ms']:.1f} ms | "
          f"ITL p50 {res['itl_p50_ms']:.2f} ms  p99 {res['itl_p99_ms']:.2f} ms")
    if args.json_path:
        os.makedirs(os.path.dirname(os.path.abspath(args.json_path)), exist_ok=True)
        with open(args.json_path, "w") as f:
            json.dump(res, f, indent=2)
    return 0


def cmd_serve(args) -> int:
    try:
        from text_generator.serve import server
    except ImportError as e:
        raise CLIError(f"serve: expected the serve extra (pip install 'text-generator[serve]'), got {e}") from None
    return server.run(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"generate": cmd_generate, "bench": cmd_bench, "serve": cmd_serve}[args.command](args)
    except CLIError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, RuntimeError, OSError) as e:  # bad checkpoint, adapter, device ...
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    finally:
        if args.tensor_parallel:
            import gc

            import torch.distributed as dist

            if dist.is_initialized():
                # NCCL's teardown waits until every CUDA graph holding its collectives is gone:
                # free the generator's graphs first, frozen (LLMEngine's gc.freeze) or not
                gc.unfreeze()
                gc.collect()
                dist.destroy_process_group()

