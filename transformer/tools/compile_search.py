"""`python -m transformer compile --search`: the mesh, remat and gradient accumulation that fit
a target and run fastest, chosen by compiling the few that might.

    python -m transformer compile --config=configs/gpt3_175b.py --target=v5p:8x8x16 --search

1. Candidates: every data x fsdp x tensor over the target's chips (tensor up to 16) whose
   sizes the mesh can split (sharding.check_fits), with the length axis split over tensor
   (sequence parallelism) where it divides the context, remat none/dots/block and grad_accum
   1, 2, 4, 8 where the micro-batches still split over the batch axes.
2. Pruned without compiling (against the memory the device reports): the project's own per-chip estimate (the state as the rules
   split it, a gradient, model/flops.py's activations: tools/compile.py's `estimate`) must be
   within ESTIMATE_SLACK of the chip's HBM; the survivors are ranked by a cheap roofline
   (compute at peak with remat's recompute, model/flops.py, against the bytes each axis moves),
   those the estimate says fit outright first; each axis's traffic priced on its links
   (parallel/links.py: one torus axis's ports, NVLink or the NIC between GPU hosts, DCN).
3. They are compiled for the target in that order until --search_compiles of them fit (libtpu
   refuses one that does not within seconds; at most three times as many tried, 20 minutes);
   the table ranks those that fit by their roofline step time (the collectives XLA emitted,
   each priced on the links its group spans).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import math
import sys
import time

# The estimate against XLA's peak: 1.2-1.8x low for the tiny config on v5e:2x2 (tests/
# test_compile.py), so a candidate is kept while its estimate is below HBM x this.
ESTIMATE_SLACK = 1.5
# gradient accumulation tried: up to 32 micro-batches (an 8B model's 2M-token batch on one
# 8-GPU host fits only at 32)
ACCUMS = (1, 2, 4, 8, 16, 32)


@dataclasses.dataclass
class Candidate:
    data: int
    fsdp: int
    tensor: int
    length: str     # mesh.rules.length: "" or "tensor"
    remat: str
    grad_accum: int
    vocab: int = 0  # a vocabulary padded so that tensor splits it (0: the config's)
    estimate: float = 0.0
    guess_s: float = 0.0     # the cheap roofline
    compute_s: float = 0.0   # its compute term (remat's recompute in it): the tie-break

    def overrides(self) -> list[str]:
        out = [f"--config.mesh.data={self.data}", f"--config.mesh.fsdp={self.fsdp}",
               f"--config.mesh.tensor={self.tensor}"]
        if self.length:
            out.append(f"--config.mesh.rules.length={self.length}")
        out += [f"--config.model.remat={self.remat}",
                f"--config.train.grad_accum={self.grad_accum}"]
        if self.vocab:
            out.append(f"--config.model.vocab_size={self.vocab}")
        return out

    def apply(self, config):
        from transformer.config import replace
        values = {"mesh.data": self.data, "mesh.fsdp": self.fsdp, "mesh.tensor": self.tensor,
                  "mesh.rules.length": self.length, "model.remat": self.remat,
                  "train.grad_accum": self.grad_accum}
        if self.vocab:
            values["model.vocab_size"] = self.vocab
        return replace(config, **values)

    def label(self) -> str:
        seq = " seq" if self.length else ""
        return f"{self.data}x{self.fsdp}x{self.tensor}{seq}"


def candidates(config, target) -> list[Candidate]:
    """Every candidate the mesh can split, with the estimate and the cheap roofline filled."""
    from transformer.config import ConfigError, ModelConfig
    from transformer.model import flops
    from transformer.parallel import sharding
    from transformer.model.sizes import activations_per_chip
    n, out = target.chips, []
    B, T = config.train.batch_size, config.model.max_seq_len
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    for tensor, fsdp in itertools.product([d for d in divisors if d <= 16], divisors):
        if n % (tensor * fsdp):
            continue
        data = n // (tensor * fsdp)
        for length, remat, accum in itertools.product(("", "tensor") if tensor > 1 else ("",),
                                                      ("none", "dots", "block"), ACCUMS):
            V = config.model.vocab_size
            # ids past the tokenizer's are never used: padding lets tensor split the head
            vocab = -(-V // tensor) * tensor if V and V % tensor else 0
            cand = Candidate(data, fsdp, tensor, length, remat, accum, vocab)
            trial = cand.apply(config)
            if B % accum or (B // accum) % (data * fsdp):
                continue
            mesh = _abstract(data, fsdp, tensor)
            try:
                sharding.check_fits(trial, mesh, processes=target.hosts)
            except ConfigError:
                continue
            c = ModelConfig.from_config(trial)
            rules = sharding.axis_rules(trial)
            params = flops.param_counts(c)["total"]
            split = sharding.shards(mesh, rules, "embed") * tensor
            param_bytes = params * flops.BYTES[c.param_dtype]
            state = param_bytes * 4 / split  # params, Adam's two moments, a gradient
            cand.estimate = state + activations_per_chip(
                c, B, accum, sharding.shards(mesh, rules, "batch"),
                sharding.shards(mesh, rules, "length"))
            cand.guess_s, cand.compute_s = _guess(c, B, T, cand, param_bytes, target)
            out.append(cand)
    return out


def _abstract(data, fsdp, tensor):
    from jax.sharding import AbstractMesh, AxisType
    from transformer.parallel.sharding import MESH_AXES
    return AbstractMesh((data, fsdp, tensor), MESH_AXES, axis_types=(AxisType.Auto,) * 3)


def _guess(c, B, T, cand: Candidate, param_bytes: float, target) -> float:
    """A roofline before compiling: compute at the peak of the precision that runs (with
    remat's recompute), against the time a chip's collectives take on the links of each mesh
    axis (parallel/links.py): fsdp gathers the weights twice and scatters the gradient (each
    pass again per micro-batch), data all-reduces what is left of the gradient, tensor
    all-reduces each block's two outputs forward and backward."""
    from transformer.model import flops
    from transformer.parallel import links
    from transformer.train import metrics
    compute = (flops.train_flops_per_token(c) + flops.recompute_flops_per_token(c)) * B * T / (
        target.chips * metrics.peak_flops(c.dtype, target.devices[0])[0])
    per_chip = param_bytes / cand.tensor
    seconds = 0.0
    if cand.fsdp > 1:
        seconds += 3 * per_chip * cand.grad_accum / links.axis_bandwidth(
            target, cand.tensor, cand.fsdp)
    if cand.data > 1:
        seconds += 2 * per_chip / cand.fsdp / links.axis_bandwidth(
            target, cand.tensor * cand.fsdp, cand.data)
    if cand.tensor > 1:
        rows = B / (cand.data * cand.fsdp)
        seconds += 4 * 2 * c.n_layers * rows * T * c.d_model * flops.BYTES[c.dtype] / \
            links.axis_bandwidth(target, 1, cand.tensor)
    return max(compute, seconds), compute


def search(config, target, argv, build, compiles: int = 4, minutes: float = 20.0,
           json_path: str | None = None) -> int:
    """Prints the ranked table and the command to use; 0 when a candidate fits, else 1.
    `build(config)`: the compiled train step's report (tools/compile.py); `json_path`: where
    the best compiled candidate's report goes (--json), with the overrides that make it."""
    every = candidates(config, target)
    hbm = target.memory_bytes
    plausible = [c for c in every if c.estimate <= hbm * ESTIMATE_SLACK]
    print(target.describe())
    print(f"search: {len(every)} candidates the mesh can split; {len(plausible)} within "
          f"{ESTIMATE_SLACK}x of {hbm / 2**30:.1f} GiB by the project's estimate; compiling "
          f"until {compiles} fit")
    # XLA's peak over the estimate, per remat policy, learnt from each compile: a policy whose
    # estimate proved low has its other candidates' estimates scaled up before the next pick.
    factor = collections.defaultdict(lambda: 1.0)

    def order(c):
        return (c.estimate * factor[c.remat] > hbm, c.guess_s, c.compute_s, c.grad_accum,
                c.estimate)

    began, rows, left = time.perf_counter(), [], list(plausible)
    while left and len(rows) < 3 * compiles and sum(r.fits for _, r in rows) < compiles:
        # libtpu refuses a program that does not fit within seconds; one that fits takes
        # minutes: go on until `compiles` fit (or three times as many were tried)
        if time.perf_counter() - began > minutes * 60:
            print(f"  stopped: {minutes:g} minutes of compiling spent")
            break
        cand = min(left, key=order)
        left.remove(cand)
        report = build(cand.apply(config))
        rows.append((cand, report))
        if report.peak_bytes_per_chip:
            factor[cand.remat] = max(factor[cand.remat], report.peak_bytes_per_chip / cand.estimate)
        print(f"  compiled {cand.label():<16} remat {cand.remat:<5} accum {cand.grad_accum}: "
              f"peak {report.peak_bytes_per_chip / 2**30:.1f} GiB, "
              f"{'fits' if report.fits else 'does not fit'}, {report.compile_s:.0f} s", flush=True)
    ranked = sorted(rows, key=lambda r: (not r[1].fits, r[1].predicted_step_s))
    if json_path and ranked:
        best, report = ranked[0]
        with open(json_path, "w") as f:
            json.dump({**report.json(), "search": {"overrides": best.overrides(),
                                                   "compiled": len(rows),
                                                   "candidates": len(every)}}, f, indent=1)
    print(f"{'mesh d x f x t':<18}{'remat':<7}{'accum':>6}{'estimate':>10}{'peak/chip':>11}"
          f"{'fits':>6}{'step (s)':>10}{'MFU<=':>7}{'compile':>9}")
    for cand, r in ranked:
        print(f"{cand.label():<18}{cand.remat:<7}{cand.grad_accum:>6}"
              f"{cand.estimate / 2**30:>9.1f}G{r.peak_bytes_per_chip / 2**30:>10.1f}G"
              + (f"{'yes':>6}{r.predicted_step_s:>10.3g}{100 * r.predicted_mfu:>6.1f}%" if r.fits
                 else f"{'no':>6}{'-':>10}{'-':>7}") + f"{r.compile_s:>8.0f}s")
    print(f"compiled {len(rows)} of {len(every)} candidates ({len(every) - len(plausible)} "
          f"pruned by the estimate)")
    if ranked and ranked[0][1].fits:
        kept = [a for a in argv[1:] if not a.startswith(("--search", "--config.mesh.data",
                "--config.mesh.fsdp", "--config.mesh.tensor", "--config.mesh.rules.length",
                "--config.model.remat", "--config.train.grad_accum", "--json"))]
        print("use: python -m transformer compile " + " ".join(kept + ranked[0][0].overrides()))
        return 0
    if not plausible:
        cli_line = (f"none of the {len(every)} meshes fits {target.name}: the smallest estimate "
                    f"is {min((c.estimate for c in every), default=math.inf) / 2**30:.1f} GiB per "
                    f"chip of {hbm / 2**30:.1f}; a target with more chips or HBM")
    else:
        cli_line = (f"none of the {len(rows)} compiled candidates fits {target.name}; the "
                    "estimate let them through, XLA did not: a target with more chips or HBM, "
                    "or a smaller train.batch_size")
    print(f"error: {cli_line}", file=sys.stderr)
    return 1
