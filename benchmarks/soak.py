"""Soak: thousands of mixed requests, a fifth of whose clients walk away, against one server.

    python benchmarks/soak.py [--num-requests 20000 --concurrency 64 --max-tokens 64]
    python benchmarks/soak.py --url http://127.0.0.1:8000   # a running server, with a chat template

The driver is minivllm/bench/soak.py: requests mix prompt lengths (shared prefixes among
them), n from 1 to 4, random stop strings, completions and chat, streamed or not; 20% of the
clients disconnect. Every answer that is read whole is checked (n indexed choices, a finish
reason, usage, [DONE]); after the run every KV block must be free in both pools, and the
server's RSS is sampled after each half. tests/e2e/test_hardening_soak.py runs a short
variant of the same driver.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import httpx

from minivllm.bench.server_process import free_port, start_server, stop_server
from minivllm.bench.soak import SoakResult, make_requests, rss_mb, run_soak, wait_idle

# For the server this script starts: the stories models have no chat template of their own.
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }} "
                 "{% endfor %}assistant:")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--model", default="../shared/models/stories260K")
    parser.add_argument("--num-requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-args", default="--max-num-seqs 32 --num-kv-blocks 256 "
                        "--swap-space 0.05", help="flags for the server this script starts")
    args = parser.parse_args()
    proc, url = None, args.url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        cmd = [sys.executable, "-m", "minivllm.cli", "serve", args.model,
               "--port", str(port), "--log-interval", "10", "--chat-template", CHAT_TEMPLATE,
               *args.server_args.split()]
        proc, _ = start_server(cmd, Path("soak-server.log"), url, timeout=120)
    try:
        model = httpx.get(url + "/v1/models").json()["data"][0]["id"]
        requests = make_requests(args.num_requests, args.seed, model, args.max_tokens)
        half = len(requests) // 2
        total = SoakResult()
        for part, chunk in (("first half", requests[:half]), ("second half", requests[half:])):
            result = asyncio.run(run_soak(url, chunk, args.concurrency))
            wait_idle(url)
            total.merge(result)
            rss = f", server RSS {rss_mb(proc.pid):.1f} MiB" if proc else ""
            print(f"{part}: {len(chunk)} requests in {result.elapsed_s:.1f} s "
                  f"({len(chunk) / result.elapsed_s:.1f} req/s), {dict(result.statuses)}{rss}")
        for failure in total.failures[:20]:
            print("FAILURE", failure)
        print(f"all KV blocks free; {len(total.failures)} failures")
        return 1 if total.failures else 0
    finally:
        if proc is not None:
            stop_server(proc)


if __name__ == "__main__":
    sys.exit(main())
