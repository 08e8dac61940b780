"""The quick start: a small byte-level GPT on the Python standard library's sources, sized as a
speedrun for 5 minutes of training on a 2-core AVX2 laptop or server (docs/quickstart.md).

Context 128 (not 256) and 2,048 tokens per step: early in training the loss falls with the
number of steps more than with the tokens in each, and a shorter context makes every token
cheaper; 900 steps with the cosine schedule ending at the last one. The sample at the end
looks like Python."""

from transformer.config import base_config


def get_config():
    c = base_config()
    c.model.update(d_model=128, n_layers=4, n_heads=4, d_ff=512, max_seq_len=128)
    c.data.max_bytes = 4_000_000
    c.train.update(steps=900, batch_size=16, lr=2e-3, warmup_steps=50, log_every=25,
                   eval_every=150, eval_batches=8, ckpt_every=300)
    c.sample.max_new_tokens = 120
    return c
