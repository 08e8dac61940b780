"""The shape `python -m transformer bench` measures by default: 4 layers, 4 heads, d_model 256,
context 256, batch 16, float32 (the shape of the PyTorch figures in issue 7, whose vocabulary
was 256: today's byte tokenizer has 257, the end-of-text token included)."""

from transformer.config import base_config


def get_config():
    c = base_config()
    c.model.update(vocab_size=0, d_model=256, n_layers=4, n_heads=4, d_ff=1024,
                   max_seq_len=256)
    c.data.max_bytes = 1_000_000
    # A short schedule that still learns: the bf16/f32 val-loss ratio compares like with like.
    c.train.update(batch_size=16, lr=2e-3, warmup_steps=2, eval_batches=4)
    return c
