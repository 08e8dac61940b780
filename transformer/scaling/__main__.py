"""python -m transformer scaling: train a sweep, report on it, predict and verify.

    python -m transformer scaling --sweep=configs/scaling/cpu_ladder.py --workdir=runs/ladder
    python -m transformer scaling --sweep=configs/scaling/cpu_ladder.py --workdir=runs/ladder --index=2
    python -m transformer scaling --workdir=runs/ladder --report
    python -m transformer scaling --workdir=runs/isoflop --report --holdout=largest
    python -m transformer scaling --workdir=runs/isoflop --predict --flops=1e15
    python -m transformer scaling --workdir=runs/isoflop --verify     # train the prediction
    python -m transformer scaling --workdir=runs/isoflop --verify --flops=2e13 --seeds=1

sweep.py trains the members, report.py reads them back, verify.py checks a prediction by
training it.
"""

from __future__ import annotations

import math
import sys

from transformer.scaling.report import predict, report
from transformer.scaling.sweep import SIZE_ONLY, run


def _refuse_overrides_the_members_replace(sweep, argv) -> None:
    """Each member's train.steps comes from its budget and its size fields from its entry in
    sweep.sizes, whatever sweep.base holds: an override of those in --sweep.base (which the
    unknown-field message may suggest, e.g. for --sweep.base.train.stepz) was ignored
    silently. One line instead, naming what does set them."""
    from transformer import cli
    if "sizes" not in sweep:  # not a sweep config at all: run() says so
        return
    sizes = sweep.sizes or []
    replaced = {"train.steps"} | {f"model.{k}" for size in sizes for k in size
                                  if k not in SIZE_ONLY}
    for arg in argv[1:]:
        name = arg.split("=", 1)[0].removeprefix("--sweep.base.")
        if arg.startswith("--sweep.base.") and name in replaced:
            what = "its budget (sweep.budgets)" if name == "train.steps" else \
                "its entry in sweep.sizes"
            cli.fail(f"--sweep.base.{name}: each member's {name} is set by {what}, which "
                     "replaces the base's; change that in the sweep file instead")


def _main():
    from absl import flags
    from ml_collections import config_flags

    from transformer import cli

    sweep_flag = config_flags.DEFINE_config_file("sweep", None, "A sweep config file "
                                                 "(configs/scaling/*.py).")
    workdir_flag = flags.DEFINE_string("workdir", None, "Folder of the sweep; a run per member.")
    index_flag = flags.DEFINE_integer("index", None, "Run only member i (0-based).")
    report_flag = flags.DEFINE_bool("report", False, "Only write the report of finished runs.")
    no_progress = flags.DEFINE_bool("no_progress", False, "Hide the progress bars.")
    predict_flag = flags.DEFINE_bool("predict", False, "Print the compute-optimal N, D and "
                                     "loss at --flops from the IsoFLOP runs in --workdir.")
    flops_flag = flags.DEFINE_float("flops", None, "The training budget for --predict (and "
                                    "--verify: default 4x the sweep's largest).")
    verify_flag = flags.DEFINE_bool("verify", False, "Train the compute-optimal size the "
                                    "IsoFLOP fits predict at --flops (default 4x the largest "
                                    "budget) and its two ladder neighbours; print measured vs "
                                    "predicted loss and whether the predicted size is best.")
    seeds_flag = flags.DEFINE_integer("seeds", 2, "With --verify: seeds per size (train.seed, "
                                      "+1, ...); 2 or more measure the seed noise.")
    holdout_flag = flags.DEFINE_string("holdout", None, "With --report: 'largest' refits "
                                       "without the largest budget and checks its runs.")
    boot_flag = flags.DEFINE_integer("bootstrap", 100, "Bootstrap resamples per interval.")
    allow_flag = flags.DEFINE_list("allow_change", [], "Keys of the sweep config that may "
                                   "differ from the workdir's sweep.json, e.g. budgets or "
                                   "base.train.lr (finished members are kept).")

    def main(argv):
        if len(argv) > 1:
            cli.fail(f"unexpected arguments {argv[1:]}: flags look like --name=value")
        if not workdir_flag.value:
            cli.fail("--workdir=PATH is required")
        from transformer.train import scratch
        scratch.keep_freed_memory()  # as train.py: every size trains in this process
        if verify_flag.value:
            if flops_flag.value is not None and not 0 < flops_flag.value < math.inf:
                cli.fail(f"--verify --flops={flops_flag.value}: the budget must be a positive "
                         "number")
            if seeds_flag.value < 1:
                cli.fail(f"--seeds={seeds_flag.value}: must be at least 1")
            from transformer.scaling import verify
            verify.verify(workdir_flag.value, flops_flag.value, n_boot=boot_flag.value,
                          progress=not no_progress.value, seeds=seeds_flag.value)
            return
        if predict_flag.value:
            if flops_flag.value is None or not 0 < flops_flag.value < math.inf:
                cli.fail("--predict needs --flops=C, a positive budget, e.g. --flops=1e15")
            predict(workdir_flag.value, flops_flag.value, n_boot=boot_flag.value)
            return
        if holdout_flag.value not in (None, "largest"):
            cli.fail(f"--holdout={holdout_flag.value}: only --holdout=largest is supported")
        if report_flag.value:
            report(workdir_flag.value, holdout=holdout_flag.value, n_boot=boot_flag.value)
            return
        if flags.FLAGS["sweep"].value is None:
            cli.fail("--sweep=PATH is required to run a sweep (or pass --report)")
        sweep = cli.config_value(sweep_flag)
        _refuse_overrides_the_members_replace(sweep, sys.argv)
        run(sweep, workdir_flag.value, index_flag.value, progress=not no_progress.value,
            allow_change=allow_flag.value)
        if index_flag.value is None:
            report(workdir_flag.value, holdout=holdout_flag.value, n_boot=boot_flag.value)
        else:
            print(f"report: python -m transformer scaling --workdir={workdir_flag.value} --report")

    cli.run(main)


if __name__ == "__main__":
    _main()
