"""Text in, text out: tokenize prompts, run the compiled decoder, detokenize the continuations."""

from __future__ import annotations

from transformer import decode
from transformer.config import ModelConfig


def sample_text(model_config: ModelConfig, params, tokenizer, prompt: str, *, num_samples: int = 1,
                max_new_tokens: int = 100, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0, seed: int = 0, stop: str | None = None, mesh=None,
                rules=None) -> list[str]:
    """`num_samples` continuations of `prompt` (decoded in one batch). Raises PromptError or
    TokenizerError for a prompt that cannot be used. `stop`: text of one token that ends a sample.
    `mesh`, `rules`: decode on a device mesh (see decode.generate)."""
    prompt_ids = tokenizer.encode(prompt)
    eos_id = -1
    if stop:
        stop_ids = tokenizer.encode(stop)
        if len(stop_ids) != 1:
            raise decode.PromptError(f"stop={stop!r} is {len(stop_ids)} tokens; it must be one token")
        eos_id = stop_ids[0]
    rows = decode.generate(model_config, params, [prompt_ids] * num_samples,
                           max_new_tokens=max_new_tokens, seed=seed, temperature=temperature,
                           top_k=top_k, top_p=top_p, eos_id=eos_id, mesh=mesh, rules=rules)
    return [tokenizer.decode(row) for row in rows]
