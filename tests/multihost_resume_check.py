"""One of two processes finds a run's newest checkpoint unreadable; which step does each restore?

    python tests/multihost_resume_check.py WORKDIR PORT PROCESS_ID   (2 CPU devices each)

Process 1 alone sees the newest checkpoint as damaged (its reads of that step fail); process
0 reads it fine. Each prints {"step": restored step, "damaged": steps found damaged} as JSON.
tests/test_multihost.py runs two of them and asserts that they agree.
"""

import json
import sys

import jax


def main(workdir, port, process_id):
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=process_id)
    from transformer import checkpoint
    from transformer import config as config_lib
    from transformer.parallel import sharding
    from transformer.train import start

    ckpts = checkpoint.Checkpoints(workdir, read_only=True)
    newest, saved = ckpts.all_steps()[-1], ckpts.read_meta()["config"]
    ckpts.close()
    config = config_lib.from_dict({**saved, "mesh": {**saved["mesh"], "data": -1, "fsdp": 2}})
    if process_id == 1:
        real = checkpoint.Checkpoints._restore_checked

        def unreadable_here(self, step, make_abstract):
            if step == newest:
                raise ValueError("simulated: this process cannot decode the newest checkpoint")
            return real(self, step, make_abstract)

        checkpoint.Checkpoints._restore_checked = unreadable_here
    found, damaged = start.find_checkpoint(workdir, config, sharding.make_mesh(config.mesh))
    print(json.dumps({"step": found.step, "damaged": damaged}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
