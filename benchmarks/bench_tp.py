"""Tensor parallelism (issues 8, 28): forward_tensor at TP=1 and at TP=N on one host, per model, in one run.

    source .gpu/device-setup.sh && NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \\
        torchrun --standalone --nproc-per-node 2 benchmarks/bench_tp.py \\
        --model llama8b,llama8b-fp8,qwen3moe,qwen3moe-fp8 --out benchmarks/results/tp
    torchrun --standalone --nproc-per-node 2 benchmarks/bench_tp.py --device cpu --tiny \\
        --model llama8b,qwen3moe-fp8 --out /tmp/tp  # smoke (gloo)
    ... benchmarks/bench_tp.py --check-only --model llama8b-fp8,qwen3moe  # correctness only

Models (benchmarks/tp_models.py): llama8b, llama8b-fp8 (block FP8), qwen3moe (Qwen3-30B-A3B
shape), qwen3moe-fp8; random weights. Rank 0 writes each as a LAYER-REDUCED checkpoint
(--check-layers, default 2, every per-layer tensor of its real shape); every rank loads it
through the real loader (its TP slices of the weights and of the FP8 scales), and for the
timings its layers are copied in GPU memory up to the model's depth (--layers / --moe-layers;
default the real 32 / 48; on 80 GB cards pass --moe-layers 24: the 48-layer bf16 MoE at TP=1 with
its batch-128 KV cache needs ~87 GB). NCCL on CUDA (device cuda:LOCAL_RANK, NVLink multicast off), gloo on
the CPU; a gloo group carries the host-side barriers.

Per model:
1. TP=1, rank 0 alone while the others wait: the correctness run (below) on the loaded model;
   decode steps (batch 1 / 8 / 32 / 128 at context 2048) as CUDA-graph replays, prefill of one
   prompt (1k / 4k / 8k tokens); the correctness run of the fp32 reference.
2. TP=N on every rank: the correctness run (graphs and eager) per all-reduce mode, then the same
   decode timings once per mode of --all-reduce (default "dist,one_shot": NCCL, then torch's
   symmetric-memory one-shot kernel for messages up to 2 MiB, model_wrapper/all_reduce.py) and
   the prefills (last mode; prefill messages of 1k+ tokens exceed 2 MiB and go through NCCL either way).

Timing: every measured step sits between a device synchronize plus a barrier of all the ranks
taking part and a device synchronize; the median of --iters steps after warm-up (a decode
step's warm-up includes its graph capture), and under TP the slower rank's median. Speedup =
TP=1 ms / TP=N ms, efficiency = speedup / N.

Correctness: one batched prefill of 4 prompts and a few teacher-forced decode steps, on the loaded
(layer-reduced) model; each run's max |error| / max |fp32 logit| against the TP=1 fp32 reference
of the same checkpoint (FP8 weights dequantized, w * scale). Per all-reduce mode, four TP=N runs
(benchmarks/tp_check.py): the real path (default graphs: the batched prefill in a mixed-step
graph, decode graphs on the Triton decode attention), eager twice, and graphs running the eager
kernels on the eager inputs (prefill eager, FlashInfer decode attention in the decode graphs; the
check's batch of 4 is a graph bucket, so no padding rows). Pass: the graph run's and the eager
run's errors each <= 2 x TP=1's own (bf16, or FP8 with its activation quantization) + 2e-3, top-1
agreement, every rank returning the same logits, and the same-kernels graphs bit-identical to
eager. The default graphs against eager is reported with the pair bound those errors imply: the
mixed graph's Triton varlen prefill rounds unlike FlashInfer's ragged prefill, and a random 2-layer
model amplifies a bf16 ulp (FP8 activation scales, MoE router near-ties) to 0.05-0.1.

--check-only runs the correctness part alone; --batches / --prefills pick the timed shapes (a
prompt length may repeat, to see order effects), and each rank's prefill medians are kept;
--profile-prefill adds each rank's top CUDA kernels of one prefill per length (tp_profile.py).

Writes tp.json (rewritten after each model, so a run cut short keeps what it measured) and
tp.png (a row per model) to --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_forward import decode_step, prefill_step  # noqa: E402
from benchmarks.tp_check import BLOCK_SIZE, check_blocks, check_inputs, check_run, correctness  # noqa: E402
from benchmarks.tp_profile import kernel_table  # noqa: E402
from benchmarks.tp_report import plot, report  # noqa: E402
from benchmarks.tp_models import LABELS, MODELS, deepen, fp32_reference, model_config, write_checkpoint  # noqa: E402


class Ranks:
    """This process's place in the run: rank, world, device, the host-side (gloo) group."""

    def __init__(self, device: str, timeout_s: float):
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.cuda = device == "cuda"
        timeout = timedelta(seconds=timeout_s)
        if self.cuda:
            local = int(os.environ.get("LOCAL_RANK", "0"))
            torch.cuda.set_device(local)
            self.device = torch.device("cuda", local)
            dist.init_process_group("nccl", timeout=timeout, device_id=self.device)
            self.host = dist.new_group(backend="gloo", timeout=timeout)
        else:
            self.device = torch.device("cpu")
            dist.init_process_group("gloo", timeout=timeout)
            self.host = None  # the default group is gloo already

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def barrier(self) -> None:
        dist.barrier(group=self.host)

    def worst(self, value: float) -> float:
        """The largest value over all ranks (each rank passes its own)."""
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.host)
        return float(t)

    def agree(self, flag: bool) -> bool:
        """Rank 0's flag on every rank (a decision all ranks must take alike)."""
        obj = [flag]
        dist.broadcast_object_list(obj, src=0, group=self.host)
        return bool(obj[0])

    def gather(self, value: float) -> list[float]:
        """Every rank's value, in rank order (each rank passes its own)."""
        out = [None] * self.world
        dist.all_gather_object(out, value, group=self.host)
        return out

    def say(self, *args) -> None:
        if self.rank == 0:
            print(*args, flush=True)


