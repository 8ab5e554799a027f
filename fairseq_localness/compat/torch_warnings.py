"""torch's warnings about the way fairseq 0.12 calls it, hidden.

What fairseq does wrong: three of its calls into torch draw a warning on every
training run, about fairseq's code, which a user cannot act on:

- its data loaders ask for ``pin_memory=True`` (``fairseq/data/iterators.py``)
  whatever the device, and torch warns "'pin_memory' argument is set as true but no
  accelerator is found, then device pinned memory won't be used" on a machine
  without one (it pins nothing there: the warning is all the difference);
- ``FairseqTask.train_step`` (``fairseq/tasks/fairseq_task.py``) enters
  ``torch.cuda.amp.autocast(enabled=...)``, which torch deprecates for
  ``torch.amp.autocast("cuda", ...)`` with a ``FutureWarning`` (the same context);
- the decoder layers' self-attention (``fairseq/modules/multihead_attention.py``,
  its call of ``F.multi_head_attention_forward``) passes the causal mask as a float
  tensor (``0``/``-inf``) and the target's padding mask as a bool tensor, and torch
  warns "Support for mismatched key_padding_mask and attn_mask is deprecated" (it
  converts the bool mask to the same ``-inf`` the float one holds; the sum is the
  same). Every decoder built on fairseq's ``TransformerDecoderLayer`` does this, the
  transformer's and this package's; this package's own attention
  (:mod:`fairseq_localness.modules`) does not call ``F.multi_head_attention_forward``,
  the one place the warning comes from.

What the fix changes: :func:`filter_torch_warnings_about_fairseq` hides those three
warnings, by message (:data:`TORCH_WARNINGS`; the ``autocast`` one only where
fairseq's code calls it), and nothing else.

The test that fails without it: ``tests/test_checkpoint_safety.py``,
``test_fairseq_train_prints_no_line_a_user_cannot_act_on`` (and, for
``pin_memory`` in ``fairseq-generate``, ``tests/test_evaluation.py``,
``test_averaging_and_evaluation_print_no_line_a_user_cannot_act_on``).
"""
import warnings

TORCH_WARNINGS = (
    # (category, the start of the message, the module that calls torch: "" for any)
    (UserWarning, r"'pin_memory' argument is set as true but no accelerator is found", ""),
    (FutureWarning, r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated", r"fairseq\."),
    (UserWarning, r"Support for mismatched key_padding_mask and attn_mask is deprecated", ""),
)
"""The warnings :func:`filter_torch_warnings_about_fairseq` hides."""


def filter_torch_warnings_about_fairseq():
    """Hide the warnings of :data:`TORCH_WARNINGS`, by message, and only those.
    Idempotent (``warnings`` keeps one copy of a filter)."""
    for category, message, module in TORCH_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
