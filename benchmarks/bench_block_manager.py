"""BlockManager throughput: sequences per second through admit + decode appends + free.

    python benchmarks/bench_block_manager.py                  # the committed results, ~1 min
    python benchmarks/bench_block_manager.py --num-seqs 1000  # a quick look

The workload is what a continuous-batching scheduler asks of the block manager, without a
model: 10,000 requests, prompts of 1-4096 tokens (uniform), 1-63 decode tokens each, at most 64
running at once. Half the prompts start with one of 8 shared "system prompts" (256-2048
tokens), so prefix caching has something to find. Per step, every running sequence appends its
decode token and commits it; new requests are admitted while `can_admit` (reserving their decode
tokens) allows, their prompt's slots taken and the prompt committed as the prefill would; a
finished sequence is freed. Every configuration (block size 16 and 128, prefix caching on and
off) runs the same requests. Only BlockManager calls are timed (prompt generation is not):

    seqs/s        num_seqs / time in admit (can_admit + admit + slots + commit), decode (append +
                  commit per token) and free
    block_tables  time of the per-step block_tables() of the running batch, reported apart
    hit           fraction of prompt tokens served from the prefix cache

Prints a table; writes benchmarks/results/block_manager.json, block_manager.md and
block_manager.png (if matplotlib is installed). No peer is measured: the point is that the
manager's cost per step stays far below a forward pass (milliseconds).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from collections import deque

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import pyplot  # noqa: E402
from kv_manager import BlockManager  # noqa: E402

VOCAB = 32000
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def make_workload(num_seqs: int, max_prompt: int, max_decode: int, seed: int) -> dict:
    """Request specs (prompt length, shared prefix or None, decode tokens, token seed); the
    tokens themselves are drawn when a request is admitted, to keep memory small."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    prefixes = [
        torch.randint(0, VOCAB, (rng.randint(256, 2048),), generator=gen).tolist() for _ in range(8)
    ]
    reqs = [
        (
            rng.randint(1, max_prompt),
            rng.randrange(len(prefixes)) if rng.random() < 0.5 else None,
            rng.randint(1, max_decode),
            rng.getrandbits(31),
        )
        for _ in range(num_seqs)
    ]
    return dict(prefixes=prefixes, reqs=reqs)


def prompt_of(workload: dict, i: int) -> list[int]:
    length, prefix, _, seed = workload["reqs"][i]
    head = workload["prefixes"][prefix][:length] if prefix is not None else []
    gen = torch.Generator().manual_seed(seed)
    return head + torch.randint(0, VOCAB, (length - len(head),), generator=gen).tolist()


