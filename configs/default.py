"""The quick start: a small byte-level GPT on the Python standard library's sources, sized as a
speedrun for 4 minutes of training on a 2-core AVX2 laptop or server (docs/quickstart.md).

The recipe is the last row of docs/speedrun.md, each change measured there over the one
before it (two seeds each, validation over the whole held-out split):
- the modern block, RoPE + RMSNorm + SwiGLU (1.681 -> 1.315 nats per byte at 900 steps);
- Muon for the blocks' matrices, AdamW for embeddings, norms and biases (-> 1.198 at 900);
- 620 steps instead of 900: Muon's Newton-Schulz steps make a step ~1.3x dearer on a CPU,
  and 620 is what fits 240 s of training on the Zen 3 the budget is set on (-> 1.262);
- AdamW (embedding, norms, biases) at lr 6e-3 instead of 2e-3 (-> 1.247);
- Muon at lr 0.01 instead of optax's usual 0.02 (-> 1.227).
Context 128 and 2,048 tokens per step: early in training the loss falls with the number of
steps more than with the tokens in each, and a shorter context makes every token cheaper;
the cosine schedule ends at the last step. GPT-2's block, for the Hugging Face GPT-2 tests
and fine-tuning, is one config away (model.position=learned, norm=layernorm, mlp=gelu)."""

from transformer.config import base_config


def get_config():
    c = base_config()
    c.model.update(d_model=128, n_layers=4, n_heads=4, d_ff=512, max_seq_len=128,
                   position="rope", norm="rmsnorm", mlp="swiglu")
    c.data.max_bytes = 4_000_000
    c.train.update(steps=620, batch_size=16, optimizer="muon", muon_lr=0.01, lr=6e-3,
                   warmup_steps=50, log_every=25, eval_every=150, eval_batches=8,
                   ckpt_every=300)
    c.sample.max_new_tokens = 120
    return c
