"""Fixes for running fairseq 0.12.x on current torch, one module per fix.

Each module says what fairseq does wrong (with fairseq's issue number where there is
one), what its fix changes, and the test that fails without it:

============================  =========================================================
module                        fixes
============================  =========================================================
:mod:`.checkpoint_loading`    fairseq's checkpoints on torch >= 2.6 (``weights_only``),
                              loaded without running their code; one-line refusals
:mod:`.last_batch`            the last, smaller batch, which ``batch_by_size`` drops
:mod:`.cpu_distributed`       torchrun-launched training and DDP on the CPU (gloo)
:mod:`.bf16`                  ``--bf16`` on a CUDA GPU or the CPU (fairseq: TPU only)
:mod:`.mixed_precision`       ``--bf16``'s fp32 master weights flat, as ``--fp16``'s
                              (fairseq: one per tensor, about 12 operator calls per
                              tensor and update), and one multi-tensor copy per sync
:mod:`.long_inputs`           a sentence too long for the model: its beginning
                              translated, in ``fairseq-interactive``,
                              ``fairseq-generate`` and the hub, instead of a stop
:mod:`.hydra_messages`        hydra's deprecation warnings and ``JobRuntime`` debug
                              lines about fairseq's configuration, hidden
:mod:`.torch_warnings`        torch's warnings about fairseq's calls (``pin_memory``
                              without an accelerator, ``torch.cuda.amp.autocast``,
                              mismatched attention masks), hidden
============================  =========================================================

:func:`apply_all` applies them all; importing :mod:`fairseq_localness` (as fairseq's
``--user-dir`` or from Python) calls it. Every fix is idempotent and changes nothing
where fairseq works.
"""


def apply_all():
    """Apply every fix of this package to fairseq (each is idempotent).

    The message filters come first, so that nothing fairseq does while the others
    are applied prints what they hide.
    """
    from fairseq_localness.compat import (bf16, checkpoint_loading, cpu_distributed, hydra_messages, last_batch,
                                          long_inputs, mixed_precision, torch_warnings)

    hydra_messages.filter_hydra_deprecation_warnings()
    hydra_messages.filter_hydra_job_runtime_lines()
    torch_warnings.filter_torch_warnings_about_fairseq()

    checkpoint_loading.patch_checkpoint_loading()
    last_batch.patch_batch_by_size()
    cpu_distributed.patch_cpu_distributed()
    bf16.patch_bf16_without_tpu()
    mixed_precision.patch_mixed_precision()
    long_inputs.patch_interactive_long_inputs()
    long_inputs.patch_generate_long_inputs()
    long_inputs.patch_hub_long_inputs()