def median_ms(step, r: Ranks, *, iters: int, warmup: int, all_ranks: bool, per_rank: list | None = None) -> float:
    """Median ms of step() over iters calls after warmup calls; each call timed from a
    synchronize (+ barrier of all ranks when all_ranks) to the synchronize after it; under
    all_ranks the slower rank's median (per_rank, given: extended by every rank's median)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        r.sync()
        if all_ranks:
            r.barrier()
        t0 = time.perf_counter()
        step()
        r.sync()
        times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    if not all_ranks:
        return ms
    if per_rank is not None:
        per_rank.extend(r.gather(ms))
    return r.worst(ms)


@contextmanager
def eager(gen):
    """Run gen's steps without its decode CUDA graphs (the cuda_graphs=False path), then restore."""
    mw = gen.model_wrapper
    saved, mw.graphs = mw.graphs, None
    try:
        yield
    finally:
        mw.graphs = saved


def time_decode(gen, kv, perm, r: Ranks, shapes, *, all_ranks: bool) -> dict:
    """-> {batch: ms} of decode steps (CUDA-graph replays where the model has graphs)."""
    out = {}
    for B in shapes["batches"]:
        torch.manual_seed(B)  # the same token ids on every rank
        step = decode_step(gen, kv, BLOCK_SIZE, B, shapes["context"], perm)
        out[B] = median_ms(step, r, iters=shapes["iters"], warmup=3, all_ranks=all_ranks)
    return out


def time_prefill(gen, kv, perm, r: Ranks, shapes, *, all_ranks: bool, per_rank: dict | None = None) -> dict:
    """-> {tokens: ms} of one-prompt prefills (a T listed twice: the later one's; per_rank, given:
    {tokens: [each rank's median, ...]}, a list per time T comes)."""
    out = {}
    for T in shapes["prefills"]:
        torch.manual_seed(T)
        step = prefill_step(gen, kv, BLOCK_SIZE, T, perm)
        row = None
        if per_rank is not None:
            row = []
            per_rank.setdefault(T, []).append(row)
        out[T] = median_ms(step, r, iters=shapes["prefill_iters"], warmup=1, all_ranks=all_ranks, per_rank=row)
    return out


@contextmanager
def all_reduce_mode(gen, mode: str):
    """Run gen's TP all-reduces through `mode` ("dist", "one_shot", "two_shot"): flips the shared
    SymmMemAllReduce and drops the captured graphs (they keep the path they captured)."""
    fast = gen.tp_group.fast
    if fast is None:
        if mode != "dist":
            raise ValueError(f"all-reduce mode {mode}: no symmetric-memory path ({gen.tp_group.fallback})")
        yield
        return
    saved = fast.enabled, fast.kind
    fast.enabled, fast.kind = mode != "dist", (mode if mode != "dist" else fast.kind)
    if gen.model_wrapper.graphs is not None:
        gen.model_wrapper.graphs.drop()
    try:
        yield
    finally:
        fast.enabled, fast.kind = saved
        if gen.model_wrapper.graphs is not None:
            gen.model_wrapper.graphs.drop()


