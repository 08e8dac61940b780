"""Serve a trained run over HTTP: OpenAI's completions API and a page that shows attention.

    python -m transformer serve --workdir=runs/tiny                 http://127.0.0.1:8000/
    python -m transformer serve --hf=path/to/gpt2 --port=8080
    python -m transformer.serve --workdir=runs/tiny                 (the same)

    curl -s 127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \
        -d '{"prompt": "def ", "max_tokens": 40, "temperature": 0.8, "seed": 0}'

Binds 127.0.0.1 unless --host says otherwise (then --api_key=KEY is required). The programs
requests run are compiled before the server answers (`warm up`); `GET /health` answers once
it does. docs/serving.md.
"""

from __future__ import annotations

from pathlib import Path

from absl import flags

from transformer import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "A training run's workdir.")
_HF = flags.DEFINE_string("hf", None, "Instead of --workdir: a Hugging Face GPT-2 or Llama "
                          "folder (docs/huggingface.md).")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest good one).")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to bind (0.0.0.0: every interface; "
                            "then --api_key is required).")
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 256, "The most new tokens one request may ask "
                                   "for (per choice).")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 8, "Rows decoded together (choices of all "
                                  "requests); the KV cache for them is allocated at start-up.")
_API_KEY = flags.DEFINE_string("api_key", None, "Clients must send 'Authorization: Bearer KEY' "
                               "(OpenAI clients: api_key=KEY). Required unless --host is a "
                               "loopback address.")
_MAX_QUEUE = flags.DEFINE_integer("max_queue", 64, "The most requests in the server at once, "
                                  "running or waiting; more get HTTP 429.")
_MAX_BODY = flags.DEFINE_integer("max_body", 16 * 2**20, "The largest request body in bytes; "
                                 "larger ones get HTTP 413.")
_NAME = flags.DEFINE_string("name", None, "The model id clients name (default: the workdir's "
                            "or folder's name).")


def load():
    """(model_config, params, tokenizer, step, default name) of --workdir or --hf."""
    if _HF.value is not None:
        from transformer.hf import load as hf_import
        model_config, params, tokenizer = hf_import.load_pretrained(_HF.value)
        config = hf_import.read_config(_HF.value, f"--hf={_HF.value}")
        return (model_config, params, hf_import.ending_at(tokenizer, _HF.value, config), "hf",
                Path(_HF.value).resolve().name)
    from transformer import checkpoint

    # The run's newest good checkpoint on one device, as sample.py reads it.
    run = checkpoint.load_run(_WORKDIR.value, step=_STEP.value)
    return (run.model_config, run.params, run.tokenizer, run.step,
            Path(_WORKDIR.value).resolve().name)


def is_loopback(host: str) -> bool:
    import ipaddress
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def main(argv):
    if len(argv) > 1:
        cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
    if (_WORKDIR.value is None) == (_HF.value is None):
        cli.fail("give one of --workdir=RUN or --hf=FOLDER")
    if not 1 <= _MAX_TOKENS.value <= 65536:
        cli.fail(f"max_tokens={_MAX_TOKENS.value}: must be in [1, 65536]")
    if not 1 <= _MAX_BATCH.value <= 256:
        cli.fail(f"max_batch={_MAX_BATCH.value}: must be in [1, 256]")
    if not 0 <= _PORT.value <= 65535:
        cli.fail(f"port={_PORT.value}: must be in [0, 65535]")
    if not is_loopback(_HOST.value) and not _API_KEY.value:
        cli.fail(f"--host={_HOST.value} opens the server beyond this machine: give "
                 "--api_key=KEY too (clients send 'Authorization: Bearer KEY')")
    if _API_KEY.value is not None and not _API_KEY.value.strip():
        cli.fail("--api_key is empty: give a key, or leave the flag out on a loopback host")
    if _MAX_QUEUE.value < 1 or _MAX_BODY.value < 1024:
        cli.fail(f"max_queue={_MAX_QUEUE.value}, max_body={_MAX_BODY.value}: need "
                 "max_queue >= 1 and max_body >= 1024")
    if _NAME.value is not None and not _NAME.value.strip():  # clients would name model ""
        cli.fail("--name is empty: give the model id clients send, or leave the flag out")
    if _WORKDIR.value is not None and not Path(_WORKDIR.value).is_dir():
        cli.fail(f"--workdir={_WORKDIR.value}: no such folder; train a run there first")
    sock = bind(_HOST.value, _PORT.value)
    import uvicorn

    from transformer.serve.app import create_app
    from transformer.serve.engine import Engine

    model_config, params, tokenizer, step, name = load()
    name = _NAME.value or name
    engine = Engine(model_config, params, tokenizer, max_tokens=_MAX_TOKENS.value,
                    max_batch=_MAX_BATCH.value)
    print(f"{name} (step {step}): {model_config.n_layers} layers, d_model "
          f"{model_config.d_model}, context {model_config.max_seq_len}; {_MAX_BATCH.value} rows "
          f"decode together; warming up...",
          flush=True)
    print(f"compiled in {engine.warm_up():.1f}s", flush=True)
    from transformer.serve.chat import template_of
    template = template_of(_HF.value)  # a run trained here has none: the plain template
    app = create_app(engine, name, step, template=template, api_key=_API_KEY.value,
                     max_queue=_MAX_QUEUE.value, max_body=_MAX_BODY.value)
    notes = ["chat template: " + ("the folder's" if template.jinja else "plain")]
    notes += ["API key required"] if _API_KEY.value else []
    port = sock.getsockname()[1]  # --port=0: the one the system chose
    host = f"[{_HOST.value}]" if ":" in _HOST.value else _HOST.value  # an IPv6 address
    print(f"serving on http://{host}:{port}/  (OpenAI API under /v1; "
          f"{'; '.join(notes)})", flush=True)
    try:
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    finally:
        engine.close()
        sock.close()


def bind(host: str, port: int):
    """The listening socket, bound before the model loads: a port in use or a host that is
    not this machine's printed "serving on ..." after the load and the compile, then
    uvicorn's "ERROR: [Errno 98] ..." and exit 3 (the server never served)."""
    import errno
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        cli.fail(f"--host={host}: {e.strerror}; give an address of this machine, e.g. "
                 "127.0.0.1 or 0.0.0.0")
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        fix = ("choose another --port, or stop what holds it" if e.errno == errno.EADDRINUSE
               else "give an address of this machine (127.0.0.1, 0.0.0.0) and a free --port")
        cli.fail(f"--host={host} --port={port}: cannot listen there ({e.strerror}); {fix}")
    sock.set_inheritable(True)
    return sock


if __name__ == "__main__":
    cli.run(main)
