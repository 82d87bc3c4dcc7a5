"""bench_tp.py --profile-prefill: the CUDA kernels of one prefill step on this rank, by total time.

    rows = kernel_table(step, r, prefix)   # after the step's warm-up; every rank calls it together
    -> [(kernel name, total ms, calls), ...] (the top TOP, longest first); the whole table in
       {prefix}_rank{rank}.txt

Each rank profiles its own step between a synchronize + barrier and a synchronize, so the ranks'
tables show where one rank spends time that another does not (a kernel another rank does not run,
or a collective waiting on a slower rank). The file has the host's ops as well (by self CPU time):
a rank whose kernels add up to less than the step is bound by its host.
"""

from __future__ import annotations

import os

from torch.profiler import ProfilerActivity, profile

TOP = 12


def _device_us(evt, cuda: bool = True) -> float:
    """An averaged event's own device time in us (a kernel's; an op's kernels count as their own
    events; torch renamed self_cuda_time_total); on the CPU (a smoke run) its own CPU time."""
    for name in ("self_device_time_total", "self_cuda_time_total") if cuda else ("self_cpu_time_total",):
        v = getattr(evt, name, None)
        if v is not None:
            return float(v)
    return 0.0


def kernel_table(step, r, prefix: str) -> list[tuple[str, float, int]]:
    """Profile one call of step() on this rank (r: bench_tp.Ranks) -> its top kernels (on the CPU: ops)."""
    step()  # warm (the timed steps ran it already; this one keeps the profile free of first-call work)
    r.sync()
    r.barrier()
    # the host's ops too: a step whose GPU idles between kernels is bound by its host (Python, launches)
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if r.cuda else [])) as prof:
        step()
        r.sync()
    r.barrier()
    def us(e):
        return _device_us(e, r.cuda)

    events = sorted((e for e in prof.key_averages() if us(e) > 0), key=us, reverse=True)
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    with open(f"{prefix}_rank{r.rank}.txt", "w") as f:
        for key in (("cuda_time_total",) if r.cuda else ()) + ("self_cpu_time_total",):
            f.write(f"sorted by {key}\n")
            f.write(prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=100) + "\n")
    return [(e.key[:100], us(e) / 1e3, int(e.count)) for e in events[:TOP]]
