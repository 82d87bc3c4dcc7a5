"""The command line: `python -m text_generator generate ...` and `python -m text_generator bench ...`.

generate  runs prompts (arguments or --file, one per line, read lazily up to --max-prompts)
          through the reference engine and prints each completion in prompt order
          (cli_printer.py): streamed as it grows on a terminal (--stream / --no-stream), or as
          JSON lines (--json); --chat renders each prompt with the tokenizer's chat template,
          --stop / --logprobs / --seed as SamplingParams. Without --model it uses the demo
          checkpoint (random weights: the text is noise, and the CLI says so).
serve     an OpenAI-compatible HTTP server (text_generator/serve, the `serve` extra).
bench     runs a synthetic offline load (random prompts of --input-len tokens, exactly
          --output-len new tokens each) and reports requests/s, output tokens/s, time to first
          token and inter-token latency (p50 / p99); --json writes them to a file.

generate and bench shard the model over the ranks of torchrun with --tensor-parallel (`torchrun
--nproc-per-node N -m text_generator generate ... --tensor-parallel`): every rank runs the same
engine in lockstep (SPMD, model_wrapper/parallel.py); rank 0 prints. serve does the same with
rank 0 serving HTTP (text_generator/serve/engine_worker.py).

A bad command line or checkpoint costs one line on stderr ("error: ...") and exit code 2; a
prompt that fails inside the engine is reported with its output and makes the exit code 1.
The library's log lines (loguru) show from --log-level (default WARNING) up; progress bars
(loading shards, bench) go to stderr unless --no-progress.
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
_DTYPES = ("float32", "bfloat16", "float16")
_LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")
_FMT = argparse.ArgumentDefaultsHelpFormatter
# A --file line longer than this many characters per --max-model-len token is refused before
# it is tokenized (no tokenizer's tokens come near 64 characters on average), so an endless
# line never has to fit in memory.
_CHARS_PER_TOKEN_CAP = 64


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad command line costs one line on stderr (exit code 2), not the usage."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see --help)\n")


def _int_at_least(lo: int):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an int >= {lo}, got {s!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"expected an int >= {lo}, got {v}")
        return v

    parse.__name__ = f"int >= {lo}"  # argparse names the type in some messages
    return parse


def _device(s: str) -> str:
    """A device string that this machine has: checked at parse time, so no traceback later."""
    import torch

    try:
        dev = torch.device(s)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {s!r}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError(
                f"expected a CUDA device this machine has, got {s!r} but torch sees no CUDA GPU "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); use --device cpu")
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise argparse.ArgumentTypeError(f"expected cuda:0 .. cuda:{n - 1}, got {s!r}")
    elif dev.type != "cpu":
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {s!r}")
    return s


def _common(p: argparse.ArgumentParser) -> None:
    from text_generator.serve.args import add_fp8_arguments  # no HTTP imports (serve/__init__.py)

    p.add_argument("--model", help="local checkpoint folder (default: the random demo checkpoint)")
    p.add_argument("--device", type=_device, default=None, help="cpu, cuda, cuda:1 ... (None: cuda if available)")
    p.add_argument("--dtype", default=None, choices=_DTYPES, help="None: the checkpoint's (bfloat16 for fp32 on CUDA)")
    p.add_argument("--attention-backend", default="auto", choices=_BACKENDS)
    p.add_argument("--block-size", type=_int_at_least(1), default=16, help="tokens per KV block")
    p.add_argument("--num-blocks", type=_int_at_least(1), default=None,
                   help="KV blocks (None: 90%% of free memory on CUDA, enough for the load on CPU)")
    p.add_argument("--max-model-len", type=_int_at_least(2), default=None,
                   help="longest prompt + output (None: the prompts' need, at most the model's limit)")
    p.add_argument("--max-num-seqs", type=_int_at_least(1), default=64, help="requests running at once")
    p.add_argument("--max-num-batched-tokens", type=_int_at_least(1), default=2048, help="tokens per step")
    p.add_argument("--no-prefix-caching", action="store_true")
    add_fp8_arguments(p)
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                   help="load a PEFT LoRA adapter (repeatable)")
    p.add_argument("--adapter", default=None, help="adapter NAME every prompt runs under (None: the base model)")
    p.add_argument("--speculative", action="store_true",
                   help="speculative decoding with n-gram prompt lookup (greedy requests: --temperature 0)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=-1, help="-1 = off")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None, help="prompt i samples with seed + i (None: unseeded)")
    p.add_argument("--tensor-parallel", action="store_true",
                   help="shard the model over the ranks of torchrun (NCCL on CUDA, gloo on CPU); rank 0 prints")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (loading shards, bench) on stderr")
    # also accepted after the subcommand; SUPPRESS keeps the global value when it is not given here
    p.add_argument("--log-level", choices=_LOG_LEVELS, default=argparse.SUPPRESS,
                   help="as the global --log-level (default: WARNING)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m text_generator", description=__doc__.split("\n\n")[0],
                                     formatter_class=_FMT)
    parser.add_argument("--log-level", choices=_LOG_LEVELS, default="WARNING",
                        help="the library's log lines (loguru) on stderr at this level and above")
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text for prompts", formatter_class=_FMT)
    g.add_argument("prompts", nargs="*", help="prompts (text; comma-separated token ids with --token-ids)")
    g.add_argument("--file", help="read prompts from a file, one per line (empty lines skipped)")
    g.add_argument("--max-prompts", type=_int_at_least(1), default=10000,
                   help="refuse more prompts than this (arguments and --file lines together)")
    g.add_argument("--token-ids", action="store_true", help="prompts are comma-separated token ids")
    g.add_argument("--chat", action="store_true",
                   help="each prompt is a user message, rendered with the tokenizer's chat template")
    g.add_argument("--max-new-tokens", type=_int_at_least(1), default=64)
    g.add_argument("--ignore-eos", action="store_true")
    g.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="stop before this text (repeatable)")
    g.add_argument("--logprobs", type=_int_at_least(0), default=None, metavar="N",
                   help="report each token's logprob and the top N alternatives (None: off)")
    g.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                   help="print text as it is generated (None: when stdout is a terminal)")
    g.add_argument("--json", dest="json_lines", action="store_true",
                   help="print one JSON object per prompt (text, token_ids, finish_reason, logprobs)")
    _common(g)
    b = sub.add_parser("bench", help="synthetic throughput / latency benchmark", formatter_class=_FMT)
    b.add_argument("--num-prompts", type=_int_at_least(1), default=64)
    b.add_argument("--input-len", type=_int_at_least(1), default=128)
    b.add_argument("--output-len", type=_int_at_least(1), default=64)
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

    names = [spec.partition("=")[0] for spec in args.lora]
    if args.adapter not in (None, "base", *names):
        raise CLIError(f"--adapter: expected 'base' or a name given with --lora ({names}), got {args.adapter!r}")
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
                                        attention_backend=args.attention_backend, tp_group=tp,
                                        progress=not args.no_progress, quantization=args.quantization)
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


def _max_len(args, gen) -> int:
    """The length limit prompts are checked against: --max-model-len, else the model's own."""
    limit = gen.max_position_embeddings
    if args.max_model_len is not None and args.max_model_len > limit:
        raise CLIError(f"--max-model-len: expected at most the model's max_position_embeddings {limit}, "
                       f"got {args.max_model_len}")
    return args.max_model_len or limit


