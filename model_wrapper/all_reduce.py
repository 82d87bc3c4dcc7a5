"""The tensor-parallel all-reduce of small (decode-sized) messages over symmetric memory.

A decode step under TP=N runs two all-reduces per layer of [batch, hidden] partial sums (a few KiB
to 2 MiB at batch 256). NCCL spends most of each on its protocol and launch, not on bytes. Torch's
symmetric-memory ops (torch.distributed._symmetric_memory, CUDA backend) instead give every rank one
buffer that its peers can address directly over NVLink (peer-to-peer loads and stores; no NVLink
multicast, which must stay off):

    one_shot  one kernel: copy this rank's x into its own symmetric buffer, barrier on the signal
              pads, read all N buffers and sum -> out. Reads N x the message: best for small ones.
    two_shot  copy x into the buffer; reduce-scatter (each rank sums its 1/N) and all-gather, both
              by peer loads / stores -> out. Reads ~2 x the message: better for mid sizes.

Both are plain kernels on the current stream, so a CUDA graph captures them like NCCL's (the buffer
and its signal pads keep their addresses). Messages larger than max_bytes, other dtypes than bf16 /
fp32 (the kernels' two), or not 16-byte aligned go to torch.distributed.all_reduce; the choice
depends only on a message's shape and dtype, which every rank shares (SPMD), so ranks always take
the same path.

Setup (SymmMemAllReduce.create) runs once, collectively, and falls back to torch.distributed
(returns None with the reason) wherever the path cannot run: a gloo group, no CUDA, a torch
without the ops, a failed allocation / rendezvous, or a self-test sum that comes out wrong. Each
step's outcome is agreed over the group (a MIN of a flag), so all ranks fall back together.
"""

from __future__ import annotations

import os

import torch

ALL_REDUCE_MODES = ("dist", "one_shot", "two_shot", "auto")
# "auto": the kernel picked where symmetric memory runs (bench_allreduce.py, benchmarks/RESULTS.md)
AUTO_KIND = "one_shot"
# up to 256 x 4096 bf16 (decode graphs go to batch 256): one-shot beat NCCL to 2 MiB on 2 x H200, in a
# graph (21 vs 33 us) and eagerly (23 vs 27 us); at 4 MiB eager NCCL was faster (bench_allreduce.py)
DEFAULT_MAX_BYTES = 2 << 20
_KERNEL_DTYPES = (torch.bfloat16, torch.float32)
_ALIGN = 16  # bytes: the kernels' widest vector; offsets and sizes that are multiples keep one alignment


def symm_mem_fits(x: torch.Tensor, max_bytes: int) -> bool:
    """Whether message x can take the symmetric-memory path: bf16 / fp32, contiguous, at most
    max_bytes, and its byte offset and size multiples of 16 (the buffer's own alignment)."""
    nbytes = x.numel() * x.element_size()
    return (x.dtype in _KERNEL_DTYPES and x.is_contiguous() and 0 < nbytes <= max_bytes
            and nbytes % _ALIGN == 0 and (x.storage_offset() * x.element_size()) % _ALIGN == 0)


