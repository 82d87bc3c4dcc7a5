"""The `serve` subcommand's flags (argparse only: the CLI builds its parser without the serve extra)."""

from __future__ import annotations

import argparse


def add_fp8_arguments(p: argparse.ArgumentParser) -> None:
    """--quantization and --kv-cache-dtype, the same for generate / bench (cli.py) and serve."""
    p.add_argument("--quantization", default=None, choices=("fp8",),
                   help="none: the checkpoint as it is; fp8: a bf16 / fp16 / fp32 checkpoint's projections "
                   "and experts quantized to block FP8 at load (e4m3, a scale per 128 x 128 block; not "
                   "lm_head, embeddings, routers); an fp8 checkpoint loads as it is")
    p.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "fp8", "fp8_e4m3"),
                   help="auto: the model's dtype; fp8 (= fp8_e4m3): an e4m3 KV cache (half the bytes per token)")


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model_dir", metavar="MODEL_DIR", help="local checkpoint folder (with its tokenizer)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="the name clients pass as \"model\" (default: MODEL_DIR)")
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PATH",
                   help="serve a PEFT LoRA adapter as model NAME (repeatable)")
    p.add_argument("--enable-lora", action="store_true",
                   help="reserve adapter slots for /v1/load_lora_adapter even without --lora")
    p.add_argument("--max-loras", type=int, default=None, help="adapter slots (default: max(4, number of --lora))")
    p.add_argument("--max-lora-rank", type=int, default=None,
                   help="largest adapter rank (default: max(16, the --lora adapters' ranks))")
    p.add_argument("--max-num-seqs", type=int, default=64, help="requests in the running batch at most")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests that may wait beyond --max-num-seqs; more are refused with 503")
    p.add_argument("--max-model-len", type=int, default=None, help="prompt + output tokens at most "
                   "(default: the model's max_position_embeddings)")
    p.add_argument("--num-blocks", type=int, default=None, help="KV blocks (default: --gpu-memory-utilization "
                   "of the GPU on CUDA; max-num-seqs full-length sequences on CPU)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="on CUDA, the fraction of GPU memory the model and KV cache may use")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--no-warmup", action="store_true",
                   help="on CUDA, skip the start-up pass that captures every decode-graph batch size and compiles "
                   "the kernels before the server answers /health (the first requests then pay for it)")
    p.add_argument("--dtype", default=None, help="float32 / bfloat16 / float16 (default: the checkpoint's)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--attention-backend", default="auto", choices=("auto", "torch", "flashinfer"))
    add_fp8_arguments(p)
    p.add_argument("--speculative", default=None, choices=("ngram",),
                   help="speculative decoding of greedy requests: ngram = prompt lookup")
    p.add_argument("--tensor-parallel", action="store_true",
                   help="shard the model over the ranks of torchrun (torchrun --nproc-per-node N -m text_generator "
                   "serve ... --tensor-parallel): rank 0 serves HTTP, every rank steps the engine in lockstep")
