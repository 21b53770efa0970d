"""A load generator for `wgspec serve`: for each level N of concurrency, the same R streamed
completions over benches/prompts.json (request i: prompt i mod the prompts' count) sent by N
concurrent clients, R / N each one after another, through the official `openai` Python client
(real HTTP on loopback). Per N it reports the total output tokens/s, time to first token (TTFT),
inter-token latency (ITL: the gaps between streamed chunks; tokens a cycle accepted together may
come in one) and time per output token (TPOT), each at p50 and p99, and checks that every
reply's text is its solo run's (greedy, or sampled with a per-request seed): a request's output
must not depend on who else is served.

    target/venv/bin/python scripts/load_test.py --bin target/release/wgspec --model smollm2-135m \
        --concurrency 1,2,4,8,16 --requests 16 --max-tokens 32 [--draft ngram] [--out load.json]

It starts its own server (`--bin`, `--model`, `--draft`, and `--server-arg` for more), or loads
one already running (`--url`). The solo runs come first, one request at a time; then each level
runs on a server of its own, started afresh and warmed by one request of another prompt, so that
it finds in the prefix cache only what its own requests computed (not the solo runs' prompts,
nor an earlier level's; with `--url` the levels share the running server): each level reports
the positions its requests found cached (a request repeating an earlier one's prompt, or a
preempted one coming back). Every wait is
bounded; a failure exits non-zero with the reason, and the server it started is stopped.
"""

import argparse
import asyncio
import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time
import urllib.request

import openai

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from server_clients import Fail, wait_ready  # noqa: E402 (the server tests' own)


def log(msg):
    print(f"[load] {msg}", file=sys.stderr, flush=True)


def start_server(args, stderr):
    """`wgspec serve --port 0` (its stderr into the file `stderr`): (process, base URL) once it
    prints its address, within a minute."""
    cmd = [args.bin, "serve", "--model", args.model, "--port", "0", "--draft", args.draft]
    cmd += ["--max-queue", str(max(64, 2 * max(args.concurrency)))]
    cmd += args.server_arg
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        proc.kill()
        stderr.seek(0)
        raise Fail(f"wgspec serve printed {line!r} first; its stderr ends: {stderr.read()[-2000:]!r}")
    return proc, m.group(1).rstrip("/")


def stop_server(proc):
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def cached_tokens(url):
    """The positions the server's requests found in its prefix cache so far (/metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("wgspec_prefix_cache_hit_tokens_total "):
                return int(float(line.split()[1]))
    raise Fail("/metrics has no wgspec_prefix_cache_hit_tokens_total")


def percentile(values, q):
    """The q-th percentile (0-100) by linear interpolation; None for no values."""
    if not values:
        return None
    v = sorted(values)
    at = (len(v) - 1) * q / 100
    lo = int(at)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (at - lo)


class Request:
    """One request of the run: its prompt, its sampling, and what came back."""

    def __init__(self, index, prompt, args):
        self.index = index
        self.model = args.served
        self.name = prompt["name"]
        self.prompt = prompt["prompt"]
        self.sampled = args.temperature > 0
        self.params = {"max_tokens": args.max_tokens, "temperature": args.temperature}
        if self.sampled:
            self.params["seed"] = args.seed + index
        self.text = None
        self.tokens = 0
        self.ttft = None
        self.gaps = []
        self.seconds = None

    def key(self):
        """The solo run this request must match."""
        return (self.name, self.params.get("seed"))


async def send(client, req, timeout):
    """Streams `req`; records its text, tokens, TTFT, chunk gaps and end-to-end time."""
    t0 = time.perf_counter()
    last = None
    parts = []
    stream = await asyncio.wait_for(
        client.completions.create(
            model=req.model,
            prompt=req.prompt,
            stream=True,
            stream_options={"include_usage": True},
            **req.params,
        ),
        timeout,
    )
    async for chunk in stream:
        now = time.perf_counter()
        if chunk.usage is not None:
            req.tokens = chunk.usage.completion_tokens
        text = "".join(c.text or "" for c in chunk.choices)
        if not text:
            continue
        if last is None:
            req.ttft = now - t0
        else:
            req.gaps.append(now - last)
        last = now
        parts.append(text)
    req.seconds = time.perf_counter() - t0
    req.text = "".join(parts)


async def run_level(url, n, requests, timeout):
    """N clients, each sending its share of `requests` one after another; the wall time."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=timeout)

    async def one_client(mine):
        for req in mine:
            await send(client, req, timeout)

    t0 = time.perf_counter()
    await asyncio.gather(*(one_client(requests[i::n]) for i in range(n)))
    wall = time.perf_counter() - t0
    await client.close()
    return wall


