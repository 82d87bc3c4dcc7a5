"""Dump forward_tensor logits of fixed tiny checkpoints, with and without LoRA, for bit-exact A/B.

Not a test: a refactoring aid. Run it on the old code with --out ref.pt, then after each change
with --out new.pt --compare ref.pt; it prints every case that differs in a single bit.

    python tests/tools/dump_logits_lora.py --out /tmp/ref.pt
    python tests/tools/dump_logits_lora.py --out /tmp/new.pt --compare /tmp/ref.pt [--no-tp]

Cases (CPU, torch backend): per family (llama, mistral, qwen2, qwen3, a llama with biases on
every projection, a bf16 qwen3) a batched prefill, a single-token decode and a 3-token decode of
four requests, once on the base model and once with a mixed-adapter batch (two PEFT adapters of
different ranks and targets, and base rows in between); and the same LoRA scenario on two gloo
ranks of tensor parallelism (rank 0's logits). Checkpoints and adapters are random but seeded,
so two runs build the same weights.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, os.path.join(_TESTS, "adapters"))  # tests/adapters/: test_lora
sys.path.insert(0, _TESTS)  # tests/: conftest
# the worktree's packages, first: tests/adapters/ (no __init__.py) must not pass for the adapters package
sys.path.insert(0, os.path.join(_TESTS, ".."))

from conftest import PagedHarness, make_checkpoint  # noqa: E402
from test_lora import make_adapter  # noqa: E402
from text_generator import TextGenerator  # noqa: E402

CASES = {  # name -> (family, dtype, checkpoint overrides)
    "llama": ("llama", torch.float32, {}),
    "mistral": ("mistral", torch.float32, {}),
    "qwen2": ("qwen2", torch.float32, {}),
    "qwen3": ("qwen3", torch.float32, {}),
    "llama_biases": ("llama", torch.float32, dict(attention_bias=True, mlp_bias=True)),
    "qwen3_bf16": ("qwen3", torch.bfloat16, {}),
}
ADAPTERS = {
    "all": dict(r=4, lora_alpha=6, target_modules="all-linear", use_rslora=True, rank_pattern={"o_proj": 8}),
    "some": dict(r=2, lora_alpha=4, target_modules=["k_proj", "o_proj", "up_proj", "down_proj"]),
}
REQUESTS = [("all", 5), (None, 4), ("some", 6), ("all", 3)]  # (adapter, prompt length)
DECODES = [1, 3]  # new tokens per request in each decode step after the prefill


def build(root: str) -> dict:
    """name -> (checkpoint folder, dtype, {adapter: folder}), all seeded."""
    made = {}
    for name, (family, dtype, overrides) in CASES.items():
        path = make_checkpoint(os.path.join(root, name), family, torch.float32, seed=0, **overrides)
        dirs = {}
        for seed, (a, cfg) in enumerate(ADAPTERS.items()):
            dirs[a] = os.path.join(root, f"{name}_{a}")
            make_adapter(path, dirs[a], seed + 1, **cfg)
        made[name] = (path, dtype, dirs)
    return made


def scenario(gen, lora: bool) -> list[torch.Tensor]:
    """Prefill then DECODES for REQUESTS; -> each step's logits."""
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 96, (n + sum(DECODES),), generator=g).tolist() for _, n in REQUESTS]
    kw = dict(adapter_ids=[a for a, _ in REQUESTS]) if lora else {}
    h = PagedHarness(gen, num_blocks=48, block_size=4)
    lens = [n for _, n in REQUESTS]
    outs = [h.step({i: s[:lens[i]] for i, s in enumerate(seqs)}, is_prefill=True, **kw)]
    for q in DECODES:
        outs.append(h.step({i: s[lens[i]:lens[i] + q] for i, s in enumerate(seqs)}, is_prefill=False, **kw))
        lens = [n + q for n in lens]
    return outs


def load(path, dtype, dirs, tp=None):
    gen = TextGenerator.from_pretrained(path, device="cpu", dtype=dtype, attention_backend="torch", tp_group=tp)
    return gen


def run_single(made: dict) -> dict:
    out = {}
    for name, (path, dtype, dirs) in made.items():
        out[f"{name}/base"] = scenario(load(path, dtype, dirs), lora=False)
        gen = load(path, dtype, dirs)
        gen.enable_lora(max_loras=2, max_rank=8)
        for a, d in dirs.items():
            gen.load_adapter(a, d)
        out[f"{name}/lora"] = scenario(gen, lora=True)
    return out


def _tp_worker(rank, store, made, out_file):
    from model_wrapper import TPGroup

    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        tp = TPGroup.from_default_group()
        out = {}
        for name in ("llama_biases", "qwen3"):
            path, dtype, dirs = made[name]
            out[f"tp2/{name}/base"] = scenario(load(path, dtype, dirs, tp), lora=False)
            gen = load(path, dtype, dirs, tp)
            gen.enable_lora(max_loras=2, max_rank=8)
            for a, d in dirs.items():
                gen.load_adapter(a, d)
            out[f"tp2/{name}/lora"] = scenario(gen, lora=True)
        if rank == 0:
            torch.save(out, out_file)
    finally:
        dist.destroy_process_group()


def run_tp(made: dict, root: str) -> dict:
    out_file = os.path.join(root, "tp2.pt")
    mp.spawn(_tp_worker, args=(os.path.join(root, "store"), made, out_file), nprocs=2, join=True)
    return torch.load(out_file)


def compare(new: dict, ref: dict) -> int:
    bad = 0
    for key in sorted(set(ref) | set(new)):
        if key not in new or key not in ref:
            print(f"MISSING {key}")
            bad += 1
            continue
        for step, (a, b) in enumerate(zip(new[key], ref[key])):
            if not torch.equal(a, b):
                print(f"DIFF {key} step {step}: max |diff| {float((a - b).abs().max()):.3e}")
                bad += 1
    print(f"{len(ref)} cases compared, {bad} differ")
    return bad


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--compare", default=None)
    p.add_argument("--no-tp", action="store_true", help="skip the two-rank tensor-parallel cases")
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        made = build(root)
        out = run_single(made)
        if not args.no_tp:
            out.update(run_tp(made, root))
    torch.save(out, args.out)
    print(f"saved {len(out)} cases to {args.out}")
    if args.compare:
        ref = torch.load(args.compare)
        if args.no_tp:
            ref = {k: v for k, v in ref.items() if not k.startswith("tp2/")}
        return 1 if compare(out, ref) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
