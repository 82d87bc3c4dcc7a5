"""Where the host time of `serve` goes: the engine alone against the same load served over HTTP, with
the CPU time each process spends per output token (the load generator, the HTTP process, the engine
process) and, with --cprofile, each server process's hottest functions.

    python3 benchmarks/profile_serve.py                    # CPU, tiny random model: host overhead shows
    python3 benchmarks/profile_serve.py --cprofile         # + cProfile of both server processes
    python3 benchmarks/profile_serve.py --device cuda --client-procs 8 --num-prompts 256 --input-len 256 --output-len 128

A tiny model makes an engine step cost little, so the per-token work around it (SSE chunks, JSON,
the openai client's parsing, pipe messages) is what the served run measures. CPU seconds per output
token are the machine-independent numbers: on a host with a core per process (the GPU host has 16)
each process can carry 1 / (its CPU s per token) tokens/s at most, and the slowest one sets the pace.
Wall-clock tokens/s here are only comparable between rows of the same run (on a 2-core machine the
three processes share the cores). --cprofile runs the server with TG_SERVE_PROFILE
(text_generator/serve/profiling.py) and prints the top functions of DIR/http.prof and DIR/engine.prof;
profiling inflates those runs' times, so their tokens/s are not reported.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import signal
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core per process (the servers inherit it): no spinning
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.bench_engine import TINY  # noqa: E402
from benchmarks.bench_serve import ClientPool, Server, checkpoint  # noqa: E402
from benchmarks.common import LLAMA3_8B  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--num-prompts", type=int, default=128)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=4096)
    p.add_argument("--memory-fraction", type=float, default=0.8)
    p.add_argument("--client-procs", type=int, default=1)
    p.add_argument("--cprofile", action="store_true", help="also profile both server processes (a second server)")
    p.add_argument("--only-profile", action="store_true",
                   help="skip the timed rows: one profiled server run (with --cprofile implied)")
    p.add_argument("--cpu-clock", action="store_true",
                   help="profile by process CPU time, not wall time (a shared host's waits stay out)")
    p.add_argument("--top", type=int, default=18, help="functions shown per profile")
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--out", default=None, help="write the numbers as JSON here")
    a = p.parse_args()
    a.tiny = a.device == "cpu"
    a.repeats, a.server_threads = 1, None  # bench_serve's Server / run settings
    return a


def engine_alone(a, path, prompts, warm) -> dict:
    """LLMEngine.generate over the prompts (the bench_serve settings): wall tokens/s and CPU s per token."""
    from text_generator import LLMEngine, SamplingParams, TextGenerator
    from text_generator.tokenizer import load_tokenizer

    gen = TextGenerator.from_pretrained(path, device=a.device)
    engine = LLMEngine(gen, max_num_seqs=a.max_num_seqs, max_num_batched_tokens=a.max_num_batched_tokens,
                       max_seq_len=a.input_len + a.output_len + 16, kv_memory_fraction=a.memory_fraction,
                       tokenizer=load_tokenizer(path), output_kind="delta")  # as serve's engine process
    params = SamplingParams(temperature=0.0, max_new_tokens=a.output_len, ignore_eos=True, logprobs=1)
    engine.generate(warm, params, use_tqdm=False)  # untimed first pass: graphs, kernels
    engine.block_manager.reset_prefix_cache()
    t0, c0 = time.perf_counter(), time.process_time()
    outs = engine.generate(prompts, params, use_tqdm=False)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = sum(len(o.token_ids) for o in outs)
    return dict(output_tokens_per_s=tokens / seconds, output_tokens=tokens, seconds=seconds,
                cpu_us_per_token=1e6 * cpu / tokens)


def served(a, path, prompts, warm, clients: ClientPool, env: dict | None = None) -> dict:
    server = Server(a, path, len(prompts), env=env)
    try:
        server.measure(clients, warm, a.output_len, None)  # untimed first pass (other prompts: no prefix hits)
        res = server.measure(clients, prompts, a.output_len, None)
    finally:
        server.close()
    wall_per_token = res["seconds"] / res["output_tokens"]
    for k in ("client", "http", "engine_proc"):  # CPU % of wall -> CPU seconds per token
        pct = res["client_cpu_pct"] if k == "client" else res.get(f"{k}_cpu_pct")
        if pct is not None:
            res[f"{k}_cpu_us_per_token"] = 1e6 * wall_per_token * pct / 100
    return res


def top_functions(prof: str, n: int) -> str:
    import io

    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.strip_dirs().sort_stats("tottime").print_stats(n)
    st.sort_stats("cumulative").print_stats(n)
    return buf.getvalue()


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # under `timeout`: the server still stops
    a = parse_args()
    path = checkpoint(a)
    vocab = (TINY if a.tiny else LLAMA3_8B)["vocab_size"]
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, vocab, (a.input_len,), generator=g).tolist() for _ in range(a.num_prompts)]
    warm = [torch.randint(3, vocab, (a.input_len,), generator=g).tolist() for _ in range(a.num_prompts)]
    res = dict(device=a.device, num_prompts=a.num_prompts, input_len=a.input_len, output_len=a.output_len,
               max_num_seqs=a.max_num_seqs, client_procs=a.client_procs)
    clients = ClientPool(a.client_procs)
    try:
        if a.only_profile:
            a.cprofile = True
        else:
            timed_rows(a, path, prompts, warm, clients, res)
        if a.cprofile:
            folder = tempfile.mkdtemp(prefix="tg_serve_profile_")
            env = {"TG_SERVE_PROFILE": folder, **({"TG_SERVE_PROFILE_CLOCK": "cpu"} if a.cpu_clock else {})}
            served(a, path, prompts, warm, clients, env=env)
            for name in ("engine", "http"):
                prof = os.path.join(folder, f"{name}.prof")
                if os.path.exists(prof):
                    print(f"\n==== {name} process ({prof}) ====\n{top_functions(prof, a.top)}")
                else:
                    print(f"\n==== {name} process: no profile written ====")
    finally:
        clients.close()
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


def timed_rows(a, path, prompts, warm, clients, res) -> None:
    """The engine alone, then served (no profiler): tokens/s and CPU us per token of each process."""
    res["engine"] = e = engine_alone(a, path, prompts, warm)
    print("engine alone:", json.dumps(e), flush=True)
    res["served"] = s = served(a, path, prompts, warm, clients)
    print("served:", json.dumps(s), flush=True)
    print(f"\nCPU us per output token: engine alone {e['cpu_us_per_token']:.0f}; served: engine process "
          f"{s.get('engine_proc_cpu_us_per_token', float('nan')):.0f}, HTTP process "
          f"{s.get('http_cpu_us_per_token', float('nan')):.0f}, client ({a.client_procs} process(es), "
          f"busiest) {s['client_cpu_us_per_token']:.0f}")
    print(f"tokens/s: engine alone {e['output_tokens_per_s']:.0f}, served {s['output_tokens_per_s']:.0f}", flush=True)


if __name__ == "__main__":
    main()