def _make_engine(args, gen, tok, max_len: int, num_seqs: int):
    """max_len: the longest prompt + output this load needs (the cache is sized for num_seqs of them)."""
    from text_generator.engine import LLMEngine

    drafter = None
    if args.speculative:
        from text_generator.speculative import NgramDrafter

        drafter = NgramDrafter()
        if args.temperature != 0:
            print("note: --speculative drafts for greedy requests only (--temperature 0)", file=sys.stderr)
    max_seq_len = args.max_model_len or min(gen.max_position_embeddings, max_len)
    # the engine sizes the cache when --num-blocks is not given: for this many sequences at most
    return LLMEngine(gen, num_blocks=args.num_blocks, block_size=args.block_size,
                     max_num_seqs=min(num_seqs, args.max_num_seqs),
                     max_num_batched_tokens=args.max_num_batched_tokens,
                     enable_prefix_caching=not args.no_prefix_caching, max_seq_len=max_seq_len, tokenizer=tok,
                     speculative=drafter, kv_cache_dtype=args.kv_cache_dtype)


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


def _params(args, max_new_tokens: int, ignore_eos: bool, **extra):
    from text_generator.sampling import SamplingParams

    try:
        return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                              repetition_penalty=args.repetition_penalty, seed=args.seed,
                              max_new_tokens=max_new_tokens, ignore_eos=ignore_eos, **extra)
    except ValueError as e:
        raise CLIError(str(e)) from None


