"""The serve room: a trained run behind an HTTP server that speaks OpenAI's completions API,
and a page that streams text and shows where every attention head looked.

    python -m transformer serve --workdir=runs/tiny          http://127.0.0.1:8000/

    __main__.py    the command: load a run (or --hf), warm up, serve with uvicorn
    api.py         requests in (checked, HTTP 400 with OpenAI's error JSON), responses out
    chat.py        chat completions: messages -> one prompt through a chat template
    tokens.py      tokens as logprobs name them (bytes:\\xNN for part of a character), offsets
    engine.py      the model side: one worker thread runs requests in arrival order through
                   generate/ (compiled once, at start-up); a client that leaves stops its work
    app.py         the routes (Starlette): /v1/completions, /v1/chat/completions, /v1/models,
                   /health, /v1/inspect, and the page; what a request may cost (body, queue,
                   API key), tokenizing off the event loop
    measure.py     tokens/s, time to first token and latency at 1-16 concurrent clients
                   (python -m transformer.serve.measure; docs/serving.md)
    static/        the page (HTML, JS, CSS shipped in the package: no CDN, works offline)

May import: config/, generate/, data/ (tokenizers), checkpoint.py (load_run), hf/ (--hf), cli.py.
Never model/ directly: generation goes through generate/decode and generate/text, and
log-probabilities and attention weights through generate/inside's one forward pass.
"""
