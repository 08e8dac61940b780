"""The quick start: a small GPT (4 layers, d_model 128, context 128) on the Python standard
library's sources with a 2,048-token BPE learned from them, sized as a speedrun for about
4 minutes of training on a 2-core AVX2 CPU, a minute or so with AVX-512 (docs/quickstart.md).
Use it to see the whole loop (prepare, train, evaluate, sample) in one command, or as the
base a change is measured against. Each setting below is a row of docs/speedrun.md, measured
over the row before it; the figures per machine are in docs/records.md. GPT-2's block is one
config away (configs/gpt2.py).
"""

from transformer.config import base_config


def get_config():
    c = base_config()
    c.model.update(d_model=128, n_layers=4, n_heads=4, d_ff=256, max_seq_len=128,
                   position="rope", norm="rmsnorm", mlp="swiglu", tie_embeddings=False,
                   value_embeds="alternate")
    c.data.update(max_bytes=4_000_000, tokenizer="bpe", bpe_vocab_size=2048)
    c.train.update(steps=835, batch_size=16, optimizer="muon", muon_lr=0.01, lr=1.5e-2,
                   b1=0.8, b2=0.99, muon_momentum=0.9, muon_weight_decay=0.2, warmup_steps=50,
                   log_every=25, eval_every=150, eval_batches=8, ckpt_every=300)
    # BPE tokens carry a word's leading space (" main", " self"): a prompt ending in a space
    # asks for what follows a lone space token, which the training text rarely has ("def "
    # began "def  Multipart"), and "def" alone, at a document's start, read as "defects".
    # A file's first line is what the model has seen at position 0.
    # 100 new tokens fit the context after the prompt's 16-slot bucket: the sample's program
    # then has no window loop to compile (decode.token_budget).
    c.sample.update(prompt="import os", max_new_tokens=100)
    return c