def cmd_generate(args) -> int:
    from text_generator.cli_printer import OrderedPrinter
    from text_generator.cli_prompts import PromptError, open_prompt_file, read_prompts, to_token_ids

    if args.json_lines and args.stream:
        raise CLIError("--stream and --json: expected one of them (--json prints each prompt's object when it ends)")
    if args.chat and args.token_ids:
        raise CLIError("--chat and --token-ids: expected one of them (--chat renders text with the chat template)")
    if not args.prompts and not args.file:
        raise CLIError("generate: give prompts as arguments or with --file")
    if args.stop and any(not s for s in args.stop):
        raise CLIError("--stop: expected a non-empty text, got ''")
    params = _params(args, args.max_new_tokens, args.ignore_eos, stop=args.stop, logprobs=args.logprobs)
    file = None
    try:
        file = open_prompt_file(args.file) if args.file else None  # a bad path fails before the slow load
        gen, tok = _load_model(args)
        if tok is None and not args.token_ids:
            raise CLIError("generate: this checkpoint has no tokenizer files; pass token ids with --token-ids")
        if tok is None and args.stop:
            raise CLIError("--stop: stop strings need a tokenizer; this checkpoint has none")
        limit = _max_len(args, gen)
        prompts = read_prompts(args.prompts, file, args.file, max_prompts=args.max_prompts,
                               max_line_chars=limit * _CHARS_PER_TOKEN_CAP)
        prompts, ids = to_token_ids(prompts, tok, token_ids=args.token_ids, chat=args.chat, max_len=limit)
    except PromptError as e:
        raise CLIError(str(e)) from None
    finally:
        if file is not None:
            file.close()
    if not ids:
        raise CLIError(f"--file: expected at least one non-empty line in {args.file!r}, got none")
    engine = _make_engine(args, gen, tok, max(map(len, ids)) + args.max_new_tokens, len(ids))
    stream = sys.stdout.isatty() if args.stream is None else args.stream
    shown = ids if args.token_ids else [p.text for p in prompts]
    printer = OrderedPrinter(shown, sys.stdout, stream=stream, json_lines=args.json_lines)
    index = {}
    for i, x in enumerate(ids):
        # one seed per prompt: the same seed would give every prompt the same random stream
        p = params if params.seed is None else dataclasses.replace(params, seed=params.seed + i)
        index[engine.add_request(x, p, adapter=args.adapter)] = i
    failed = False
    while engine.has_unfinished():
        for o in engine.step():
            printer.add(index[o.request_id], o)
            failed |= o.finish_reason == "error"
    return 1 if failed else 0


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
    params = _params(args, args.output_len, True)
    gen, tok = _load_model(args)
    limit = _max_len(args, gen)
    if args.input_len + args.output_len > limit:
        raise CLIError(f"bench: expected --input-len + --output-len <= {limit} (--max-model-len or the model's "
                       f"limit), got {args.input_len} + {args.output_len}")
    engine = _make_engine(args, gen, tok, args.input_len + args.output_len, args.num_prompts)
    rng = random.Random(0 if args.seed is None else args.seed)
    prompts = [[rng.randrange(gen.vocab_size) for _ in range(args.input_len)] for _ in range(args.num_prompts)]
    engine.generate([prompts[0][:8]], dataclasses.replace(params, max_new_tokens=2), use_tqdm=False)
    engine.block_manager.reset_prefix_cache()  # the warm-up must not serve the load from cache
    t0 = time.perf_counter()
    outs = engine.generate(prompts, params, adapters=args.adapter, use_tqdm=not args.no_progress)  # bar on stderr
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


def _setup_logging(level: str) -> None:
    """The library logs through loguru; the CLI shows its lines at `level` and above on stderr
    (read at each write, so a redirected sys.stderr is followed)."""
    from loguru import logger

    logger.remove()
    logger.add(lambda m: sys.stderr.write(m), level=level, colorize=False,
               format="{time:HH:mm:ss} | {level: <7} | {name} | {message}")
def cmd_serve(args) -> int:
    try:
        from text_generator.serve import server
    except ImportError as e:
        raise CLIError(f"serve: expected the serve extra (pip install 'text-generator[serve]'), got {e}") from None
    return server.run(args)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
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

