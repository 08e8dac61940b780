"""The config room: every field declared once, the schema derived from it, the resume rules.

    fields.py    each field once: base value, allowed values, check, doc, resume rule
    schema.py    base_config, validate (errors name the field and the fix), ModelConfig
    resume.py    which changes a resumed run accepts
    depth.py     model.depth: sizes, rates, batch and horizon derived from one number
    files.py     a config file's get_config() by its path (configs/ is data, not a package)

Configs are plain data: building or validating one reads nothing of the machine it runs on
(`model.matmul=auto` is resolved at the edge, by the run and sampler set-up). This room
imports nothing else of the package. The schema's names are importable from here:

    from transformer.config import ModelConfig, base_config, validate
"""

from transformer.config.fields import (  # noqa: F401  (the room's public face)
    ATTENTION_KERNELS,
    DTYPES,
    GPT2_BLOCK,
    INT32_MAX,
    MATMUL,
    MATMUL_MODES,
    MESH_AXES,
    MLPS,
    NONFINITE,
    NORM_PLACEMENTS,
    NORMS,
    POSITIONS,
    REMAT,
    TOKENIZERS,
)
from transformer.config.schema import (  # noqa: F401
    ConfigError,
    ModelConfig,
    base_config,
    check_sampling,
    flatten,
    from_dict,
    padded_vocab,
    replace,
    to_dict,
    validate,
)
