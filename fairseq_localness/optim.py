"""``--optimizer adam_l2``: fairseq's Adam with an L2 penalty on the loss.

Xu et al. (2019, appendix A.1) train with Adam and "set the L2 regularization to
lambda = 1e-7" (THUMT's ``l2_regularizer``: the loss gets ``lambda * sum(w^2) / 2``, so
every gradient gets ``+ lambda * w`` before Adam normalises it). fairseq's
``--weight-decay`` cannot express this: its Adam decays the weights after the update
(``w -= lr * wd * w``, AdamW, Loshchilov and Hutter 2019), outside the moment
estimates. ``adam_l2`` is fairseq's ``adam`` (the same options, its fused CUDA kernel
where available) that adds ``--l2-regularization * w`` to each gradient before the
step, which is what ``torch.optim.Adam(weight_decay=...)`` does.

With mixed precision fairseq may pass the step a ``scale`` (the gradients are
``scale`` times the true ones); the penalty is scaled with them.
"""
from dataclasses import dataclass, field

import torch
from fairseq.optim import register_optimizer
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig


@dataclass
class FairseqAdamL2Config(FairseqAdamConfig):
    l2_regularization: float = field(
        default=0.0, metadata={"help": "L2 penalty on the loss, lambda/2 * sum(w^2): adds lambda * w to every "
                               "gradient before the Adam step (Xu et al. 2019: 1e-7); unlike --weight-decay, "
                               "which fairseq's Adam applies after the step (AdamW)"})


@register_optimizer("adam_l2", dataclass=FairseqAdamL2Config)
class FairseqAdamL2(FairseqAdam):
    def step(self, closure=None, scale=1.0, groups=None):
        l2 = self.cfg.l2_regularization
        if l2:
            with torch.no_grad():
                for p in self.params:
                    if p.grad is not None:
                        p.grad.add_(p.to(p.grad.dtype), alpha=l2 * scale)
        super().step(closure, scale=scale, groups=groups)
