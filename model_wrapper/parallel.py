"""Tensor parallelism: which slice of every weight a rank holds, and the collectives it runs.

SPMD, as under `torchrun --nproc-per-node N`: every rank runs the same scheduler code and calls
forward_tensor with the same tensors; nothing is broadcast inside the call. Each rank loads only
its slices (loader.py reads them with safetensors' get_slice), keeps only its own KV heads in
its kv_cache, and returns the full-vocabulary logits, identical on every rank, so that samplers
seeded alike stay in lockstep.

Sharding over W ranks (rank r), Megatron-style:

    qkv_proj      column-parallel: rows [q heads of r | k heads of r | v heads of r] (+ bias)
    o_proj        row-parallel: input columns of r's q heads; all_reduce; bias after the sum
    gate_up_proj  column-parallel: rows [gate_r | up_r], intermediate // W each (+ bias)
    down_proj     row-parallel: input columns of r's intermediate slice; all_reduce; bias after
    embed_tokens  vocab-parallel: rows [r * S, (r + 1) * S), S = ceil(vocab / W), the last shard
                  zero-padded; ids outside the slice give 0; all_reduce
    lm_head       vocab-parallel: the same rows (tied to embed_tokens or not); logits slice
                  [T, S]; all_gather -> [T, W * S] -> [:, :vocab]
    experts       each expert's gate / up rows and down input columns sliced like gate_up_proj /
                  down_proj, by its own width (moe_intermediate_size, the shared expert's by
                  its own); the router and the shared-expert gate replicated; one all_reduce
                  of the layer's summed expert outputs
    block FP8     (a checkpoint with 128 x 128 weight blocks, cfg.quant.kind == "block") the
                  experts' and the dense MLP's intermediate dimension is cut only at block
                  boundaries (block_split): rank r holds blocks [r * nb // W, (r + 1) * nb // W)
                  of the nb = ceil(I / 128), so every row-parallel down_proj slice starts on a
                  block and keeps e4m3 storage with its blocks' own scales (fp8_weights.py).
                  Uneven where 128 W does not divide I (Qwen3-30B-A3B, I 768 at W 4: 128 / 256 /
                  128 / 256 columns instead of 192 each): the all_reduce sums any split, and
                  the widest rank holds ceil(nb / W) blocks. Experts may get no block at all
                  (nb < W, e.g. I 768 at W 8: two ranks of width 0, whose MoE adds nothing);
                  the dense MLP is split so only where every rank gets a block (else evenly)
    LoRA          B sliced like a column-parallel weight's rows, A like a row-parallel weight's
                  input columns (shard_lora); row-parallel deltas join the partial sums
    norms         replicated (input / post-attention / final RMSNorm, q_norm, k_norm)

    q heads:  Hq = num_heads // W per rank, rank r holds q heads [r * Hq, (r + 1) * Hq)
    kv heads: num_kv_heads % W == 0 -> Hk = num_kv_heads // W, heads [r * Hk, (r + 1) * Hk)
              W % num_kv_heads == 0 -> replicated: Hk = 1, head (r * Hq) // group_size, the one
                                       head all of r's q heads read (W // num_kv_heads ranks
                                       share it)

With W == 1 (TPGroup.single(), the default) every slice is the whole tensor and the decoder
runs exactly the code it runs without this module.

The all-reduce: torch.distributed.all_reduce (NCCL on CUDA, gloo on the CPU), or for decode-sized
messages torch's symmetric-memory one-shot / two-shot kernels (all_reduce.py), chosen by
TPGroup.from_default_group(all_reduce=...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from model_wrapper.all_reduce import ALL_REDUCE_MODES, AUTO_KIND, DEFAULT_MAX_BYTES, SymmMemAllReduce
from model_wrapper.errors import ModelErrorCode, ModelLoadError
from model_wrapper.quantization import BLOCK

# TPGroup.from_default_group's all_reduce. On 2 x H200 (benchmarks/RESULTS.md, bench_allreduce.py) the
# one-shot kernel took 7-15 us per decode-sized all-reduce in a graph against NCCL's 12-20 us
DEFAULT_ALL_REDUCE = "auto"


@dataclass(frozen=True)
class TPGroup:
    """One rank's place in a tensor-parallel group.

    rank:       this process's index in the group, 0 <= rank < world_size
    world_size: number of ranks sharing each layer
    group:      the torch.distributed ProcessGroup of the collectives (None: the default group)
    fast:       a SymmMemAllReduce (all_reduce.py) that takes the messages it fits, or None:
                every all_reduce goes through torch.distributed
    fallback:   why `fast` is None although a symmetric-memory mode was asked for ("" otherwise)
    """

    rank: int = 0
    world_size: int = 1
    group: Any = None
    fast: Any = field(default=None, compare=False, repr=False)
    fallback: str = field(default="", compare=False)

    @classmethod
    def single(cls) -> "TPGroup":
        """No tensor parallelism: one rank holds everything and no collective ever runs."""
        return cls(0, 1, None)

    @classmethod
    def from_default_group(cls, all_reduce: str = DEFAULT_ALL_REDUCE,
                           max_bytes: int = DEFAULT_MAX_BYTES) -> "TPGroup":
        """All ranks of the initialised default process group (torch.distributed.init_process_group).

        all_reduce: "dist" (torch.distributed.all_reduce for every message), "one_shot" / "two_shot"
        (messages of at most max_bytes through torch's symmetric-memory kernels, all_reduce.py;
        larger ones through torch.distributed) or "auto", the default (one_shot: the measured best
        at decode sizes). A symmetric-memory mode sets up collectively (every rank must call this)
        and falls back to "dist" where it cannot run (gloo, CPU, no ops): `fallback` says why.
        """
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ModelLoadError(
                ModelErrorCode.BAD_CONFIG,
                "tensor_parallel=True: expected an initialised torch.distributed default process group "
                "(call init_process_group first, e.g. under torchrun), got none",
            )
        if all_reduce not in ALL_REDUCE_MODES:
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG,
                                 f"all_reduce: expected one of {', '.join(ALL_REDUCE_MODES)}, got {all_reduce!r}")
        if not (isinstance(max_bytes, int) and max_bytes > 0 and max_bytes % 16 == 0):
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG,
                                 f"max_bytes: expected a positive multiple of 16, got {max_bytes!r}")
        rank, world = dist.get_rank(), dist.get_world_size()
        fast, why = None, ""
        if all_reduce != "dist" and world > 1:
            kind = AUTO_KIND if all_reduce == "auto" else all_reduce
            fast, why = SymmMemAllReduce.create(None, kind, max_bytes)
        return cls(rank, world, None, fast, why)

    @property
    def all_reduce_path(self) -> str:
        """What small messages go through: "dist", "one_shot" or "two_shot"."""
        return self.fast.kind if self.fast is not None else "dist"

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum x over the group and return the sum: x itself, summed in place (torch.distributed), or a
        new tensor (the symmetric-memory path, for the messages it fits; x then keeps its value).
        Callers use the returned tensor. Graph-safe: a CUDA graph captures either path."""
        if self.fast is not None and self.fast.fits(x):
            return self.fast(x)
        import torch.distributed as dist

        dist.all_reduce(x, group=self.group)
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, S] on every rank -> [T, world_size * S], rank order along the last dim.

        One collective into one output allocated here ([W * T, S], rank-major), then one copy
        to [T, W * S]: no per-rank list and no host sync, so a CUDA graph can capture it (the
        output then lives in the graph's memory pool, the same address at every replay).
        """
        import torch.distributed as dist

        x = x.contiguous()
        w, (t, s) = self.world_size, x.shape
        out = torch.empty(w * t, s, dtype=x.dtype, device=x.device)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # older torch
        gather(out, x, group=self.group)
        return out.view(w, t, s).transpose(0, 1).reshape(t, w * s)


def block_split(n: int, world: int, rank: int, block: int = BLOCK) -> tuple[int, int]:
    """(start, length) of rank's share of n columns cut only at multiples of `block`: the nb = ceil(n / block)
    blocks dealt out in order, rank r taking blocks [r * nb // world, (r + 1) * nb // world) (the last block
    may be partial). The widths differ by at most one block and add up to n; a rank gets none where nb < world.
    Where block * world divides n it is the even split."""
    nb = -(-n // block)
    first, end = rank * nb // world, (rank + 1) * nb // world
    start = min(first * block, n)
    return start, min(end * block, n) - start


@dataclass(frozen=True)
class TPShard:
    """The per-rank sizes and offsets of a model under a TPGroup (ModelConfig stays global).

    num_heads / num_kv_heads: q / kv heads this rank holds; q_start / kv_start: the first one's
    global index; total_kv_heads: the model's. intermediate_size / inter_start: the MLP slice (intermediate_total
    the global width; moe_intermediate_total the experts'). vocab_size: global;
    vocab_shard: rows of the local embedding / lm_head (padded: the last rank may hold fewer
    real rows, vocab_rows); vocab_start: the first global id of the slice.
    """

    world_size: int
    num_heads: int
    q_start: int
    num_kv_heads: int
    kv_start: int
    total_kv_heads: int
    head_dim: int
    intermediate_size: int
    inter_start: int
    vocab_size: int
    vocab_shard: int
    vocab_start: int
    moe_intermediate_size: int = 0  # each expert's slice (mixture-of-experts models)
    moe_inter_start: int = 0
    moe_intermediate_total: int = 0  # the experts' global width (the slices are uneven under block FP8)
    intermediate_total: int = 0  # the dense MLP's global width (0: intermediate_size * world_size)
    shared_intermediate_size: int | None = None  # the shared expert's slice (Qwen2-MoE)
    shared_inter_start: int = 0

    @property
    def vocab_rows(self) -> int:
        """Real (unpadded) vocabulary rows of this rank's slice."""
        return max(0, min(self.vocab_shard, self.vocab_size - self.vocab_start))

    @classmethod
    def of(cls, cfg, tp: TPGroup) -> "TPShard":
        """cfg: a ModelConfig. Raises ModelLoadError(BAD_CONFIG) when the model does not split W ways."""
        w, r = tp.world_size, tp.rank
        if w < 1 or not 0 <= r < w:
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG,
                                 f"tp_group: expected 0 <= rank < world_size, got rank={r}, world_size={w}")
        heads, kv = cfg.num_heads, cfg.num_kv_heads
        if heads % w:
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG,
                                 f"tensor parallelism: num_attention_heads ({heads}) must be divisible by "
                                 f"the world size ({w})")
        if kv % w and w % kv:
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG,
                                 f"tensor parallelism: num_key_value_heads ({kv}) must divide or be a multiple "
                                 f"of the world size ({w})")
        quant = getattr(cfg, "quant", None)
        blocks = quant is not None and quant.kind == "block"  # cut the MLP widths at block boundaries
        if blocks and -(-cfg.intermediate_size // BLOCK) >= w:
            inter_start, inter = block_split(cfg.intermediate_size, w, r)
        elif cfg.intermediate_size % w:
            raise ModelLoadError(ModelErrorCode.BAD_CONFIG,
                                 f"tensor parallelism: intermediate_size ({cfg.intermediate_size}) must be "
                                 f"divisible by the world size ({w})")
        else:
            inter = cfg.intermediate_size // w
            inter_start = r * inter
        moe = getattr(cfg, "moe", None)
        moe_inter = moe_start = shared = 0
        if moe is not None:
            checks = [("the shared expert's intermediate size", moe.shared_intermediate_size or 0)]
            if not blocks:
                checks.insert(0, ("the experts' intermediate size", moe.intermediate_size))
            for what, n in checks:
                if n % w:
                    raise ModelLoadError(ModelErrorCode.BAD_CONFIG,
                                         f"tensor parallelism: {what} ({n}) must be divisible by the world size ({w})")
            if blocks:
                moe_start, moe_inter = block_split(moe.intermediate_size, w, r)
            else:
                moe_inter = moe.intermediate_size // w
                moe_start = r * moe_inter
            shared = (moe.shared_intermediate_size or 0) // w
        hq = heads // w
        if kv % w == 0:
            hk, kv_start = kv // w, r * (kv // w)
        else:  # replicated: all of r's q heads read one kv head
            hk, kv_start = 1, (r * hq) // (heads // kv)
        vshard = -(-cfg.vocab_size // w)
        return cls(world_size=w, num_heads=hq, q_start=r * hq, num_kv_heads=hk, kv_start=kv_start,
                   total_kv_heads=kv, head_dim=cfg.head_dim, intermediate_size=inter, inter_start=inter_start,
                   vocab_size=cfg.vocab_size, vocab_shard=vshard, vocab_start=r * vshard,
                   moe_intermediate_size=moe_inter, moe_inter_start=moe_start,
                   moe_intermediate_total=moe.intermediate_size if moe is not None else 0,
                   intermediate_total=cfg.intermediate_size,
                   shared_intermediate_size=shared or None, shared_inter_start=r * shared)

    # -- what the loader reads ---------------------------------------------------------------
    def source_range(self, hf_name: str) -> tuple[int, int, int, int] | None:
        """HF checkpoint tensor name -> (dim, start, length, global size of dim), or None (replicated).

        The rank copies checkpoint[start : start + length] along dim into the first `length`
        entries of its parameter (only the vocabulary's last shard is shorter than its parameter).
        """
        parts = hf_name.split(".")
        module, kind = (parts[-2], parts[-1]) if len(parts) >= 2 else ("", "")
        d = self.head_dim
        if ".experts." in hf_name:  # an expert's gate / up rows and down columns: its own width
            inter = (self.moe_inter_start, self.moe_intermediate_size,
                     self.moe_intermediate_total or self.moe_intermediate_size * self.world_size)
        elif ".shared_expert." in hf_name:
            n = self.shared_intermediate_size or 0
            inter = (self.shared_inter_start, n, n * self.world_size)
        else:
            inter = (self.inter_start, self.intermediate_size,
                     self.intermediate_total or self.intermediate_size * self.world_size)
        column = {
            "q_proj": (self.q_start * d, self.num_heads * d, self.num_heads * self.world_size * d),
            "k_proj": (self.kv_start * d, self.num_kv_heads * d, self.total_kv_heads * d),
            "v_proj": (self.kv_start * d, self.num_kv_heads * d, self.total_kv_heads * d),
            "gate_proj": inter,
            "up_proj": inter,
            "w1": inter,  # Mixtral's expert gate / up / down
            "w3": inter,
            "embed_tokens": (self.vocab_start, self.vocab_rows, self.vocab_size),
            "lm_head": (self.vocab_start, self.vocab_rows, self.vocab_size),
        }
        row = {
            "o_proj": column["q_proj"],
            "down_proj": inter,
            "w2": inter,
        }
        if module in column:
            return (0, *column[module])
        if module in row and kind == "weight":
            return (1, *row[module])
        return None

    def shard_lora(self, proj: str, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A PEFT module's (A [r, in], B [out, r]) -> this rank's pair, sliced like the base weight.

        Column-parallel projections (q/k/v, gate/up) keep A and take B's rows of the rank; row-
        parallel ones (o, down) take A's input columns and keep B: the rank's partial delta
        x_r A_r^T B^T then joins the base partial sum before the all_reduce (LoRA is linear in x).
        """
        rng = self.source_range(f"{proj}.weight")
        if rng is None:
            return a, b
        dim, start, length, _ = rng
        if dim == 0:
            return a, b[start : start + length]
        return a[:, start : start + length], b
