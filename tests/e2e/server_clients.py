"""`wgspec serve` as real applications use it: the official `openai` Python client against one
replica, then two replicas behind Debian's nginx with `deploy/nginx.conf`, one of them stopped
half way. Part of `./build.sh test` (which creates the virtualenv with the pinned client).

    python tests/e2e/server_clients.py --bin target/release/wgspec --model PATH_TO_SMOLLM2_GGUF

Every wait is bounded; any failure exits non-zero with the reason, and the servers are stopped.
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import openai

PROMPT = "The three primary colours are"
QUESTION = "Name a primary colour."
TOKENS = 8


def log(msg):
    print(f"[clients] {msg}", flush=True)


class Fail(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Fail(what)


def start_replica(args, *extra):
    """Starts `wgspec serve --port 0`; returns (process, base URL) once it prints its address."""
    proc = subprocess.Popen(
        [args.bin, "serve", "--model", args.model, "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    line = proc.stdout.readline()  # the first line, printed before the model loads
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        proc.kill()
        raise Fail(f"unexpected first line from wgspec serve: {line!r}")
    return proc, m.group(1).rstrip("/")


def wait_ready(url, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise Fail(f"{url} not ready within {timeout} s")


def cli_json(args, *extra):
    out = subprocess.run(
        [args.bin, "generate", "--model", args.model, "--max-tokens", str(TOKENS), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    check(out.returncode == 0, f"wgspec generate failed: {out.stderr}")
    return json.loads(out.stdout)


def stop(proc, what):
    """SIGTERM, then the exit status (0 expected)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise Fail(f"{what} did not stop within 60 s of SIGTERM")
    return code


def one_replica(args):
    proc, url = start_replica(args)
    try:
        wait_ready(url)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=300, max_retries=0)

        ids = [m.id for m in client.models.list().data]
        check(len(ids) == 1, f"one model listed: {ids}")
        model = ids[0]
        retrieved = client.models.retrieve(model)
        check(retrieved.id == model and retrieved.object == "model", f"models.retrieve: {retrieved}")
        try:
            client.models.retrieve("no-such-model")
            raise Fail("models.retrieve of an unknown model must fail")
        except openai.NotFoundError as e:
            check(e.code == "model_not_found", f"an unknown model: {e}")

        # Completions: greedy text equals the CLI's.
        want = cli_json(args, "--prompt", PROMPT)["text"]
        got = client.completions.create(model=model, prompt=PROMPT, max_tokens=TOKENS, temperature=0)
        check(got.choices[0].text == want, f"completion {got.choices[0].text!r} != CLI {want!r}")
        check(got.usage.completion_tokens == TOKENS or got.choices[0].finish_reason == "stop", "usage")
        check(got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens, "usage adds up")
        # A list of prompts (LangChain's batches): a choice per prompt, each its prompt's text alone.
        other = client.completions.create(model=model, prompt=QUESTION, max_tokens=TOKENS, temperature=0)
        both = client.completions.create(model=model, prompt=[PROMPT, QUESTION], max_tokens=TOKENS, temperature=0)
        texts = [c.text for c in sorted(both.choices, key=lambda c: c.index)]
        check(texts == [want, other.choices[0].text], f"a list of prompts: {texts}")
        check(both.usage.prompt_tokens == got.usage.prompt_tokens + other.usage.prompt_tokens, "usage per prompt")

        # Speculation through the request's own field: same text, stats attached.
        spec = client.completions.create(
            model=model, prompt=PROMPT, max_tokens=TOKENS, temperature=0, extra_body={"draft": "ngram"}
        )
        check(spec.choices[0].text == want, "n-gram speculation gives the plain text")
        stats = (spec.model_extra or {}).get("wgspec") or {}
        check(stats.get("draft") == "ngram", f"wgspec stats name the draft: {stats}")

        # Chat: the model's template; whole and streamed agree, the stream ends with usage.
        want_chat = cli_json(args, "--chat", "--prompt", QUESTION)["text"]
        messages = [{"role": "user", "content": QUESTION}]
        chat = client.chat.completions.create(model=model, messages=messages, max_tokens=TOKENS, temperature=0)
        check(chat.choices[0].message.role == "assistant", "assistant role")
        check(chat.choices[0].message.content == want_chat, f"chat {chat.choices[0].message.content!r} != CLI {want_chat!r}")
        pieces, usage, finish, ids_seen = [], None, None, set()
        stream = client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            ids_seen.add(chunk.id)
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                pieces.append(c.delta.content or "")
                finish = c.finish_reason or finish
        check(len(ids_seen) == 1, f"one id for every chunk: {ids_seen}")
        check("".join(pieces) == want_chat, f"streamed {''.join(pieces)!r} != {want_chat!r}")
        check(finish in ("stop", "length"), f"finish reason {finish}")
        check(usage is not None and usage.completion_tokens == chat.usage.completion_tokens, "usage chunk")

        # n choices: choice i is the request with seed + i alone; the prompt found cached.
        sampled = dict(model=model, messages=messages, max_tokens=TOKENS, temperature=0.9)
        alone = [client.chat.completions.create(**sampled, seed=11 + i).choices[0].message.content for i in range(2)]
        both = client.chat.completions.create(**sampled, seed=11, n=2)
        got = [c.message.content for c in sorted(both.choices, key=lambda c: c.index)]
        check(got == alone, f"n=2: {got!r} != each seed alone {alone!r}")
        details = both.usage.prompt_tokens_details
        # (the solo runs computed the prompt: its whole pages below its newest token are found)
        cached = details.cached_tokens if details is not None else 0
        check(0 < cached < both.usage.prompt_tokens, f"cached tokens: {both.usage}")

        # vLLM's min_p through extra_body (what vLLM's clients send): the CLI's sampled text for
        # the same seed, min-p and temperature.
        want_min_p = cli_json(args, "--prompt", PROMPT, "--temperature", "1.2", "--min-p", "0.2", "--seed", "5")["text"]
        got = client.completions.create(
            model=model, prompt=PROMPT, max_tokens=TOKENS, temperature=1.2, seed=5, extra_body={"min_p": 0.2}
        )
        check(got.choices[0].text == want_min_p, f"min_p {got.choices[0].text!r} != CLI {want_min_p!r}")
        loose = cli_json(args, "--prompt", PROMPT, "--temperature", "1.2", "--seed", "5")["text"]
        print(f"min_p 0.2 at T 1.2: {want_min_p!r}; without it: {loose!r}")

        # A request the server cannot serve: a clear 400 through the client's own error type.
        try:
            client.chat.completions.create(model=model, messages=messages, max_tokens=TOKENS, n=9)
            raise Fail("n=9 was accepted")
        except openai.BadRequestError as e:
            check("n" in str(e), f"the error names the field: {e}")
        log(f"openai {openai.__version__}: models, completions, n-gram, chat, stream, n, errors: ok")
    finally:
        code = stop(proc, "the replica")
    check(code == 0, f"the replica exited {code} on SIGTERM")