def summary(n, wall, requests, solo):
    tokens = sum(r.tokens for r in requests)
    tpot = [(r.seconds - r.ttft) / (r.tokens - 1) for r in requests if r.tokens > 1 and r.ttft]
    ttft = [r.ttft for r in requests if r.ttft is not None]  # (a reply may stream no text)
    differ = [r.name for r in requests if r.text != solo[r.key()]]
    ms = lambda v: None if v is None else round(v * 1000, 1)  # noqa: E731
    return {
        "concurrency": n,
        "requests": len(requests),
        "output_tokens": tokens,
        "seconds": round(wall, 3),
        "output_tokens_per_second": round(tokens / wall, 2),
        "ttft_ms": {"p50": ms(percentile(ttft, 50)), "p99": ms(percentile(ttft, 99))},
        "itl_ms": {"p50": ms(percentile([g for r in requests for g in r.gaps], 50)),
                   "p99": ms(percentile([g for r in requests for g in r.gaps], 99))},
        "tpot_ms": {"p50": ms(percentile(tpot, 50)), "p99": ms(percentile(tpot, 99))},
        "differ_from_solo": differ,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/wgspec"))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--draft", default="none")
    ap.add_argument("--server-arg", action="append", default=[], help="one more argument of wgspec serve")
    ap.add_argument("--url", help="a running server instead of starting one")
    ap.add_argument("--concurrency", default="1,2,4,8,16", help="the levels of concurrent clients")
    ap.add_argument("--requests", type=int, default=16, help="requests at each level, shared by its clients")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1, help="request i samples with seed SEED + i")
    ap.add_argument("--prompts", default=os.path.join(ROOT, "benches/prompts.json"))
    ap.add_argument("--timeout", type=float, default=600, help="seconds one request may take")
    ap.add_argument("--out", help="the figures as JSON")
    args = ap.parse_args()
    args.concurrency = [int(n) for n in args.concurrency.split(",")]
    prompts = json.load(open(args.prompts))
    proc = None
    stderr = tempfile.TemporaryFile(mode="w+")
    try:
        if args.url:
            url = args.url.rstrip("/")
            args.draft = "(the running server's)"
        else:
            proc, url = start_server(args, stderr)
        wait_ready(url, 300)
        with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as r:
            args.served = json.load(r)["data"][0]["id"]
        log(f"server {url}, {len(prompts)} prompts, {args.max_tokens} tokens each")
        # the solo runs: every (prompt, seed) the levels send, alone
        levels = {}
        for n in args.concurrency:
            levels[n] = [Request(i, prompts[i % len(prompts)], args) for i in range(args.requests)]
        solo = {}
        for reqs in levels.values():
            for r in reqs:
                if r.key() not in solo:
                    alone = Request(r.index, {"name": r.name, "prompt": r.prompt}, args)
                    alone.params = dict(r.params)
                    asyncio.run(run_level(url, 1, [alone], args.timeout))
                    solo[r.key()] = alone.text
        log(f"{len(solo)} solo runs")
        results = []
        for n, reqs in levels.items():
            if proc is not None:
                # (a fresh server: its prefix cache empty)
                stop_server(proc)
                proc = None
                proc, url = start_server(args, stderr)
                wait_ready(url, 300)
                # (its first passes, lazily made buffers and measured pass costs: as the solo
                # runs left the first server)
                warm = Request(0, {"name": "warm-up", "prompt": "A warm-up request."}, args)
                asyncio.run(run_level(url, 1, [warm], args.timeout))
            hits = cached_tokens(url)
            wall = asyncio.run(run_level(url, n, reqs, args.timeout))
            s = summary(n, wall, reqs, solo)
            s["prompt_tokens_cached"] = cached_tokens(url) - hits
            results.append(s)
            log(
                f"N={n:<3} {s['output_tokens_per_second']:8.2f} tok/s  TTFT p50 {s['ttft_ms']['p50']} ms "
                f"p99 {s['ttft_ms']['p99']} ms  ITL p50 {s['itl_ms']['p50']} ms p99 {s['itl_ms']['p99']} ms  "
                f"{s['prompt_tokens_cached']} cached  {len(s['differ_from_solo'])} of {len(reqs)} differ from solo"
            )
        out = {"url": url, "model": args.model, "draft": args.draft, "max_tokens": args.max_tokens,
               "temperature": args.temperature, "levels": results}
        if args.out:
            with open(args.out, "w") as f:
                json.dump(out, f, indent=1)
        else:
            print(json.dumps(out, indent=1))
        bad = [(s["concurrency"], s["differ_from_solo"]) for s in results if s["differ_from_solo"]]
        if bad:
            raise Fail(f"replies differ from their solo runs: {bad}")
    except (Fail, OSError, openai.OpenAIError, asyncio.TimeoutError) as e:
        log(f"FAILED: {e!r}")
        sys.exit(1)
    finally:
        if proc is not None:
            stop_server(proc)


if __name__ == "__main__":
    main()
