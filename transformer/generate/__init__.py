"""The generate room: from a prompt to new tokens through the preallocated KV cache.

    sampling.py    logits → next token: greedy, temperature, top-k, top-p
    decode.py      prefill + compiled decode loops (past the context too); buckets; sharding
    text.py        text in, text out around decode: tokenizer, streaming, prompt cut
    inside.py      one forward pass over a given text: log-probabilities, attention weights

May import: config/, model/, parallel/, data/tokenizers. Never: train/, hf/, scaling/, tools/.
"""
