"""Sizes of any config without allocating it: parameters, FLOPs, KV cache, activation memory.

    python -m transformer sizes --config=configs/gpt3_175b.py          # ~175B params, instantly
    python -m transformer sizes --config=configs/tiny.py --json
    python -m transformer sizes --config=configs/default.py --batch=8 --kv_dtype=bfloat16
    python -m transformer sizes --config=configs/default.py --config.model.depth=8   # derived

The figures come from `transformer/model/sizes.py` (arithmetic in `model/flops.py`, checked
against the real parameter tree built with `jax.eval_shape`).
"""

from __future__ import annotations

import json

from absl import flags
from ml_collections import config_flags

from transformer import cli
from transformer.config import depth
from transformer.model import flops
from transformer.model.sizes import CALIBRATION, model_config_of, report, summary
from transformer.train.resolve import resolve


def _main():
    # Flags are defined only when run as a program: train.py imports this module and has its
    # own --config.
    config_flag = config_flags.DEFINE_config_file("config", None,
                                                  "A config file (Python, get_config()).")
    json_flag = flags.DEFINE_bool("json", False, "Print one JSON object instead of text.")
    batch_flag = flags.DEFINE_integer("batch", None, "Batch size for the KV-cache and "
                                      "activation figures (default: train.batch_size).")
    kv_flag = flags.DEFINE_enum("kv_dtype", None, list(flops.BYTES),
                                "KV-cache dtype (default: model.dtype).")

    def main(argv):
        if len(argv) > 1:
            cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
        if flags.FLAGS["config"].value is None:
            cli.fail("--config=PATH is required, e.g. --config=configs/gpt3_175b.py")
        config, _ = resolve(cli.config_value(config_flag), platform=None)
        c = model_config_of(config)
        batch = config.train.batch_size if batch_flag.value is None else batch_flag.value
        if batch <= 0:
            cli.fail(f"--batch={batch}: must be a positive integer")
        derived = depth.describe(config)
        if json_flag.value:
            out = report(c, batch, kv_flag.value)
            if derived:
                out["depth"] = {"depth": config.model.depth, **depth.derived(config)}
            print(json.dumps(out, indent=2))
        else:
            print(summary(c, batch, kv_flag.value))
            print(CALIBRATION)
            if derived:
                print(derived)

    cli.run(main)


if __name__ == "__main__":
    _main()
