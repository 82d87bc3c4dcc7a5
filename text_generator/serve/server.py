"""`text-generator serve MODEL_DIR`: flags -> the engine process (model, LoRA adapters, engine:
engine_worker.build_engine), the HTTP side's tokenizer and state, the app; uvicorn.

build_state(args) does everything but listen (tests call it, then run the app in a thread);
run(args) adds uvicorn. Sizing: --num-blocks, else on CUDA the KV blocks that fit in
--gpu-memory-utilization of the GPU (kv_manager.profile_num_blocks), else on the CPU room for
--max-num-seqs sequences of --max-model-len tokens.
"""

from __future__ import annotations

import os

from text_generator.chat import load_generation_defaults
from text_generator.cli import CLIError
from text_generator.serve.app import ServerState, build_app
from text_generator.serve.engine_client import EngineClient
from text_generator.serve.engine_worker import adapter_rank
from text_generator.serve.metrics import ServerMetrics
from text_generator.serve.profiling import profiled


def build_state(args, on_start=None) -> ServerState:
    """args: the parsed `serve` flags (cli.build_parser().parse_args(["serve", MODEL_DIR, ...])).
    Starts the engine process and waits until its engine is built; on_start(engine): a picklable
    function the engine process runs then (EngineClient)."""
    from text_generator.tokenizer import load_tokenizer

    _check_flags(args)
    tokenizer = load_tokenizer(args.model_dir)  # the HTTP side's copy; the engine process loads its own
    if tokenizer is None:
        raise CLIError(f"serve: expected tokenizer files in {args.model_dir}, got none (the server takes text)")
    loras = _parse_loras(args.lora)
    metrics = ServerMetrics()
    client = EngineClient(args, max_queue=args.max_queue, metrics=metrics, on_start=on_start)
    try:
        info = client.start()
    except RuntimeError as e:
        raise CLIError(f"serve: {e}") from None
    return ServerState(engine=client, tokenizer=tokenizer, model_name=args.served_model_name or args.model_dir,
                       max_model_len=info["max_model_len"], vocab_size=info["vocab_size"],
                       defaults=load_generation_defaults(args.model_dir), metrics=metrics, loras=dict(loras))


def run(args) -> int:
    """Serve until stopped. Under torchrun (--tensor-parallel) rank 0 serves HTTP (its engine
    process is rank 0 of the process group) and the other ranks follow its engine."""
    import uvicorn

    if args.tensor_parallel and os.environ.get("RANK", "0") != "0":
        _check_flags(args)
        from text_generator.serve.engine_worker import follow

        return follow(args)
    state = build_state(args)
    import gc

    # everything built so far (torch, transformers, the app) lives as long as the process: out of
    # the collector's sight, a full collection no longer walks it while streams wait
    gc.collect()
    gc.freeze()
    print(f"serving {state.model_names()} at http://{args.host}:{args.port}/v1", flush=True)
    profiled("http", uvicorn.run, build_app(state), host=args.host, port=args.port,
             log_level=str(getattr(args, "log_level", "WARNING")).lower())
    return 0


def _check_flags(args) -> None:
    if args.tensor_parallel and "WORLD_SIZE" not in os.environ:
        raise CLIError("--tensor-parallel: expected to run under torchrun (torchrun --nproc-per-node N "
                       "-m text_generator serve ... --tensor-parallel), got no WORLD_SIZE in the environment")
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
        return adapter_rank(path)
    except (OSError, ValueError) as e:
        raise CLIError(f"--lora: expected a PEFT adapter folder with adapter_config.json, got {path!r} ({e})") from None
