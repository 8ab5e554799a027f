"""The kernels of the attention core's fast path, one computation each:

* :mod:`.sdpa`: torch's fused kernels (``F.scaled_dot_product_attention`` with a
  branch's mask and bias; the CPU flash kernel with ``is_causal`` and padding);
* :mod:`.banded`: a hard window of W keys, ``O(Tq x W)`` in time and memory;
* :mod:`.recompute`: learned additive biases, nothing of size ``Tq x Tk`` kept for
  the backward pass;
* :mod:`.step`: one query row (an incremental decoding step);
* :mod:`.flex`: a branch's description (:mod:`~fairseq_localness.modules.scores`) as
  one fused FlexAttention call (CUDA).

:mod:`.choice` decides which of them computes a branch, and whether a call takes the
fast path or the eager reference of :mod:`~fairseq_localness.modules.attention`;
:mod:`.emulation` has the CPU take CUDA's choices, for tests.
"""