def run(workload: dict, block_size: int, caching: bool, max_batch: int, max_prompt: int,
        max_decode: int) -> dict:
    # Room for a full batch of the longest requests, plus a quarter more for cached blocks.
    per_seq = -(-(max_prompt + max_decode) // block_size)
    bm = BlockManager(max_batch * per_seq * 5 // 4, block_size, enable_prefix_caching=caching)
    t_admit = t_decode = t_free = t_tables = 0.0
    prompt_tokens = cached_tokens = decode_tokens = steps = 0
    waiting, running = deque(range(len(workload["reqs"]))), {}  # seq -> decode tokens left
    head = None  # the next waiting request's prompt, drawn once even if it waits several steps
    wall = time.perf_counter()
    while waiting or running:
        while waiting and len(running) < max_batch:
            sid = waiting[0]
            head = head or prompt_of(workload, sid)
            left = workload["reqs"][sid][2]
            t = time.perf_counter()
            if not bm.can_admit(head, reserve_tokens=left):
                t_admit += time.perf_counter() - t
                break
            cached = bm.admit(sid, head)
            bm.slots(sid, cached, len(head))
            bm.commit(sid, len(head))
            t_admit += time.perf_counter() - t
            prompt_tokens, cached_tokens = prompt_tokens + len(head), cached_tokens + cached
            running[sid] = left
            waiting.popleft()
            head = None
        t = time.perf_counter()
        bm.block_tables(list(running))
        t_tables += time.perf_counter() - t
        t = time.perf_counter()
        for sid in running:
            bm.append(sid, [sid % VOCAB])
            bm.commit(sid, bm.num_tokens(sid))
        t_decode += time.perf_counter() - t
        decode_tokens += len(running)
        steps += 1
        done = [sid for sid, left in running.items() if left == 1]
        for sid in running:
            running[sid] -= 1
        t = time.perf_counter()
        for sid in done:
            bm.free(sid)
        t_free += time.perf_counter() - t
        for sid in done:
            del running[sid]
    n = len(workload["reqs"])
    assert bm.num_used_blocks == 0
    return dict(
        block_size=block_size,
        prefix_caching=caching,
        num_blocks=bm.num_blocks,
        seqs_per_s=n / (t_admit + t_decode + t_free),
        admit_us=1e6 * t_admit / n,
        decode_us_per_token=1e6 * t_decode / decode_tokens,
        free_us=1e6 * t_free / n,
        block_tables_us_per_step=1e6 * t_tables / steps,
        hit_rate=cached_tokens / prompt_tokens,
        steps=steps,
        wall_s=time.perf_counter() - wall,
    )


def table(rows: list[dict]) -> str:
    lines = [
        "| block_size | prefix caching | seqs/s | admit µs | decode µs/token | free µs "
        "| block_tables µs/step | hit |",
        "|---:|:---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['block_size']} | {'on' if r['prefix_caching'] else 'off'} "
            f"| {r['seqs_per_s']:,.0f} | {r['admit_us']:.0f} | {r['decode_us_per_token']:.1f} "
            f"| {r['free_us']:.1f} | {r['block_tables_us_per_step']:.0f} | {r['hit_rate']:.0%} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: str, title: str) -> None:
    plt = pyplot()
    if plt is None:
        return
    sizes = list(dict.fromkeys(r["block_size"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for k, caching in enumerate((False, True)):
        pick = [next(r for r in rows if r["block_size"] == s and r["prefix_caching"] == caching)
                for s in sizes]
        label = f"prefix caching {'on' if caching else 'off'}"
        x = [i + 0.4 * k for i in range(len(sizes))]
        axes[0].bar(x, [r["seqs_per_s"] for r in pick], 0.4, label=label)
        axes[1].bar(x, [r["admit_us"] for r in pick], 0.4, label=label)
    for ax, ylabel in ((axes[0], "sequences / s (admit + decode + free)"),
                       (axes[1], "µs per admit (incl. slots + commit)")):
        ax.set_xticks([i + 0.2 for i in range(len(sizes))], [f"block_size {s}" for s in sizes])
        ax.set_ylabel(ylabel)
        ax.legend()
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-seqs", type=int, default=10_000)
    ap.add_argument("--block-sizes", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--max-prompt", type=int, default=4096)
    ap.add_argument("--max-decode", type=int, default=63)
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(RESULTS, "block_manager.json"))
    args = ap.parse_args(argv)

    workload = make_workload(args.num_seqs, args.max_prompt, args.max_decode, args.seed)
    rows = []
    for bs in args.block_sizes:
        for caching in (False, True):
            rows.append(run(workload, bs, caching, args.max_batch, args.max_prompt, args.max_decode))
            r = rows[-1]
            print(f"block_size {bs:4d} caching {'on ' if caching else 'off'}: "
                  f"{r['seqs_per_s']:,.0f} seqs/s, hit {r['hit_rate']:.0%}, wall {r['wall_s']:.1f} s")
    md_table = table(rows)
    print(md_table)

    command = "python benchmarks/bench_block_manager.py" + (" " + " ".join(argv or sys.argv[1:])).rstrip()
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = dict(command=command, machine=machine,
                  args=dict(vars(args), out=os.path.relpath(args.out, root)), rows=rows)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    stem = args.out[: -len(".json")]
    with open(stem + ".md", "w") as f:
        f.write(
            "## Block manager throughput\n\n"
            f"`{command}` ({machine}; one Python thread).\n\n"
            f"{args.num_seqs:,} requests, prompts of 1-{args.max_prompt} tokens, 1-{args.max_decode} "
            f"decode tokens, at most {args.max_batch} running; half the prompts share one of 8 "
            "system prompts (256-2048 tokens). seqs/s counts the time in admit (can_admit + admit "
            "+ prompt slots + commit), per-token append + commit, and free; block_tables is the "
            "per-step table of the running batch; hit is the share of prompt tokens served from "
            "the prefix cache. Details in the script's docstring.\n\n"
            f"{md_table}\n\n"
            "Prefix caching costs admission time here: committing a prompt hashes each of its "
            "full blocks (a tuple of block_size tokens and a dict entry), and what the hits "
            "save is forward-pass compute, which this benchmark does not run. block_tables "
            "grows with batch x blocks per sequence, hence 5x more at block_size 16 than 128.\n"
        )
    print(f"wrote {args.out} and {stem}.md")
    plot(rows, stem + ".png", f"BlockManager, {args.num_seqs:,} requests ({machine})")


if __name__ == "__main__":
    main()
