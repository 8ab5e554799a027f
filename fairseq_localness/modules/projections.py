"""Several projections of the same input as one product: an attention core's queries,
keys and values in self-attention, and the Dual Contextual module's FI units.

fairseq's ``MultiheadAttention`` (and torch's ``multi_head_attention_forward`` with
separate weights) projects q, k and v with three products. Forward, one product of the
stacked weights costs as many kernels (two concatenations, one product); backward, it
runs one product per gradient where three projections run three each and sum the
input's three gradients: on CUDA, where a Transformer-base training step is bound by
its kernel launches (issue 38: 16.5 ms of kernels in a 37.5 ms step on an H200), 6
fewer kernels per attention call, 12 for the Dual Contextual module's six projections
as two products. The parameters stay the modules' own (``q_proj``, ``k_proj``,
``v_proj``: checkpoints, parameter counts and initialisation are unchanged), and the
stacked weight is built again in the backward pass instead of being kept, so the pass
keeps what separate projections keep, with one exception: q, k and v are views of one
stacked output, so a path that keeps k and v but not q for its backward pass (the eager
reference's products) keeps q's part too, one ``T x B x C`` more per core.

Where (:data:`STACKED_PROJECTION_DEVICES`): CUDA, not yet measured on a GPU. Switched
on for the CPU, the stacked products took the non-view operators of one training pass
(``wmt_en_de``, 4 x 32 tokens, forward and backward, ``attention_impl="sdpa"``) from
1,612 to 1,498 for Enc-DC and from 1,890 to 1,662 for Full-DC, 19 fewer per module;
from 3,062 to 2,982 for HySAN e1 (12 cores), 1,634 to 1,612 for localness (3 cores),
1,490 to 1,474 for the hybrid (2 cores), about 7 fewer per core (the transformer's:
1,274).
On the CPU they were slower: an Enc-DC training step took 1/0.989 of the time at
16 x 32 tokens and 1/0.980 at 8 x 256, Full-DC 1/0.997 at 16 x 32 (one process, 12
and 8 paired rounds, process CPU time, one thread): building the stacked weights
forward and backward costs more there than the calls it saves, so the CPU keeps the
separate projections.
"""
from typing import Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

STACKED_PROJECTION_DEVICES = ("cuda",)


def stacks_projections(x: Tensor, projections: Sequence[nn.Linear]) -> bool:
    """Whether ``projections`` of ``x`` run as one product (:func:`stacked_linear`):
    on a device of :data:`STACKED_PROJECTION_DEVICES`, where every projection has a
    bias and the same output size."""
    return (x.device.type in STACKED_PROJECTION_DEVICES
            and all(proj.bias is not None for proj in projections)
            and len({proj.out_features for proj in projections}) == 1)


class _StackedLinear(torch.autograd.Function):
    """``x W^T + b`` for the weights ``W_1 .. W_n`` and biases ``b_1 .. b_n`` of n
    projections of the same input, stacked (``... x (out_1 + ... + out_n)``): one
    product forward, one per gradient backward. The stacked weight is built again in
    the backward pass instead of being kept: the pass keeps ``x`` and the parameters
    themselves, as n separate projections do."""

    @staticmethod
    def forward(ctx, x, *params):
        count = len(params) // 2
        weights, biases = params[:count], params[count:]
        ctx.save_for_backward(x, *weights)
        ctx.bias_dtypes = [b.dtype for b in biases]
        return F.linear(x, torch.cat(weights), torch.cat(biases))

    @staticmethod
    def backward(ctx, grad):
        # In the dtype of the forward product, which autocast (--amp) may have run in
        # half precision on float32 inputs; each gradient back in its input's dtype
        # (the casts launch nothing where the dtypes agree: --fp16, --bf16, float32).
        x, *weights = ctx.saved_tensors
        dtype = grad.dtype
        sizes = [w.size(0) for w in weights]
        rows = grad.reshape(-1, grad.size(-1))
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = (rows @ torch.cat(weights).to(dtype)).view(x.shape).to(x.dtype)
        grad_w = grad_b = [None] * len(weights)
        if any(ctx.needs_input_grad[1:1 + len(weights)]):
            parts = (rows.t() @ x.reshape(-1, x.size(-1)).to(dtype)).split(sizes)
            grad_w = [part.to(w.dtype) for part, w in zip(parts, weights)]
        if any(ctx.needs_input_grad[1 + len(weights):]):
            parts = rows.sum(0).split(sizes)
            grad_b = [part.to(bias_dtype) for part, bias_dtype in zip(parts, ctx.bias_dtypes)]
        return (grad_x, *grad_w, *grad_b)


def stacked_parameters(projections: Sequence[nn.Linear]) -> Tuple[Tensor, Tensor]:
    """The weights of the ``nn.Linear`` modules ``projections`` stacked, and their
    biases (zeros for a projection without one): the parameters of one product that
    computes them all, as a tensor of its own (built without gradients by the callers:
    a beam search's steps)."""
    return (torch.cat([proj.weight for proj in projections]),
            torch.cat([proj.weight.new_zeros(proj.out_features) if proj.bias is None else proj.bias
                       for proj in projections]))


def stacked_projection(x: Tensor, projections: Sequence[nn.Linear]) -> Tensor:
    """The outputs of the ``nn.Linear`` modules ``projections`` (each with a bias) on the
    same input ``x`` side by side, ``... x (out_1 + ... + out_n)``, computed as one
    product (:class:`_StackedLinear`)."""
    params = [proj.weight for proj in projections] + [proj.bias for proj in projections]
    return _StackedLinear.apply(x, *params)


def stacked_linear(x: Tensor, projections: Sequence[nn.Linear]) -> Tuple[Tensor, ...]:
    """The outputs of the ``nn.Linear`` modules ``projections`` (each with a bias, the
    same output size) on the same input ``x``, computed as one product
    (:func:`stacked_projection`): ``n`` tensors ``... x out``, views of the stacked
    output (whose gradients the backward pass stacks again in one kernel)."""
    out = stacked_projection(x, projections)
    return out.unflatten(-1, (len(projections), -1)).unbind(-2)
