"""The cost of a multi-token step against a decode step, and of a mixed step against its GPU time.

On a Llama-3-8B-shaped model with random bf16 weights (benchmarks.common.random_text_generator),
every request holding --ctx cached tokens:

  verify    a step of q = 2, 4, 8 new tokens per request (a causal chain; at q = 8 also a
            spec_mask tree) at batch 1, 8, 32, against a decode step (q = 1) at the same batch,
            each with CUDA graphs (decode graphs; verify graphs of model_wrapper/cuda_graph.py)
            and eagerly (graphs off). Target: a graphed verify step of q <= 8 at batch 1 within
            1.15x of a graphed decode step. --repeats rounds over the rows (medians reported);
            --gemv-max-tokens adds graphed rounds with other GEMV bounds (a 2-token step: the GEMV
            or the skinny GEMM).
  mixed     8 decode requests plus one prefill chunk of 64 / 256 / 1024 tokens (after --ctx
            tokens of its own), one logit row per request (as the engine asks; --lora N: the
            requests on N random LoRA adapters), replaying the
            mixed-step graphs (model_wrapper/mixed_graph.py) and eagerly (FlashInfer's kernels):
            the wall time of a step against its GPU time alone (the sum of its kernels' device
            times from torch.profiler), and the graphed wall time against the eager GPU time.
            Target: wall <= 1.1x GPU time. --mixed-block-rows adds graphed rows for other
            KernelConfig.mixed_block_rows values (the prefill attention's tile).

Wall time is the mean over --iters back-to-back forward_tensor calls after a warm-up, the host
preparing the next step while the GPU runs the last (as a serving loop does), with one
synchronize at the end. The verify graphs and decode graphs are captured during the warm-up.

    python benchmarks/bench_verify.py                        # CUDA, Llama-3-8B shape
    python benchmarks/bench_verify.py --device cpu --tiny    # smoke test of the script itself
    python benchmarks/bench_verify.py --mixed-only --chunks 16,64,256,1024,2000
    python benchmarks/bench_verify.py --chunks "" --repeats 3 --no-eager --gemv-max-tokens 1

Prints a table; writes --out (JSON) and the same name .png (if matplotlib is installed).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import LLAMA3_8B, pyplot, random_text_generator, tiny  # noqa: E402
from text_generator.speculative import DraftTree  # noqa: E402


class Steps:
    """Requests laid out in one cache: request r owns pages r * per .. (r + 1) * per - 1, holding ctx
    cached tokens (their K/V is whatever the cache holds: the cost does not depend on it)."""

    def __init__(self, gen, batch: int, ctx: int, extra: int, block_size: int):
        self.gen, self.ctx, self.bs = gen, ctx, block_size
        self.per = -(-(ctx + extra) // block_size)
        self.kv = gen.allocate_kv_cache(batch * self.per + 1, block_size)
        self.tables = torch.arange(batch * self.per, dtype=torch.int32).view(batch, self.per)

    def slots(self, r: int, start: int, n: int) -> torch.Tensor:
        pos = torch.arange(start, start + n)
        return self.tables[r, pos // self.bs].to(torch.int64) * self.bs + pos % self.bs

    def args(self, q_lens: list[int], prefixes: list[int], tree: bool = False, is_prefill: bool = False):
        """forward_tensor's arguments for requests 0..len(q_lens)-1 bringing q_lens[r] tokens after
        prefixes[r] cached ones (tree: a binary tree as spec_mask, positions by depth)."""
        ids, pos, slots, masks = [], [], [], []
        max_q = max(q_lens)
        for r, (q, p) in enumerate(zip(q_lens, prefixes)):
            ids.append(torch.randint(0, self.gen.vocab_size, (q,)))
            parents = [-1] + [(i - 1) // 2 for i in range(1, q)] if tree else list(range(-1, q - 1))
            draft = DraftTree(ids[-1].tolist(), parents)
            m = torch.zeros(q, max_q, dtype=torch.bool)
            m[:, :q] = draft.mask()
            pos.append(p + torch.tensor(draft.depths()))
            slots.append(self.slots(r, p, q))
            masks.append(m)
        B = len(q_lens)
        kw = dict(q_lens=q_lens)
        if tree:
            kw["spec_mask"] = torch.cat(masks)
        lens = torch.tensor([p + q for p, q in zip(prefixes, q_lens)], dtype=torch.int32)
        return (torch.cat(ids), torch.cat(pos), is_prefill, self.kv, self.tables[:B], torch.cat(slots), lens,
                self.ctx + self.per * self.bs), kw


@contextlib.contextmanager
def graphs(gen, on: bool):
    """Run with the wrapper's CUDA graphs (decode and verify) or without any."""
    mw = gen.model_wrapper
    runner = mw.graphs
    if not on:
        mw.graphs = None
    try:
        yield
    finally:
        mw.graphs = runner


