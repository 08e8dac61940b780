"""Tokens per second a running server delivers to 1 and to several concurrent clients.

    python -m transformer.serve.measure --url=http://127.0.0.1:8000 --clients=1,8

Each client sends `--requests` completions one after the other (max_tokens `--max_tokens`,
temperature 0.8, its own seeds); the figure is all completion tokens over the wall time,
median of `--repeats` rounds. The server runs requests one at a time (engine.py), so with 8
clients the total stays about that of one, and each client waits its turn.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time

from absl import flags

from transformer import cli

_URL = flags.DEFINE_string("url", "http://127.0.0.1:8000", "The server.")
_CLIENTS = flags.DEFINE_list("clients", ["1", "8"], "Concurrent clients, one figure each.")
_REQUESTS = flags.DEFINE_integer("requests", 4, "Requests per client per round.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 128, "New tokens per request.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Rounds; the median is printed.")


def one_round(url: str, clients: int, requests: int, max_tokens: int) -> float:
    import httpx

    tokens = [0] * clients

    def client(c):
        with httpx.Client(timeout=600) as http:
            for r in range(requests):
                reply = http.post(f"{url}/v1/completions", json=dict(
                    prompt="def ", max_tokens=max_tokens, temperature=0.8, seed=c * 1000 + r))
                reply.raise_for_status()
                tokens[c] += reply.json()["usage"]["completion_tokens"]

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    begin = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(tokens) / (time.perf_counter() - begin)


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    one_round(_URL.value, 1, 1, _MAX_TOKENS.value)  # the first request of a fresh server
    for clients in map(int, _CLIENTS.value):
        rates = [one_round(_URL.value, clients, _REQUESTS.value, _MAX_TOKENS.value)
                 for _ in range(_REPEATS.value)]
        print(f"{clients} client(s): {statistics.median(rates):,.0f} tokens/s "
              f"(rounds: {', '.join(f'{r:,.0f}' for r in rates)})", file=sys.stdout, flush=True)


if __name__ == "__main__":
    cli.run(main)
