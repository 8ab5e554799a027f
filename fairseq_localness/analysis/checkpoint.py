"""Loading a trained checkpoint with its task for analysis (fairseq and torch are
imported inside, so that a tool's ``--help`` starts quickly)."""
import os
from typing import Optional

from fairseq_localness.analysis.cli_args import AnalysisError, require_file


def load_checkpoint(path: str, data: Optional[str] = None, cpu: bool = False, what: str = "--path checkpoint"):
    """Load one checkpoint with its task: ``(model, cfg, task, use_cuda)``.

    ``data`` overrides the data directory recorded in the checkpoint (needed when the
    checkpoint was trained elsewhere: the task reads its dictionaries from there).
    The model is in eval mode, on the GPU if one is available and ``cpu`` is False.
    """
    import torch

    import fairseq_localness  # noqa: F401  (registers the models, fixes torch.load)
    from fairseq import checkpoint_utils

    require_file(path, what)
    if data is not None and not os.path.isdir(data):
        raise AnalysisError(f"data directory {data!r} does not exist")
    overrides = {"data": data} if data is not None else {}
    if data is None:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
        cfg = state.get("cfg")
        stored = getattr(getattr(cfg, "task", None), "data", None) if cfg is not None else None
        if stored is None and state.get("args") is not None:
            stored = getattr(state["args"], "data", None)
        from fairseq.utils import split_paths

        # (split as fairseq's task splits it: on ':' but for a URL, whose paths '|' separates)
        folder = split_paths(str(stored))[0] if stored else ""
        if not stored or not os.path.isdir(folder):
            raise AnalysisError(
                f"the data directory recorded in {path} ({stored!r}) does not exist here; "
                "pass the binarized data directory (DATA) as the first argument"
            )
        del state
        from fairseq_localness.checkpoint.files import check_named_file, is_dictionary, regular_file

        for name in sorted(os.listdir(folder)):  # a FIFO there would hang the task's setup, a large file fill memory
            if is_dictionary(name):
                check_named_file(os.path.join(folder, name), path,
                                 f"the dictionary {name!r} in the data directory it records ({folder!r})", folder)
            elif name.endswith((".idx", ".bin")):  # (a split's data, memory-mapped: any size, but a file)
                regular_file(os.path.join(folder, name), path,
                             f"the data file {name!r} in the data directory it records ({folder!r})")
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
    model = models[0]
    model.eval()
    use_cuda = torch.cuda.is_available() and not cpu
    if use_cuda:
        model.cuda()
    return model, cfg, task, use_cuda


def count_parameters(model) -> int:
    """Parameters of a model, each shared tensor counted once (as fairseq-train's
    ``num. shared model params``)."""
    return sum(p.numel() for p in model.parameters())