def behind_nginx(args):
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    check(os.path.exists(nginx), "nginx is not installed (./build.sh setup installs it)")
    (a, url_a), (b, url_b) = start_replica(args), start_replica(args)
    prefix = tempfile.mkdtemp(prefix="wgspec-nginx-")
    front = None
    try:
        wait_ready(url_a)
        wait_ready(url_b)
        port_a, port_b = url_a.rsplit(":", 1)[1], url_b.rsplit(":", 1)[1]
        with open(os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "nginx.conf")) as f:
            conf = f.read()
        # The shipped file with the replicas' and the front's actual ports.
        front_port = free_port()
        conf = conf.replace("127.0.0.1:8081", f"127.0.0.1:{port_a}").replace("127.0.0.1:8082", f"127.0.0.1:{port_b}")
        conf = conf.replace("listen 127.0.0.1:8080", f"listen 127.0.0.1:{front_port}")
        path = os.path.join(prefix, "nginx.conf")
        with open(path, "w") as f:
            f.write(conf)
        front = subprocess.Popen([nginx, "-c", path, "-p", prefix, "-g", "daemon off;"], stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{front_port}"
        wait_ready(url, timeout=30)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=300, max_retries=0)
        model = client.models.list().data[0].id
        texts = set()
        for _ in range(4):
            r = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0)
            texts.add(r.choices[0].text)
        check(len(texts) == 1, f"every replica gives the same greedy text: {texts}")
        code = stop(a, "replica A")
        check(code == 0, f"replica A exited {code}")
        for _ in range(3):
            r = client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0)
            check(r.choices[0].text in texts, "the remaining replica answers alike")
        log("two replicas behind nginx: 4 requests, one replica stopped, 3 more requests: ok")
    finally:
        if front is not None:
            front.send_signal(signal.SIGQUIT)
            try:
                front.wait(timeout=30)
            except subprocess.TimeoutExpired:
                front.kill()
        for proc in (a, b):
            if proc.poll() is None:
                stop(proc, "a replica")
        shutil.rmtree(prefix, ignore_errors=True)


def free_port():
    """A free loopback port (bound, then released for nginx to take)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--model", required=True)
    args = p.parse_args()
    t = time.time()
    try:
        one_replica(args)
        behind_nginx(args)
    except (Fail, openai.OpenAIError, OSError, subprocess.SubprocessError) as e:
        print(f"[clients] FAIL: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    log(f"PASS in {time.time() - t:.1f} s")


if __name__ == "__main__":
    main()
