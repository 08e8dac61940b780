"""The generate room: from a prompt to new tokens through the preallocated KV cache.

    sampling.py    logits → next token: greedy, temperature, top-k, top-p
    step.py        the decode core: prefill, one step over the cache, keys, window policies;
                   what every driver shares (PAD_ID, prompt buckets, STREAM_EVERY, new_cache)
    decode.py      one batch: prefill + compiled decode loops (past the context too);
                   sharding (sample.py, the bench)
    interrupt.py   Ctrl-C during a long streamed generation: stops between decode's chunks
    slots.py       continuous batching: rows that join and leave one running batch (the server)
    text.py        text in, text out around decode: tokenizer, streaming, prompt cut
    inside.py      one forward pass over a given text: log-probabilities, attention weights

May import: config/, model/, parallel/, data/tokenizers. Never: train/, hf/, scaling/, tools/.
"""
