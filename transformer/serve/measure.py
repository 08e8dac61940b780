"""Tokens per second, time to first token and latency a server delivers to 1, 4, 8 and 16
concurrent clients.

    python -m transformer.serve.measure --workdir=runs/tiny          starts its own server
    python -m transformer.serve.measure --url=http://127.0.0.1:8000   measures a running one
    python -m transformer.serve.measure --workdir=runs/tiny --nostream  unstreamed requests

Each client sends streamed completions one after the other (temperature 0.8, its own seeds,
the prompt "def "), about `--tokens_per_client` tokens per round in all. Two tables:
- **within the context** (the headline): each request asks for as many new tokens as fit in
  the context after the prompt (`/v1/models`' context_length minus the prompt's tokens, from
  the server's `usage`), so the model never has to slide its window: what a client asking
  for in-context text gets;
- **past the context** (`--past_tokens`, default 128, 0 to skip): requests longer than the
  context, which the server re-prefills every S - W + 1 tokens (decode.py's window policy):
  what a long generation costs.
Per round: tokens/s is every token the server made (its /health counter) over the round's
wall time; CPU per token is the CPU time the server process (when this command started it)
and the measuring clients used over the tokens made: it depends far less than tokens/s on
what else runs on the machine, so it compares servers on a shared one; time to first token
(TTFT) is from sending a request to its first piece of text;
latency from sending it to its `[DONE]`. Figures are medians over `--repeats` rounds
(tokens/s) and p50/p99 over all requests of all rounds. The CPU model and the load average
are printed first: timings on a loaded machine are rough; compare the ratio to one client.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from absl import flags

from transformer import cli, host

_URL = flags.DEFINE_string("url", None, "A running server (default: start one on --workdir).")
_SERVER_PID = flags.DEFINE_integer(
    "server_pid", None, "With --url: the server's process id, for its CPU per token.")
_WORKDIR = flags.DEFINE_string("workdir", None, "A run to serve for the measurement.")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 16, "The started server's --max_batch.")
_CLIENTS = flags.DEFINE_list("clients", ["1", "4", "8", "16"], "Concurrent clients.")
_TOKENS_PER_CLIENT = flags.DEFINE_integer(
    "tokens_per_client", 2048, "New tokens each client asks for per round (in requests one "
    "after the other). 512 made rounds of 0.1-0.8 s, which a shared machine's scheduling "
    "swung by 2x.")
_MAX_TOKENS = flags.DEFINE_integer(
    "max_tokens", 0, "New tokens per request of the headline table (0: as many as fit in the "
    "context after the prompt).")
_PAST_TOKENS = flags.DEFINE_integer(
    "past_tokens", 128, "New tokens per request of the second table, past the context (0: "
    "no second table).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Rounds per client count.")
_STREAM = flags.DEFINE_bool(
    "stream", True, "Streamed requests (server-sent events; time to first token measured); "
    "--nostream: each request's whole text in one JSON answer (no TTFT).")


def _served_tokens(http, url) -> int:
    return http.get(f"{url}/health", timeout=60).json()["served"]["tokens"]


PROMPT = "def "


def in_context_tokens(url: str) -> int:
    """How many new tokens fit in the served model's context after PROMPT."""
    import httpx

    with httpx.Client(timeout=600) as http:
        context = http.get(f"{url}/v1/models").json()["data"][0]["context_length"]
        reply = http.post(f"{url}/v1/completions",
                          json=dict(prompt=PROMPT, max_tokens=1, temperature=0.0)).json()
    return context - reply["usage"]["prompt_tokens"]


def one_request(http, url, seed: int, max_tokens: int,
                stream: bool = True) -> tuple[float, float]:
    """(seconds to the first piece of text, seconds to [DONE]) of one streamed request; of
    one unstreamed request, (nan, seconds to its answer)."""
    begin, first = time.perf_counter(), None
    body = dict(prompt=PROMPT, max_tokens=max_tokens, temperature=0.8, seed=seed, stream=stream)
    if not stream:
        reply = http.post(f"{url}/v1/completions", json=body, timeout=600)
        reply.raise_for_status()
        reply.json()
        return float("nan"), time.perf_counter() - begin
    with http.stream("POST", f"{url}/v1/completions", json=body, timeout=600) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if first is None and line.startswith("data: {"):
                if any(c.get("text") for c in json.loads(line[6:]).get("choices", [])):
                    first = time.perf_counter() - begin
    return first if first is not None else float("nan"), time.perf_counter() - begin


def cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system) process `pid` has used, all its threads (0 without /proc)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(url: str, clients: int, requests: int, max_tokens: int, pid=None,
              stream: bool = True):
    """(tokens/s of the round, [(ttft, latency)] of its requests, server CPU ms per token,
    clients' CPU ms per token). The CPU figures do not depend on what else the machine runs:
    on a shared machine they say what the round would cost with the cores to itself. The
    server's is 0 unless `pid` (a server on this machine) is given."""
    import httpx

    timings = []
    lock = threading.Lock()
    # Each client's connection pool is made before the clock starts: an httpx.Client builds
    # an SSL context (~10 ms of CPU), which at 8 clients was a third of the clients' CPU in
    # a round and ran on the cores the server needs.
    stack = contextlib.ExitStack()
    pools = [stack.enter_context(httpx.Client(timeout=600)) for _ in range(clients)]

    def client(c):
        for r in range(requests):
            t = one_request(pools[c], url, c * 1000 + r, max_tokens, stream)
            with lock:
                timings.append(t)

    with stack, httpx.Client() as http:
        before = _served_tokens(http, url)
        threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
        server_cpu, own_cpu = cpu_seconds(pid), time.process_time()
        begin = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - begin
        server_cpu, own_cpu = cpu_seconds(pid) - server_cpu, time.process_time() - own_cpu
        made = _served_tokens(http, url) - before
    return made / wall, timings, 1e3 * server_cpu / made, 1e3 * own_cpu / made


def _percentile(xs, q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def measure(url: str, clients_list, requests: int, max_tokens: int, repeats: int, out=print,
            pid=None, stream: bool = True):
    """One table: a line per client count."""
    one_round(url, 1, 1, max_tokens, stream=stream)  # the first request of a fresh server
    base = None
    for clients in clients_list:
        rates, timings, server_ms, client_ms = [], [], [], []
        for _ in range(repeats):
            rate, t, server, own = one_round(url, clients, requests, max_tokens, pid, stream)
            rates.append(rate)
            timings += t
            server_ms.append(server)
            client_ms.append(own)
        rate = statistics.median(rates)
        base = base or rate
        ttft, latency = [t[0] for t in timings], [t[1] for t in timings]
        ttft_text = (f"TTFT p50 {_percentile(ttft, 50):.3f} s, p99 {_percentile(ttft, 99):.3f} s"
                     if stream else "TTFT n/a (not streamed)")
        out(f"{clients:>3} client(s): {rate:8,.0f} tokens/s ({rate / base:4.1f}x one client; "
            f"rounds {', '.join(f'{r:,.0f}' for r in rates)}); {ttft_text}"
            f"; latency p50 {_percentile(latency, 50):.2f} s, "
            f"p99 {_percentile(latency, 99):.2f} s; CPU per token: server "
            f"{statistics.median(server_ms):.3f} ms, clients {statistics.median(client_ms):.3f} ms")


def _start_server(workdir: str, max_batch: int, max_tokens: int):
    """A `python -m transformer serve` on a free 127.0.0.1 port; (process, url)."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "transformer", "serve", f"--workdir={workdir}", f"--port={port}",
         f"--max_batch={max_batch}", f"--max_tokens={max(max_tokens, 16)}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            cli.fail(f"the server on {workdir} exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.terminate()
    cli.fail("the server did not start within 10 minutes")


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    if (_URL.value is None) == (_WORKDIR.value is None):
        cli.fail("give one of --url=http://HOST:PORT or --workdir=RUN")
    print(f"cpu: {host.cpu_model()}, {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    proc, url = None, _URL.value
    if url is None:
        proc, url = _start_server(_WORKDIR.value, _MAX_BATCH.value,
                                  max(_MAX_TOKENS.value, _PAST_TOKENS.value, 256))
        print(f"server: --workdir={_WORKDIR.value} --max_batch={_MAX_BATCH.value}", flush=True)
    try:
        within = _MAX_TOKENS.value or in_context_tokens(url)
        tables = [("within the context", within)]
        if _PAST_TOKENS.value:
            tables.append(("past the context", _PAST_TOKENS.value))
        for name, max_tokens in tables:
            requests = max(1, -(-_TOKENS_PER_CLIENT.value // max_tokens))
            print(f"{name}: {requests} {'streamed' if _STREAM.value else 'unstreamed'} "
                  f"requests of {max_tokens} new tokens per client per round", flush=True)
            measure(url, list(map(int, _CLIENTS.value)), requests, max_tokens, _REPEATS.value,
                    out=lambda line: print(line, flush=True),
                    pid=_SERVER_PID.value if proc is None else proc.pid, stream=_STREAM.value)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    cli.run(main)
