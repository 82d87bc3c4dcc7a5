"""`text-generator serve MODEL_DIR`: flags -> model, tokenizer, LoRA adapters, engine, app; uvicorn.

build_state(args) does everything but listen (tests call it, then run the app in a thread);
run(args) adds uvicorn. Sizing: --num-blocks, else on CUDA the KV blocks that fit in
--gpu-memory-utilization of the GPU (kv_manager.profile_num_blocks), else on the CPU room for
--max-num-seqs sequences of --max-model-len tokens.
"""

from __future__ import annotations

import json
import os

from text_generator.chat import load_generation_defaults
from text_generator.cli import CLIError
from text_generator.serve.app import ServerState, build_app
from text_generator.serve.engine_loop import EngineLoop
from text_generator.serve.metrics import ServerMetrics


def build_state(args) -> ServerState:
    """args: the parsed `serve` flags (cli.build_parser().parse_args(["serve", MODEL_DIR, ...]))."""
    from text_generator import TextGenerator
    from text_generator.engine import LLMEngine
    from text_generator.tokenizer import load_tokenizer

    _check_flags(args)
    tokenizer = load_tokenizer(args.model_dir)
    if tokenizer is None:
        raise CLIError(f"serve: expected tokenizer files in {args.model_dir}, got none (the server takes text)")
    gen = TextGenerator.from_pretrained(args.model_dir, device=args.device, dtype=args.dtype,
                                        attention_backend=args.attention_backend)
    loras = _parse_loras(args.lora)
    if loras or args.enable_lora:
        ranks = [_adapter_rank(path) for path in loras.values()]
        gen.enable_lora(max_loras=args.max_loras or max(4, len(loras)),
                        max_rank=args.max_lora_rank or max([16, *ranks]))
        for name, path in loras.items():
            gen.load_adapter(name, path)
    max_len = min(args.max_model_len or gen.max_position_embeddings, gen.max_position_embeddings)
    drafter = None
    if args.speculative == "ngram":
        from text_generator.speculative import NgramDrafter

        drafter = NgramDrafter()
    engine = LLMEngine(gen, num_blocks=args.num_blocks or _num_blocks(gen, args, max_len),
                       block_size=args.block_size, max_num_seqs=args.max_num_seqs,
                       max_num_batched_tokens=args.max_num_batched_tokens,
                       enable_prefix_caching=not args.no_prefix_caching, max_seq_len=max_len,
                       tokenizer=tokenizer, speculative=drafter, kv_cache_dtype=args.kv_cache_dtype)
    metrics = ServerMetrics()
    return ServerState(loop=EngineLoop(engine, max_queue=args.max_queue, metrics=metrics),
                       tokenizer=load_tokenizer(args.model_dir),  # the HTTP side's own copy
                       model_name=args.served_model_name or args.model_dir, max_model_len=max_len,
                       vocab_size=gen.vocab_size, defaults=load_generation_defaults(args.model_dir),
                       metrics=metrics, loras=dict(loras))


def run(args) -> int:
    import uvicorn

    state = build_state(args)
    print(f"serving {state.model_names()} at http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(build_app(state), host=args.host, port=args.port, log_level=str(getattr(args, "log_level", "WARNING")).lower())
    return 0


def _check_flags(args) -> None:
    if args.tensor_parallel:
        raise CLIError("--tensor-parallel: serve runs on one device for now (rank 0 serving HTTP with the other "
                       "ranks following its engine is not built); use generate / bench under torchrun")
    if not 0 < args.gpu_memory_utilization <= 1:
        raise CLIError(f"--gpu-memory-utilization: expected a fraction in (0, 1], got {args.gpu_memory_utilization}")
    for flag in ("max_num_seqs", "max_num_batched_tokens", "block_size", "port"):
        if getattr(args, flag) < 1:
            raise CLIError(f"--{flag.replace('_', '-')}: expected an int >= 1, got {getattr(args, flag)}")
    if args.max_queue < 0:
        raise CLIError(f"--max-queue: expected an int >= 0, got {args.max_queue}")
    if args.max_model_len is not None and args.max_model_len < 2:
        raise CLIError(f"--max-model-len: expected an int >= 2, got {args.max_model_len}")
    if args.num_blocks is not None and args.num_blocks < 2:
        raise CLIError(f"--num-blocks: expected an int >= 2, got {args.num_blocks}")


def _parse_loras(specs: list[str]) -> dict[str, str]:
    loras = {}
    for s in specs:
        name, sep, path = s.partition("=")
        if not sep or not name or not path:
            raise CLIError(f"--lora: expected NAME=PATH, got {s!r}")
        if name in loras:
            raise CLIError(f"--lora: expected distinct names, got {name!r} twice")
        loras[name] = path
    return loras


def _adapter_rank(path: str) -> int:
    try:
        with open(os.path.join(path, "adapter_config.json")) as f:
            return int(json.load(f).get("r", 8))
    except (OSError, ValueError) as e:
        raise CLIError(f"--lora: expected a PEFT adapter folder with adapter_config.json, got {path!r} ({e})") from None


def _num_blocks(gen, args, max_len: int) -> int:
    if gen.device.type == "cuda":
        from kv_manager import profile_num_blocks

        return profile_num_blocks(gen.kv_cache_spec_for(args.kv_cache_dtype), args.block_size, device=gen.device,
                                  memory_fraction=args.gpu_memory_utilization, max_seq_len=max_len)
    return -(-max_len // args.block_size) * args.max_num_seqs + 1
