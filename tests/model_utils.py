"""Helpers for the model tests: build any registered architecture on a toy
dictionary from command-line style arguments, without data on disk."""
import argparse
from typing import List, Optional

import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY

import fairseq_localness  # noqa: F401  (registers the models)

VOCAB = 40
TINY = [
    "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
    "--encoder-layers", "3", "--decoder-embed-dim", "32", "--decoder-ffn-embed-dim", "64",
    "--decoder-attention-heads", "4", "--decoder-layers", "3",
    "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0",
]


class ToyTask:
    def __init__(self, vocab: int = VOCAB):
        d = Dictionary()
        for i in range(vocab):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d
        self.src_dict = self.tgt_dict = d


def parse_model_args(arch: str, extra: Optional[List[str]] = None) -> argparse.Namespace:
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["/dev/null", "--task", "translation", "--arch", arch] + list(extra or [])
    )
    return args


def build_model(arch: str, extra: Optional[List[str]] = None, task: Optional[ToyTask] = None, seed: int = 0):
    args = parse_model_args(arch, extra)
    torch.manual_seed(seed)
    task = task or ToyTask()
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    return model.eval(), task


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def random_batch(task, lengths, seed=0, left_pad_source=True):
    """Source tokens (left padded like fairseq), lengths, prev_output_tokens, target."""
    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    pad, eos = d.pad(), d.eos()
    bsz, max_len = len(lengths), max(lengths)
    src = torch.full((bsz, max_len), pad, dtype=torch.long)
    for b, n in enumerate(lengths):
        toks = torch.randint(d.nspecial, len(d), (n - 1,), generator=g).tolist() + [eos]
        if left_pad_source:
            src[b, max_len - n:] = torch.tensor(toks)
        else:
            src[b, :n] = torch.tensor(toks)
    tgt_len = max_len + 1
    tgt = torch.randint(d.nspecial, len(d), (bsz, tgt_len), generator=g)
    tgt[:, -1] = eos
    prev = torch.cat([torch.full((bsz, 1), eos, dtype=torch.long), tgt[:, :-1]], dim=1)
    return src, torch.tensor(lengths), prev, tgt


def copy_shared_weights(src_model, dst_model):
    """Load every parameter of src into dst that has the same name and shape."""
    dst_state = dst_model.state_dict()
    for name, value in src_model.state_dict().items():
        if name in dst_state and dst_state[name].shape == value.shape:
            dst_state[name] = value.clone()
    dst_model.load_state_dict(dst_state)
