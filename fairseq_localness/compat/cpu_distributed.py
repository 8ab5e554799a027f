"""Distributed training on the CPU (gloo).

What fairseq does wrong: started by ``torchrun`` (``python -m torch.distributed.run``),
fairseq 0.12 reads ``RANK``/``WORLD_SIZE`` from the environment and sets each
process's device to ``RANK % torch.cuda.device_count()``: a ``ZeroDivisionError`` on
a machine without GPUs, even with ``--cpu``. Its ``pytorch_ddp``/``c10d`` wrapper then
passes ``device_ids=[device_id]`` to ``DistributedDataParallel``, which torch refuses
for a model on the CPU. fairseq also leaves its process groups to the interpreter's
exit, where gloo's destructor can abort a finished process ("terminate called
without an active exception", exit status -6, after the last checkpoint was
written).

What the fix changes: :func:`patch_cpu_distributed` makes the first two work without
a GPU (device 0, no ``device_ids``; with GPUs nothing changes), and destroys the
process groups once training has returned, on every device.

The tests that fail without it: ``tests/test_distributed.py``,
``test_torchrun_environment_on_cpu`` (the ``ZeroDivisionError``),
``test_ddp_wrapper_accepts_a_cpu_model`` (``device_ids``) and
``test_training_processes_destroy_their_process_group``.
"""
import logging
import os
import sys

import torch

from fairseq_localness.compat._patching import replaces

_MARK = "_fairseq_localness_cpu_distributed"


def patch_cpu_distributed():
    """Let fairseq's torchrun-launched training and its DDP wrapper run on the CPU.

    Three changes, each active only where fairseq would otherwise fail without CUDA
    or leave the process groups to the interpreter's exit; idempotent:

    - ``fairseq.distributed.utils._infer_torch_distributed_launch_init`` (it reads
      ``RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR``/``MASTER_PORT`` through
      ``init_method="env://"``): with no CUDA device, ``device_id`` is 0 instead of
      ``RANK % 0``; with GPUs it is fairseq's own function;
    - the ``DistributedDataParallel`` used by
      ``fairseq.models.distributed_fairseq_model`` drops ``device_ids`` and
      ``output_device`` for a module whose parameters are on the CPU (torch
      requires ``None`` there);
    - ``fairseq.distributed.utils.distributed_main`` (each process's training,
      ending with fairseq's barrier) then destroys the process groups, so no
      communicator is torn down by the interpreter's exit; a process of a group of
      several on the CPU (gloo) then ends at once (``os._exit(0)``, its output
      flushed), as gloo could still abort it in the interpreter's teardown. Only
      after training returned: a failing process keeps its error and exit status.
    """
    from fairseq.distributed import utils as dist_utils
    from fairseq.models import distributed_fairseq_model as dfm

    original_infer = dist_utils._infer_torch_distributed_launch_init
    if not getattr(original_infer, _MARK, False):

        def _infer_torch_distributed_launch_init(cfg):
            if torch.cuda.device_count() > 0:
                return original_infer(cfg)
            cfg.distributed_init_method = "env://"
            cfg.distributed_world_size = int(os.environ["WORLD_SIZE"])
            cfg.distributed_rank = int(os.environ["RANK"])
            cfg.device_id = 0  # the CPU; never passed to torch.cuda
            cfg.distributed_no_spawn = True  # processes are created by torchrun

        dist_utils._infer_torch_distributed_launch_init = replaces(
            _infer_torch_distributed_launch_init, original_infer, _MARK)

    original_ddp = dfm.DistributedDataParallel
    if not getattr(original_ddp, _MARK, False):

        class DistributedDataParallel(original_ddp):
            def __init__(self, module, *args, **kwargs):
                if all(p.device.type == "cpu" for p in module.parameters()):
                    kwargs["device_ids"] = None
                    kwargs["output_device"] = None
                super().__init__(module, *args, **kwargs)

        DistributedDataParallel.__doc__ = original_ddp.__doc__
        setattr(DistributedDataParallel, _MARK, True)
        dfm.DistributedDataParallel = DistributedDataParallel

    original_main = dist_utils.distributed_main
    if not getattr(original_main, _MARK, False):

        def distributed_main(i, main, cfg, kwargs):
            original_main(i, main, cfg, kwargs)
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                world = torch.distributed.get_world_size()
                torch.distributed.destroy_process_group()
                if world > 1 and torch.cuda.device_count() == 0:
                    # gloo can still abort a finished process in the interpreter's teardown
                    # ("terminate called without an active exception", exit status -6) after
                    # the group is destroyed: training has returned and written everything,
                    # so the process ends here, its output flushed
                    logging.shutdown()
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(0)

        dist_utils.distributed_main = replaces(distributed_main, original_main, _MARK)
