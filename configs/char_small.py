"""The classic small character-level shape (6 layers, 6 heads, d_model 384, context 256),
for comparisons with other projects. Give it a text with --config.data.corpus=PATH."""

from transformer.config import base_config


def get_config():
    c = base_config()
    c.model.update(vocab_size=0, d_model=384, n_layers=6, n_heads=6, d_ff=1536, max_seq_len=256)
    c.data.tokenizer = "char"
    c.train.update(steps=5000, batch_size=64, lr=1e-3, warmup_steps=100, eval_every=250,
                   ckpt_every=500)
    return c
