"""fairseq-train, counting what a training step launches on the GPU and its peak memory.

    python scripts/gpu_train_probe.py DATA [fairseq-train's arguments ...]

Runs fairseq-train's own entry point (``fairseq_cli.train.cli_main``) with the
arguments as given, so the run, its logs and its ``wps`` are fairseq-train's. Two
lines are added to its output (scripts/gpu_train_table.py reads them):

* ``gpu_check: kernels per step N (updates A-B)``: the CUDA kernels (and memory
  copies and fills) of ``GPU_CHECK_PROFILE_STEPS`` training steps (default 3) from
  update ``GPU_CHECK_PROFILE_FROM`` on (default 101: after the warm-up and the fused
  kernels' compilation; 0: none, as in gpu_check.sh's warm-up runs), counted by
  ``torch.profiler``, divided by the steps; the
  logged intervals that contain these updates are left out of the speed (their steps
  are slowed by the profiler);
* ``gpu_check: host syncs per step S (updates C-D)``: the times the host waited for
  the GPU (``.item()``, ``bool()`` of a GPU tensor, a blocking copy, ...) in the next
  ``GPU_CHECK_PROFILE_STEPS`` calls of the training step, as torch's sync debug mode
  reports them (``fairseq_localness.cli.bench_measure.host_waits``: a lower bound),
  divided by the steps; where, in the lines ``gpu_check: sync at FILE:LINE (N)`` after
  it;
* ``gpu_check: peak memory M MB``: ``torch.cuda.max_memory_allocated()`` at the end.
"""
import collections
import os
import sys

import torch

from fairseq_localness.cli.bench_measure import host_waits

PREFIX = "gpu_check:"


def _install(profile_from: int, steps: int) -> None:
    from fairseq import trainer as fairseq_trainer

    original = fairseq_trainer.Trainer.train_step
    state = {"profiler": None, "syncs": collections.Counter(), "counted": 0}
    sync_from = profile_from + steps  # the steps after the profiled ones

    def counting_syncs(self, samples, raise_oom, update):
        """One counted call (a step whose update was skipped, by an fp16 overflow or
        an out-of-memory retry, is a call of its own): the line after ``steps``."""
        with host_waits() as waits:
            out = original(self, samples, raise_oom)
        state["syncs"].update(waits)
        state["counted"] += 1
        if state["counted"] == steps:
            total = sum(state["syncs"].values())
            print(f"{PREFIX} host syncs per step {total / steps:.1f} (updates {sync_from}-{update})", flush=True)
            for site, count in state["syncs"].most_common():
                print(f"{PREFIX} sync at {site} ({count})", flush=True)
        return out

    def train_step(self, samples, raise_oom=False):
        update = self.get_num_updates() + 1  # the update this step makes
        if profile_from > 0 and update >= sync_from and state["counted"] < steps:
            return counting_syncs(self, samples, raise_oom, update)
        if update == profile_from and state["profiler"] is None:
            torch.cuda.synchronize()
            state["profiler"] = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
            state["profiler"].__enter__()
        out = original(self, samples, raise_oom)
        profiler = state["profiler"]
        if profiler is not None and update == profile_from + steps - 1:
            torch.cuda.synchronize()
            profiler.__exit__(None, None, None)
            kernels = sum(1 for e in profiler.events() if e.device_type == torch.autograd.DeviceType.CUDA)
            print(f"{PREFIX} kernels per step {kernels / steps:.1f} (updates {profile_from}-{update})", flush=True)
            state["profiler"] = False
        return out

    fairseq_trainer.Trainer.train_step = train_step


def main() -> int:
    if not torch.cuda.is_available():
        print("gpu_train_probe.py: error: no CUDA GPU (it counts GPU kernels and GPU memory)", file=sys.stderr)
        return 2
    _install(int(os.environ.get("GPU_CHECK_PROFILE_FROM", "101")), int(os.environ.get("GPU_CHECK_PROFILE_STEPS", "3")))
    from fairseq_cli.train import cli_main

    sys.argv = ["fairseq-train"] + sys.argv[1:]
    cli_main()
    print(f"{PREFIX} peak memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
