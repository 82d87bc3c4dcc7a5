"""Where a TP decode step's GPU time goes: the kernel table of replayed decode steps at TP=N
(Llama-3-8B-shaped bf16, batch 1 and 32 at 2k), rank 0's view, NCCL kernels included:

    source .gpu/device-setup.sh && NCCL_NVLS_ENABLE=0 torchrun --standalone --nproc-per-node 2 benchmarks/profile_tp.py
    ... benchmarks/profile_tp.py --all-reduce one_shot   # the symmetric-memory all-reduce (model_wrapper/all_reduce.py)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.bench_forward import decode_step  # noqa: E402
from benchmarks.bench_tp import Ranks  # noqa: E402
from benchmarks.common import LLAMA3_8B, make_random_checkpoint  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--all-reduce", default="dist", help="TPGroup.from_default_group's all_reduce mode")
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    r = Ranks("cuda", 300)
    obj = [tempfile.mkdtemp(prefix="profile_tp_") if r.rank == 0 else None]
    dist.broadcast_object_list(obj, src=0, group=r.host)
    if r.rank == 0:
        make_random_checkpoint(obj[0], LLAMA3_8B, torch.bfloat16, device=r.device)
    r.barrier()
    from model_wrapper import TPGroup
    from text_generator import TextGenerator

    gen = TextGenerator.from_pretrained(obj[0], device=r.device, dtype=torch.bfloat16,
                                        tp_group=TPGroup.from_default_group(all_reduce=args.all_reduce))
    bs = 16
    kv = gen.allocate_kv_cache(8192, bs)
    perm = torch.arange(8192)
    for B in (1, 32):
        step = decode_step(gen, kv, bs, B, 2048, perm)
        for _ in range(5):
            step()
        r.sync()
        r.barrier()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                step()
            r.sync()
        r.barrier()
        r.say(f"=== TP={r.world} (all-reduce {gen.tp_group.all_reduce_path}), batch {B} @ 2048, "
              "10 replayed decode steps, rank 0 ===")
        r.say(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
        del step, prof  # the step closure holds the generator
    # NCCL's teardown waits for every CUDA graph holding its collectives: drop the generator (and
    # with it the graphs) first. (The first run of this script kept `step` alive here and hung.)
    del gen, kv
    import gc

    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
