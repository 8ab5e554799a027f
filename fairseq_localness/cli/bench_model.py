"""The benchmark's models and steps (``fairseq-localness-bench``): a task stand-in, the
models built as ``fairseq-train`` builds them, a synthetic batch, the dtype check, the
optimizer (fairseq's ``--fp16``/``--bf16`` step in half precision), one training step
and one beam search. Measured by :mod:`fairseq_localness.cli.bench_measure`, timed by
:mod:`fairseq_localness.cli.bench_run`."""
from typing import List, Tuple

import torch

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class _Toy:
    """A task stand-in: a joined dictionary of ``vocab`` symbols."""

    def __init__(self, vocab: int):
        from fairseq.data import Dictionary

        d = Dictionary()
        for i in range(vocab - d.nspecial):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d


def build(model_name: str, size: str, options: List[str], task, device, dtype=torch.float32):
    from fairseq import options as fairseq_options
    from fairseq.models import ARCH_MODEL_REGISTRY

    import fairseq_localness  # noqa: F401

    arch = f"{model_name}_{size}"
    parser = fairseq_options.get_training_parser()
    args = fairseq_options.parse_args_and_arch(
        parser, ["/dev/null", "--task", "translation", "--arch", arch, "--share-all-embeddings"] + options
    )
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task).to(device=device, dtype=dtype)
    return arch, model


def make_batch(task, bsz: int, src_len: int, tgt_len: int, device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    lo, hi = d.nspecial, len(d)
    # lengths vary by up to 20% so that padding is exercised as in real batches
    lengths = [src_len - int(0.2 * src_len * i / max(bsz - 1, 1)) for i in range(bsz)]
    src = torch.full((bsz, src_len), d.pad(), dtype=torch.long)
    for b, n in enumerate(lengths):
        src[b, src_len - n :] = torch.randint(lo, hi, (n,), generator=g)
        src[b, -1] = d.eos()
    tgt = torch.randint(lo, hi, (bsz, tgt_len), generator=g)
    tgt[:, -1] = d.eos()
    prev = torch.cat([torch.full((bsz, 1), d.eos(), dtype=torch.long), tgt[:, :-1]], 1)
    return src.to(device), torch.tensor(lengths, device=device), prev.to(device), tgt.to(device)


# --------------------------------------------------------------------------- dtype
def check_dtype(dtype: str, device_type: str, gpu_name: str = "", capability: Tuple[int, int] = (0, 0)):
    """``None`` if ``device_type`` (``"cpu"`` or ``"cuda"``, with the GPU's name and
    compute capability) can run the benchmark in ``dtype``, else why not.

    fp16 needs a CUDA GPU: fairseq trains in fp16 only there, and on a CPU most
    float16 ops run through float32 conversions (slower than fp32, so its timings
    would say nothing about the models). bf16 runs on the CPU and on GPUs with bfloat16 arithmetic (compute
    capability 8.0: A100, H100, ...); older GPUs emulate it.
    """
    if dtype == "fp16" and device_type != "cuda":
        return ("--dtype fp16: needs a CUDA GPU (fairseq trains in fp16 only on GPUs, and on the CPU most "
                "float16 ops run through float32 conversions); expected --dtype fp32 or bf16 on the CPU")
    if dtype == "bf16" and device_type == "cuda" and capability < (8, 0):
        return (f"--dtype bf16: {gpu_name} (compute capability {capability[0]}.{capability[1]}) has no "
                f"bfloat16 arithmetic (needs 8.0, e.g. A100, H100); expected --dtype fp16 or fp32")
    return None


class _MixedPrecisionAdam:
    """Adam on fp32 master copies of a fp16/bf16 model's parameters, as fairseq's
    ``FP16Optimizer`` (``--fp16``/``--bf16``): the gradients are copied to fp32 (and
    unscaled in fp16), Adam steps the master weights, which are copied back into the
    model. fp16 uses a fixed loss scale (fairseq's initial 128); bf16 needs none.

    The master gradients are fp32 buffers of their own, kept between steps as
    fairseq keeps its flat fp32 gradient buffer, and every step of the copy is one
    multi-tensor (``_foreach``) operator call over all parameters: on CUDA a few
    kernels for the whole model instead of a copy and a multiply per parameter tensor
    (two launches per tensor, a third of the transformer's per training step at
    Transformer-base; a model with more parameter tensors paid more). bf16 skips the
    unscaling, which multiplied by 1."""

    def __init__(self, model, lr: float, loss_scale: float):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = [p.detach().float().clone().requires_grad_(True) for p in self.params]
        self.grads = [torch.zeros_like(m) for m in self.master]
        self.optimizer = torch.optim.Adam(self.master, lr=lr)
        self.loss_scale = loss_scale

    def zero_grad(self, set_to_none: bool = True):
        for p in self.params:
            p.grad = None

    def step(self):
        model_grads, master_grads = [], []
        for p, m, g in zip(self.params, self.master, self.grads):
            m.grad = None if p.grad is None else g  # Adam skips a parameter without a gradient
            if p.grad is not None:
                model_grads.append(p.grad)
                master_grads.append(g)
        if model_grads:
            torch._foreach_copy_(master_grads, model_grads)  # to fp32
            if self.loss_scale != 1.0:
                torch._foreach_mul_(master_grads, 1.0 / self.loss_scale)
        self.optimizer.step()
        with torch.no_grad():
            torch._foreach_copy_(self.params, self.master)


def make_optimizer(model, dtype):
    if dtype == torch.float32:
        return torch.optim.Adam(model.parameters(), lr=1e-4)
    return _MixedPrecisionAdam(model, lr=1e-4, loss_scale=128.0 if dtype == torch.float16 else 1.0)


def _train_step(model, optimizer, batch):
    src, lengths, prev, tgt = batch
    logits, _ = model(src, lengths, prev)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))
    optimizer.zero_grad(set_to_none=True)
    (loss * getattr(optimizer, "loss_scale", 1.0)).backward()
    optimizer.step()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _loss(model, batch):
    src, lengths, prev, tgt = batch
    logits, _ = model(src, lengths, prev)
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), tgt.view(-1))


def _decode(model, task, decode_src, decode_len):
    from fairseq.sequence_generator import SequenceGenerator

    model.eval()
    gen = SequenceGenerator(
        [model], task.target_dictionary, beam_size=4, max_len_a=0, max_len_b=decode_len, min_len=decode_len,
    )
    sample = {"net_input": {"src_tokens": decode_src[0], "src_lengths": decode_src[1]}}
    with torch.no_grad():
        gen.generate([model], sample)
    model.train()

