"""Several processes, one decision: the few questions every process of a run must answer alike.

A multi-host run is one program split over processes: each calls the same collectives in the
same order, or all of them wait forever. So any choice made from something one process sees
alone (a signal, a file it could not read, a lock it could not take) is agreed before it is
acted on:

    barrier("workdir read")            every process reached this point
    worst = max_over_processes(code)   the largest of each process's integer (e.g. a verdict)
    value = from_process_0(ints)       process 0's list of integers, on every process
    vote = StopVote(); vote.update(signum)   a max over processes that never stalls the loop

With one process each is the identity and costs nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P


def several() -> bool:
    return jax.process_count() > 1


def barrier(name: str) -> None:
    if several():
        multihost_utils.sync_global_devices(name)


def max_over_processes(value: int) -> int:
    if not several():
        return int(value)
    return int(np.max(multihost_utils.process_allgather(np.int32(value))))


def from_process_0(values: list[int]) -> list[int]:
    """Process 0's list (lengths may differ between processes)."""
    if not several():
        return list(values)
    n = int(multihost_utils.broadcast_one_to_all(np.int32(len(values))))
    padded = np.zeros(n, np.int64)
    padded[: min(n, len(values))] = values[:n]
    return [int(v) for v in multihost_utils.broadcast_one_to_all(padded)]


class StopVote:
    """max over processes of an integer (a signal number, 0 for none), computed on the devices
    and read one round later.

        signum = vote.update(stop.requested or 0)   # once per step, on every process
        signum = vote.final(stop.requested or 0)    # after the last step (waits)

    `update` queues a tiny all-reduce of this round's values behind the work already queued
    and returns the previous round's answer, which is ready by then: the loop never waits on
    it. Every process updates in the same rounds, so all get the same answer at the same
    step and stop together. With one process the answer is the value itself, at once.
    """

    def __init__(self):
        self._pending = None
        if several():
            by_process = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
            mesh = Mesh(np.asarray(by_process), ("devices",))
            self._sharding = NamedSharding(mesh, P("devices"))
            self._max = jax.jit(jnp.max, out_shardings=NamedSharding(mesh, P()))

    def update(self, value: int) -> int:
        if not several():
            return int(value)
        previous = 0 if self._pending is None else int(np.asarray(self._pending))
        local = np.full((jax.local_device_count(),), int(value), np.int32)
        votes = jax.make_array_from_process_local_data(self._sharding, local,
                                                       (jax.device_count(),))
        self._pending = self._max(votes)
        return previous

    def final(self, value: int) -> int:
        self._pending = None
        return max_over_processes(int(value))