def wall_ms(gen, args, kw, iters: int, sync) -> float:
    for _ in range(3):
        gen.forward_tensor(*args, **kw)
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        gen.forward_tensor(*args, **kw)
    sync()
    return (time.perf_counter() - t0) / iters * 1e3


def gpu_ms(gen, args, kw, iters: int) -> float | None:
    """The sum of the step's kernels' device times (torch.profiler), per step; None on the CPU."""
    if not torch.cuda.is_available() or gen.model_wrapper.device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            gen.forward_tensor(*args, **kw)
        torch.cuda.synchronize()
    total = 0.0
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            total += evt.device_time_total if hasattr(evt, "device_time_total") else evt.cuda_time_total
    return total / iters / 1e3


def host_ms(gen, args, kw, iters: int, sync) -> float:
    """The host time of one forward_tensor call alone: the device idle before each call (nothing to
    wait for), the call's return timed (a graph replay or the eager kernels are only launched)."""
    total = 0.0
    for _ in range(iters):
        sync()
        t0 = time.perf_counter()
        gen.forward_tensor(*args, **kw)
        total += time.perf_counter() - t0
    sync()
    return total / iters * 1e3


def profile_host(gen, args, kw, sync, top: int = 25) -> None:
    """cProfile of 20 calls of the step (prints the functions of most cumulative time)."""
    import cProfile
    import pstats

    gen.forward_tensor(*args, **kw)
    sync()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        gen.forward_tensor(*args, **kw)
        sync()
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(top)