def _rank_device(group) -> torch.device:
    """This rank's GPU: the one the process group is bound to (init_process_group(device_id=...)),
    else torchrun's LOCAL_RANK, else the current device."""
    import torch.distributed as dist

    bound = getattr(group if group is not None else dist.group.WORLD, "bound_device_id", None)
    if bound is not None:
        return torch.device("cuda", bound.index if bound.index is not None else torch.cuda.current_device())
    if "LOCAL_RANK" in os.environ:
        return torch.device("cuda", int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def _ops():
    """torch.ops.symm_mem, or None when this torch has no symmetric-memory all-reduce."""
    try:
        import torch.distributed._symmetric_memory  # noqa: F401 - registers the ops' Python side

        ops = torch.ops.symm_mem
        ops.one_shot_all_reduce_out  # noqa: B018 - raises when the CUDA ops are not built in
        ops.two_shot_all_reduce_out  # noqa: B018
        return ops
    except (ImportError, AttributeError, RuntimeError):
        return None


class SymmMemAllReduce:
    """A symmetric buffer of max_bytes on this rank's GPU, rendezvoused over `group`, and the
    one-shot or two-shot all-reduce through it.

    kind: "one_shot" or "two_shot"; max_bytes: the largest message it takes; group_name: the
    process group's name (the ops address peers by it). enabled: False sends every message to
    torch.distributed (benchmarks flip it for an A/B on one model; captured graphs keep the path
    they captured, so drop them after a flip).
    """

    def __init__(self, buffer: torch.Tensor, group_name: str, kind: str, max_bytes: int):
        self.buffer = buffer  # uint8 [max_bytes], symmetric
        self.group_name = group_name
        self.kind = kind
        self.max_bytes = max_bytes
        self.enabled = True
        self._ops = _ops()
        self._copy_in_kernel = hasattr(self._ops, "one_shot_all_reduce_copy_out")

    @classmethod
    def create(cls, group, kind: str, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple["SymmMemAllReduce | None", str]:
        """Set the path up on every rank of `group` (None: the default group), collectively.
        -> (the reducer, "") or (None, why not). Every rank gets the same answer."""
        import torch.distributed as dist

        backend = str(dist.get_backend(group))
        if "nccl" not in backend:
            return None, f"the process group's backend is {backend}, not nccl"
        if not torch.cuda.is_available():  # (an nccl group implies CUDA; kept for clarity)
            return None, "no CUDA device"
        device = _rank_device(group)
        with torch.cuda.device(device):  # the symmetric allocation and the kernels use the current device
            return cls._create(group, kind, max_bytes, device)

    @classmethod
    def _create(cls, group, kind: str, max_bytes: int, device: torch.device):
        import torch.distributed as dist

        def agree(ok: bool) -> bool:
            flag = torch.tensor([int(ok)], dtype=torch.int32, device=device)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
            return bool(flag.item())

        ops = _ops()
        if not agree(ops is not None):
            return None, "this torch has no torch.ops.symm_mem one-shot / two-shot all-reduce"
        import torch.distributed._symmetric_memory as symm_mem

        pg = group if group is not None else dist.group.WORLD
        name = pg.group_name
        try:  # older torch needs the group registered for symmetric memory; newer does it itself
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                symm_mem.enable_symm_mem_for_group(name)
        except Exception:  # noqa: BLE001 - absent or already registered: the rendezvous below decides
            pass
        why, buffer = "", None
        try:
            buffer = symm_mem.empty(max_bytes, dtype=torch.uint8, device=device)
        except Exception as e:  # noqa: BLE001 - any failure means: not here
            why = f"symmetric-memory allocation failed: {e}"
        if not agree(buffer is not None):
            return None, why or "symmetric-memory allocation failed on another rank"
        try:
            symm_mem.rendezvous(buffer, name)
        except Exception as e:  # noqa: BLE001
            why = f"symmetric-memory rendezvous failed: {e}"
        if not agree(not why):
            return None, why or "symmetric-memory rendezvous failed on another rank"
        out = cls(buffer, name, kind, max_bytes)
        try:  # every rank adds rank + 1 at 4 sizes: the exact sum is W (W + 1) / 2 everywhere
            w, r = dist.get_world_size(group), dist.get_rank(group)
            for n in (8, 4096, 16384 + 8, max_bytes // 2):
                x = torch.full((n,), float(r + 1), dtype=torch.bfloat16, device=device)
                got = out(x)
                if not bool((got == w * (w + 1) // 2).all()):
                    why = f"self-test: a {kind} sum of {n} bf16 values came out wrong"
                    break
            torch.cuda.synchronize(device)
        except Exception as e:  # noqa: BLE001
            why = f"self-test raised: {e}"
        if not agree(not why):
            return None, why or "the self-test failed on another rank"
        return out, ""

    def fits(self, x: torch.Tensor) -> bool:
        return self.enabled and symm_mem_fits(x, self.max_bytes)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [...] (fits) -> the sum over the group, a new tensor of x's shape; x is left as it was."""
        if x.device.index != torch.cuda.current_device():  # the ops launch on the current device
            with torch.cuda.device(x.device):
                return self(x)
        n = x.numel()
        flat = x.view(-1)
        buf = self.buffer.view(x.dtype)[:n]
        out = torch.empty_like(x)
        if self.kind == "one_shot":
            if self._copy_in_kernel:  # the copy into the buffer happens inside the kernel
                self._ops.one_shot_all_reduce_copy_out(buf, flat, "sum", self.group_name, out.view(-1))
            else:
                buf.copy_(flat)
                self._ops.one_shot_all_reduce_out(buf, "sum", self.group_name, out.view(-1))
        else:
            buf.copy_(flat)
            self._ops.two_shot_all_reduce_out(buf, "sum", self.group_name, out.view(-1))
        return out
