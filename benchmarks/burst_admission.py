"""How fast `serve` takes in a burst of requests when the load generator costs nothing: --num-prompts
pre-built HTTP requests (streaming completions of --input-len token ids) written at once on connections
opened beforehand, raw asyncio sockets instead of the openai client. With the server's TG_SERVE_TRACE
(its FILE.http: each request's handler start and submission) it reports when the first handler began
and when the last request was submitted, after the first byte was sent.

    python3 benchmarks/burst_admission.py                       # CPU, tiny random model
    python3 benchmarks/burst_admission.py --device cuda         # the Llama-3-8B shape

bench_serve's served passes start their clock when the first openai-client request starts; this tells
how much of their delay before the first engine step is the server's (here) and how much the load
generator's (building its requests and opening its connections inside the timed window).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.bench_serve import BLOCK_SIZE, Server, checkpoint, read_trace  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--num-prompts", type=int, default=512)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=4)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--max-num-batched-tokens", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--checkpoint", default=None)
    a = p.parse_args()
    a.tiny = a.device == "cpu"
    a.max_model_len = a.input_len + a.output_len + 16
    a.num_blocks = -(-5 * a.max_num_seqs * -(-a.max_model_len // BLOCK_SIZE) // 4) + 1
    a.server_threads, a.trace = None, True
    return a


def requests(a, vocab: int) -> list[bytes]:
    out = []
    for _ in range(a.num_prompts):
        body = json.dumps(dict(model="m", prompt=[random.randrange(3, vocab) for _ in range(a.input_len)],
                               max_tokens=a.output_len, temperature=0.0, logprobs=1, stream=True,
                               ignore_eos=True)).encode()
        out.append(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return out


async def burst(port: int, reqs: list[bytes]) -> tuple[float, float]:
    """Open every connection, then write every request at one moment and read each stream to its
    [DONE] -> (first write, last write) times."""
    sent: list[float] = []
    t_start = time.perf_counter() + 1.0  # all connections open by then

    async def one(req: bytes) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.sleep(max(t_start - time.perf_counter(), 0.0))
        sent.append(time.perf_counter())
        writer.write(req)
        await writer.drain()
        data = b""
        while b"[DONE]" not in data:
            chunk = await reader.read(1 << 16)
            if not chunk:
                break
            data += chunk[-64:] if len(data) > 4096 else chunk
        writer.close()

    await asyncio.gather(*(one(r) for r in reqs))
    return min(sent), max(sent)


def main() -> None:
    a = parse_args()
    path = checkpoint(a)
    from benchmarks.bench_engine import TINY
    from benchmarks.common import LLAMA3_8B

    vocab = (TINY if a.tiny else LLAMA3_8B)["vocab_size"]
    server = Server(a, path, a.num_prompts)
    try:
        print(f"server ready in {server.startup_s:.1f} s; {a.num_prompts} requests of {a.input_len} token ids",
              flush=True)
        for i in range(a.rounds + 1):  # the first round untimed (warm)
            first, last = asyncio.run(burst(server.port, requests(a, vocab)))
            time.sleep(0.5)
            rows = [r for r in read_trace(server.trace + ".http") if r[0] >= first]
            if i and rows:
                print(f"round {i}: all written within {1e3 * (last - first):.0f} ms; first handler began "
                      f"{1e3 * (min(r[0] for r in rows) - first):.0f} ms after the first write, last request "
                      f"submitted at {1e3 * (max(r[1] for r in rows) - first):.0f} ms ({len(rows)} requests)",
                      flush=True)
    finally:
        server.close()


if __name__ == "__main__":
    main()