def replay_ms(gen, args, kw, iters: int) -> float | None:
    """The device time of the mixed graph the step replays, between CUDA events around back-to-back
    replays of that graph alone (its inputs as the last call left them): a check on the profiler's sum
    of kernel times. None where the step did not replay a mixed graph."""
    runner = gen.model_wrapper.graphs
    batch = _batch_of(gen, args, kw)
    if runner is None or runner._route(batch, args[3]) != "mixed":
        return None
    gen.forward_tensor(*args, **kw)
    graph = runner.mixed._graphs[runner.mixed.bucket_for(batch.num_tokens, max(batch.batch_size,
                                                                              len(kw["lm_head_indices"])))].graph
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a tiny model (smoke test)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--qs", default="2,4,8")
    ap.add_argument("--chunks", default="64,256,1024", help="mixed rows' chunks ('' for none)")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=1,
                    help="verify rows: rounds over every row (each row's median is reported)")
    ap.add_argument("--no-eager", action="store_true", help="verify rows: graphed only")
    ap.add_argument("--gemv-max-tokens", default="",
                    help="verify rows: extra graphed rounds with these KernelConfig.gemv_max_tokens values "
                         "(e.g. 1: a 2-token step on the skinny GEMM instead of the GEMV)")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--mixed-only", action="store_true", help="only the mixed rows")
    ap.add_argument("--mixed-block-rows", default="", help="extra mixed_block_rows values for graphed mixed rows")
    ap.add_argument("--profile-host", type=int, default=0, help="cProfile the graphed mixed step of this chunk")
    ap.add_argument("--lora", type=int, default=0,
                    help="mixed rows: the requests on this many random rank-16 LoRA adapters (round robin)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "verify.json"))
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    if not cuda:
        torch.set_num_threads(1)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cfg = tiny(LLAMA3_8B) if args.tiny else LLAMA3_8B
    if args.tiny:  # ctx + the largest chunk within the tiny model's 2048 positions
        args.ctx = min(args.ctx, 128)
    gen = random_text_generator(cfg, device=args.device, dtype=torch.bfloat16 if cuda else torch.float32)
    if args.lora:
        from benchmarks.bench_lora import random_adapter

        manager = gen.enable_lora(max_loras=max(4, args.lora), max_rank=16)
        for i in range(args.lora):
            manager.add_adapter(random_adapter(f"a{i}", manager, 16, gen.model_wrapper.device))
    batches = [int(x) for x in args.batches.split(",")]
    qs = [int(x) for x in args.qs.split(",")]
    chunks = [int(x) for x in args.chunks.split(",") if x]
    torch.manual_seed(0)
    modes = (True, False) if gen.model_wrapper.graphs is not None else (False,)
    print(f"device={torch.cuda.get_device_name() if cuda else 'cpu'} model={'tiny' if args.tiny else 'Llama-3-8B-shaped'} "
          f"ctx={args.ctx} block_size={args.block_size}")
    verify = [] if args.mixed_only else verify_rows(gen, args, batches, qs, modes, sync)
    mixed = mixed_rows(gen, args, chunks, modes, sync)
    result = dict(device=torch.cuda.get_device_name() if cuda else "cpu",
                  model="tiny" if args.tiny else "Llama-3-8B-shaped (random)", ctx=args.ctx, lora_adapters=args.lora,
                  block_size=args.block_size, iters=args.iters,
                  kernel_config=dataclasses.asdict(gen.model_wrapper.kernel_config), verify=verify, mixed=mixed)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {args.out}")
    plot(result, args.out[: -len(".json")] + ".png")


def verify_rows(gen, args, batches, qs, modes, sync) -> list[dict]:
    """Per batch: a decode step, chains of each q and a tree of the largest, graphed and eager (not
    with --no-eager), then graphed with each --gemv-max-tokens value; per variant --repeats rounds
    over its rows (a slow stretch of the machine hits every row alike), each row's median ms (and
    every round's) reported, over the same variant's decode step."""
    mw = gen.model_wrapper
    base_cfg = mw.kernel_config
    variants = [(on, None) for on in modes if on or not args.no_eager]
    variants += [(True, int(x)) for x in args.gemv_max_tokens.split(",") if x and True in modes]
    steps = [(1, False)] + [(q, False) for q in qs] + [(max(qs), True)]
    rows = []
    print(f"{'batch':>5s} {'q':>3s} {'kind':>5s} {'graphs':>6s} {'gemv<=':>6s} {'ms':>8s} {'/decode':>8s} "
          f"{'replayed':>9s}  rounds ms")
    for B in batches:
        st = Steps(gen, B, args.ctx, max(qs) + 1, args.block_size)
        samples = {}
        for on, gemv in variants:  # (a new KernelConfig drops the graphs: one variant at a time)
            if gemv is not None:
                mw.set_kernel_config(dataclasses.replace(base_cfg, gemv_max_tokens=gemv))
            with graphs(gen, on):
                for _ in range(args.repeats):
                    for q, tree in steps:
                        a, kw = st.args([q] * B, [args.ctx] * B, tree=tree)
                        ms = wall_ms(gen, a, kw, args.iters, sync)
                        runner = mw.graphs
                        replayed = runner is not None and runner.can_run(_batch_of(gen, a, kw), a[3])
                        samples.setdefault((on, gemv, q, tree), ([], replayed))[0].append(ms)
            if gemv is not None:
                mw.set_kernel_config(base_cfg)
        for on, gemv in variants:
            base = statistics.median(samples[(on, gemv, 1, False)][0])
            for q, tree in steps:
                runs, replayed = samples[(on, gemv, q, tree)]
                ms = statistics.median(runs)
                row = dict(batch=B, q=q, kind="tree" if tree else "chain", graphs=on,
                           gemv_max_tokens=base_cfg.gemv_max_tokens if gemv is None else gemv, ms=ms,
                           vs_decode=ms / base, replayed=replayed, rounds_ms=runs)
                rows.append(row)
                print(f"{B:5d} {q:3d} {row['kind']:>5s} {str(on):>6s} {row['gemv_max_tokens']:6d} {ms:8.3f} "
                      f"{ms / base:7.2f}x {str(replayed):>9s}  {' '.join(f'{x:.3f}' for x in runs)}")
        del st
    return rows


def mixed_rows(gen, args, chunks, modes, sync, decodes: int = 8) -> list[dict]:
    """Per chunk: the mixed step graphed (default KernelConfig, then each --mixed-block-rows value) and
    eager; wall and GPU ms, wall / GPU, and wall / the eager step's GPU ms."""
    mw = gen.model_wrapper
    base_cfg = mw.kernel_config
    extra = [int(x) for x in args.mixed_block_rows.split(",") if x]
    variants = [(on, None) for on in modes] + [(True, r) for r in extra if True in modes]
    rows = []
    print(f"\n{'decodes':>7s} {'chunk':>6s} {'graphs':>6s} {'rows':>5s} {'wall ms':>8s} {'gpu ms':>8s} "
          f"{'wall/gpu':>9s} {'/eager gpu':>10s} {'replayed':>9s} {'replay ms':>9s} {'host ms':>8s}")
    for c in chunks:
        st = Steps(gen, decodes + 1, args.ctx, c + 1, args.block_size)
        q = [1] * decodes + [c]
        a, kw = st.args(q, [args.ctx] * (decodes + 1), is_prefill=True)
        kw["lm_head_indices"] = torch.cumsum(torch.tensor(q), 0) - 1  # one logit row per request
        if args.lora:
            kw["adapter_ids"] = [f"a{r % args.lora}" for r in range(decodes + 1)]
        done = []
        for on, block_rows in variants:
            if block_rows is not None:
                mw.set_kernel_config(dataclasses.replace(base_cfg, mixed_block_rows=block_rows))
            with graphs(gen, on):
                wall = wall_ms(gen, a, kw, args.iters, sync)
                gpu = gpu_ms(gen, a, kw, min(args.iters, 20))
                runner = mw.graphs
                replayed = runner is not None and runner.can_run(_batch_of(gen, a, kw), a[3])
                replay = replay_ms(gen, a, kw, args.iters) if replayed and sync is torch.cuda.synchronize else None
                host = host_ms(gen, a, kw, min(args.iters, 20), sync)
                if on and block_rows is None and c == args.profile_host:
                    profile_host(gen, a, kw, sync)
            if block_rows is not None:
                mw.set_kernel_config(base_cfg)
            done.append(dict(decodes=decodes, chunk=c, graphs=on, tokens=sum(q), replayed=replayed,
                             block_rows=block_rows if block_rows is not None else base_cfg.mixed_block_rows,
                             wall_ms=wall, gpu_ms=gpu, wall_over_gpu=None if gpu is None else wall / gpu,
                             replay_ms=replay, host_ms=host))
        eager_gpu = next((r["gpu_ms"] for r in done if not r["graphs"]), None)
        for r in done:
            r["wall_over_eager_gpu"] = None if eager_gpu is None or r["gpu_ms"] is None else r["wall_ms"] / eager_gpu
            fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
            print(f"{decodes:7d} {c:6d} {str(r['graphs']):>6s} {r['block_rows']:5d} {r['wall_ms']:8.3f} "
                  f"{fmt(r['gpu_ms'], '8.3f'):>8s} {fmt(r['wall_over_gpu'], '8.2f'):>8s}x "
                  f"{fmt(r['wall_over_eager_gpu'], '9.2f'):>9s}x {str(r['replayed']):>9s} "
                  f"{fmt(r['replay_ms'], '8.3f'):>8s} {r['host_ms']:8.3f}")
        rows += done
        del st
    return rows


def _batch_of(gen, args, kw):
    """The step's ForwardBatch as forward_tensor builds it (for the runner's can_run: did it replay?)."""
    from model_wrapper.forward_batch import ForwardBatch

    ids, pos, is_prefill, kv, tables, slots, lens, _ = args
    q = torch.tensor(kw["q_lens"], dtype=torch.int32)
    return ForwardBatch.build(input_ids=ids, input_ids_cpu=ids, positions=pos, slots=slots, is_prefill=is_prefill,
                              block_size=kv[0][0].shape[1], q_lens_cpu=q, seq_lens_cpu=lens, block_tables_cpu=tables,
                              lm_head_indices=kw.get("lm_head_indices"), spec_mask=kw.get("spec_mask"), atten_mask=None,
                              device=torch.device("cpu"))


def _graph_gpu(row) -> float:
    if row is None:
        return 0.0
    return row["replay_ms"] if row.get("replay_ms") is not None else row["gpu_ms"]


def plot(result, path):
    plt = pyplot()
    if plt is None:
        return
    panels = (["verify"] if result["verify"] else []) + (["mixed"] if result["mixed"] else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(max(9, 6 * len(panels)), 4.5), squeeze=False)
    axes = dict(zip(panels, axes[0]))
    ax = axes.get("verify")
    for on in (True, False) if ax is not None else ():
        for kind in ("chain", "tree"):
            for B in sorted({r["batch"] for r in result["verify"]}):
                rows = [r for r in result["verify"] if r["graphs"] == on and r["batch"] == B
                        and r.get("gemv_max_tokens") == result["kernel_config"]["gemv_max_tokens"]
                        and (r["kind"] == kind or r["q"] == 1)]
                if kind == "tree" and len(rows) < 2:
                    continue
                ax.plot([r["q"] for r in rows], [r["ms"] for r in rows], "o-" if on else "x--",
                        label=f"batch {B}, {'graphs' if on else 'eager'}{', tree' if kind == 'tree' else ''}")
    if ax is not None:
        ax.set_xlabel("new tokens per request (1 = decode)")
        ax.set_ylabel("ms per step")
        ax.legend(fontsize=7)
    ax = axes.get("mixed")
    m = [r for r in result["mixed"] if r["gpu_ms"] is not None]
    default_rows = result["kernel_config"]["mixed_block_rows"]
    eager = [r for r in m if not r["graphs"]]
    graphed = {r["chunk"]: r for r in m if r["graphs"] and r["block_rows"] == default_rows}
    if eager and ax is not None:
        x = range(len(eager))
        bars = [("eager wall", [r["wall_ms"] for r in eager]), ("eager GPU (FlashInfer)", [r["gpu_ms"] for r in eager]),
                ("graphed wall", [graphed[r["chunk"]]["wall_ms"] if r["chunk"] in graphed else 0 for r in eager]),
                # a graph's GPU time: its replay between CUDA events (the profiler's sum counts PDL waits)
                ("graphed GPU (replay)", [_graph_gpu(graphed.get(r["chunk"])) for r in eager])]
        for k, (label, ys) in enumerate(bars):
            ax.bar([i - 0.3 + 0.2 * k for i in x], ys, 0.2, label=label)
        ax.set_xticks(list(x), [f"{r['decodes']} dec + {r['chunk']}" for r in eager])
        ax.set_ylabel("ms per step")
        ax.legend(fontsize=8)
    fig.suptitle(f"{' and '.join(panels)} steps ({result['model']}, {result['device']}, ctx {result['ctx']})",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