# -- the run ---------------------------------------------------------------------------------

def free(r: Ranks) -> None:
    """Give memory back after the caller dropped its references."""
    gc.collect()  # ModelWrapper <-> DecodeGraphRunner is a cycle: collect it to free the graphs
    if r.cuda:
        torch.cuda.empty_cache()


def e4m3_tensors(gen) -> int:
    """How many of the loaded model's parameters are kept in e4m3 (FP8 storage)."""
    return sum(p.dtype == torch.float8_e4m3fn for p in gen.model_wrapper.model.parameters())


def run_model(name: str, args, r: Ranks, tp, modes: list[str], root: str, t_start: float) -> dict:
    """Both phases and the correctness runs of one model -> its JSON section (rank 0; {} elsewhere)."""
    from text_generator import TextGenerator

    W = r.world
    cfg, fp8 = model_config(name, args.tiny, args.moe_layers if "moe" in name else args.layers)
    L, L0 = cfg["num_hidden_layers"], min(args.check_layers, cfg["num_hidden_layers"])
    shapes = dict(batches=[1, 8, 32, 128], context=2048, prefills=[1024, 4096, 8192], iters=args.iters or 20,
                  prefill_iters=args.prefill_iters or 5)
    if args.tiny:
        shapes = dict(batches=[1, 4], context=128, prefills=[128, 256], iters=args.iters or 3,
                      prefill_iters=args.prefill_iters or 2)
    for key in ("batches", "prefills"):  # the command line's lists, where given
        if getattr(args, key) is not None:
            shapes[key] = getattr(args, key)
    timed = not args.check_only
    prompts, tokens = check_inputs(cfg, args.tiny)
    nb_check = check_blocks(prompts, tokens)
    num_blocks = max(max(shapes["batches"], default=1) * -(-shapes["context"] // BLOCK_SIZE),
                     -(-max(shapes["prefills"], default=1) // BLOCK_SIZE))
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0))
    out = dict(model=LABELS[name] + (" (tiny)" if args.tiny else ""), fp8=fp8, layers=L0 if args.check_only else L,
               full_layers=MODELS[name][0]["num_hidden_layers"], check_layers=L0,
               layer_reduced=(f"timed with {L} layers (in-memory copies of the {L0} loaded ones); the correctness "
                              f"run uses the {L0}-layer checkpoint as loaded. Every per-layer shape is the model's"
                              if not args.check_only else
                              f"--check-only: the correctness runs of the {L0}-layer checkpoint, no timings"),
               seconds={})
    t = time.monotonic()
    path = os.path.join(root, f"{name}-L{L0}")
    if r.rank == 0:
        write_checkpoint(path, cfg, fp8, L0, r.device)
    r.barrier()
    out["seconds"]["checkpoint"] = time.monotonic() - t

    def load(tp_group):
        return TextGenerator.from_pretrained(path, device=r.device, dtype=torch.bfloat16, tp_group=tp_group,
                                             progress=False)

    # -- phase 1: TP=1 on rank 0 alone --------------------------------------------------------
    single = {}
    if r.rank == 0:
        t = time.monotonic()
        gen = load(None)
        out["cuda_graphs"] = gen.model_wrapper.graphs is not None
        out["e4m3_tensors_tp1"] = e4m3_tensors(gen)
        kv = gen.allocate_kv_cache(nb_check, BLOCK_SIZE)
        logits1 = check_run(gen, kv, prompts, tokens)
        del kv
        if timed:
            gen = deepen(gen, path, L)
            kv = gen.allocate_kv_cache(num_blocks, BLOCK_SIZE)
            single["decode"] = time_decode(gen, kv, perm, r, shapes, all_ranks=False)
            single["prefill"] = time_prefill(gen, kv, perm, r, shapes, all_ranks=False)
            del kv
        del gen
        free(r)
        ref = fp32_reference(path, r.device)
        kv32 = ref.allocate_kv_cache(nb_check, BLOCK_SIZE)
        logits32 = check_run(ref, kv32, prompts, tokens)
        del ref, kv32
        free(r)
        out["seconds"]["tp1"] = time.monotonic() - t
    r.barrier()
    r.say(f"{name}: TP=1 done at {time.monotonic() - t_start:.0f} s")

    # -- phase 2: TP=W on every rank ----------------------------------------------------------
    t = time.monotonic()
    gen = load(tp)
    # per rank: fewer than TP=1's where a rank's shard cuts an FP8 block (its first K-column inside a
    # 128-column block: that layer is dequantized on that rank only, e.g. Qwen3-30B-A3B's experts of
    # width 768 / 4 = 192 on ranks 1 and 3)
    out[f"e4m3_tensors_tp{W}_per_rank"] = r.gather(e4m3_tensors(gen))
    kv = gen.allocate_kv_cache(nb_check, BLOCK_SIZE)
    checks = {}
    default_kc = gen.model_wrapper.kernel_config
    # graphs that run the eager steps' kernels on the eager steps' inputs: the batched prefill eager
    # (no mixed-step graph, whose Triton varlen prefill rounds unlike FlashInfer's ragged one) and
    # FlashInfer's decode attention in the decode graphs (the default Triton one rounds differently)
    same_kc = dataclasses.replace(default_kc, triton_decode=False, mixed_graphs=False)
    for mode in modes:
        with all_reduce_mode(gen, mode):
            runs = {"graph": check_run(gen, kv, prompts, tokens)}
            with eager(gen):
                runs["eager"] = check_run(gen, kv, prompts, tokens)
                runs["eager_again"] = check_run(gen, kv, prompts, tokens)
            gen.model_wrapper.set_kernel_config(same_kc)
            runs["graph_same"] = check_run(gen, kv, prompts, tokens)
            gen.model_wrapper.set_kernel_config(default_kc)
        gathered = [None] * W
        dist.all_gather_object(gathered, runs["graph"], group=r.host)
        checks[mode] = (runs, gathered)
    del kv
    multi, prefill_w, prefill_ranks, profiles = {}, {}, {}, {}
    if timed:
        gen = deepen(gen, path, L)
        kv = gen.allocate_kv_cache(num_blocks, BLOCK_SIZE)
        for mode in modes:
            with all_reduce_mode(gen, mode):
                multi[mode] = time_decode(gen, kv, perm, r, shapes, all_ranks=True)
        with all_reduce_mode(gen, modes[-1]):
            prefill_w = time_prefill(gen, kv, perm, r, shapes, all_ranks=True, per_rank=prefill_ranks)
            if args.profile_prefill:
                for T in dict.fromkeys(shapes["prefills"]):
                    torch.manual_seed(T)
                    step = prefill_step(gen, kv, BLOCK_SIZE, T, perm)
                    profiles[T] = r.gather(kernel_table(step, r, os.path.join(args.out, f"{name}_prefill{T}")))
        del kv
    del gen
    free(r)
    out["seconds"]["tp"] = time.monotonic() - t
    if r.rank != 0:
        return {}
    if timed:
        out["decode"], out["prefill"] = table(single, multi, prefill_w, shapes, W, modes)
        out["prefill_all_reduce"] = modes[-1]
        out[f"prefill_tp{W}_ms_per_rank"] = {T: rows for T, rows in prefill_ranks.items()}
        if profiles:
            out[f"prefill_tp{W}_kernels"] = profiles
    out["correctness"] = {mode: correctness(logits1, logits32, runs, gathered, prompts, tokens, W, fp8)
                          for mode, (runs, gathered) in checks.items()}
    return out


def table(single, multi, prefill_w, shapes, W, modes):
    """Per shape: TP=1 and TP=W ms (per all-reduce mode for decode), speedup, efficiency."""
    decode, prefill = [], []
    for B in shapes["batches"]:
        a = single["decode"][B]
        row = dict(batch=B, context=shapes["context"], tp1_ms=a, tp1_tokens_per_s=B / a * 1e3)
        for mode in modes:
            b = multi[mode][B]
            row[f"tp{W}_{mode}_ms"] = b
            row[f"speedup_{mode}"] = a / b
            row[f"efficiency_{mode}"] = a / b / W
        decode.append(row)
    for T in dict.fromkeys(shapes["prefills"]):
        a, b = single["prefill"][T], prefill_w[T]
        prefill.append(dict(tokens=T, batch=1, tp1_ms=a, **{f"tp{W}_ms": b}, speedup=a / b, efficiency=a / b / W,
                            tp1_tokens_per_s=T / a * 1e3, **{f"tp{W}_tokens_per_s": T / b * 1e3}))
    return decode, prefill


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="shrunk models and shapes, for a CPU smoke run")
    ap.add_argument("--model", default="llama8b", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--all-reduce", default="dist,one_shot",
                    help="comma-separated TP all-reduce modes to time decode with (dist, one_shot, two_shot); "
                         "prefill and the order of the A/B: the last one")
    ap.add_argument("--out", default="benchmarks/results/tp")
    ap.add_argument("--model-dir", default=None, help="folder of the checkpoints (reused when they match); "
                                                      "default: a temp dir, removed at the end")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers of the dense models (default: theirs)")
    ap.add_argument("--moe-layers", type=int, default=None, help="decoder layers of the MoE models (default: 48)")
    ap.add_argument("--check-layers", type=int, default=2, help="layers of the written checkpoints")
    ap.add_argument("--iters", type=int, default=None, help="timed decode steps per shape (default 20; tiny 3)")
    ap.add_argument("--timeout-s", type=float, default=600.0, help="process-group timeout")
    ap.add_argument("--check-only", action="store_true",
                    help="the correctness runs only (TP=1, TP=N per all-reduce mode, fp32 reference): no timings")
    ap.add_argument("--batches", type=_ints, default=None, help="decode batches to time, comma-separated "
                                                                "(default 1,8,32,128; empty: none)")
    ap.add_argument("--prefills", type=_ints, default=None, help="prompt lengths to time, comma-separated, a "
                                                                 "length may repeat (default 1024,4096,8192)")
    ap.add_argument("--prefill-iters", type=int, default=None, help="timed prefills per length (default 5)")
    ap.add_argument("--profile-prefill", action="store_true",
                    help="after the TP=N prefill timings, each rank's CUDA kernels of one prefill per length "
                         "(tables in --out; the top ones in tp.json and printed)")
    args = ap.parse_args()
    t_start = time.monotonic()
    names = args.model.split(",")
    for n in names:
        if n not in MODELS:
            raise SystemExit(f"bench_tp: --model: expected names of {', '.join(MODELS)}, got {n!r}")

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast (set before NCCL starts)
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    r = Ranks(args.device, args.timeout_s)
    W = r.world
    if W < 2:
        raise SystemExit("bench_tp: run under torchrun --nproc-per-node N with N >= 2")
    if r.cuda and torch.cuda.device_count() < W:
        raise SystemExit(f"bench_tp: {W} ranks but {torch.cuda.device_count()} GPUs visible")
    from model_wrapper import TPGroup

    modes = args.all_reduce.split(",")
    fast = [m for m in modes if m != "dist"]
    tp = TPGroup.from_default_group(all_reduce=fast[0] if fast else "dist")
    if tp.fast is None and fast:
        r.say(f"symmetric-memory all-reduce unavailable ({tp.fallback}): timing dist only")
        modes = ["dist"]

    res = dict(command=f"torchrun --standalone --nproc-per-node {W} benchmarks/bench_tp.py " + " ".join(sys.argv[1:]),
               argv=sys.argv, world_size=W, torch=torch.__version__,
               device=torch.cuda.get_device_name(r.device) if r.cuda else "cpu",
               backend=dist.get_backend(), NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE"),
               TORCH_SYMM_MEM_DISABLE_MULTICAST=os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST"),
               all_reduce_modes=modes, symm_mem_fallback=tp.fallback, dtype="bfloat16", block_size=BLOCK_SIZE,
               timing=("median of the decode / prefill steps after warm-up (incl. graph capture), each between "
                       "synchronize + barrier of the ranks involved and synchronize; under TP the slower rank's"),
               models={}, seconds={})
    if r.cuda:
        v = torch.cuda.nccl.version()
        res["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)

    def write():
        if r.rank == 0:
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "tp.json"), "w") as f:
                json.dump(res, f, indent=1)

    made = None
    if args.model_dir is None:
        obj = [tempfile.mkdtemp(prefix="bench_tp_") if r.rank == 0 else None]
        dist.broadcast_object_list(obj, src=0, group=r.host)
        made = root = obj[0]
    else:
        root = args.model_dir
    for name in names:
        res["models"][name] = run_model(name, args, r, tp, modes, root, t_start)
        res["seconds"][name] = time.monotonic() - t_start
        write()
        if r.rank == 0:
            report(name, res["models"][name], W, modes, res["device"])
    res["seconds"]["total"] = time.monotonic() - t_start
    write()
    if r.rank == 0 and not args.check_only:
        plot(res, W, os.path.join(args.out, "tp.png"))
    r.barrier()
    if made and r.rank == 0:
        shutil.rmtree(made, ignore_errors=True)
    del tp
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001 - report, then leave at once
        # A normal exit would tear NCCL down, which waits for every CUDA graph holding its
        # collectives (the traceback keeps them alive): exit now, and torchrun stops the others.
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
