"""Running a model over a split: fairseq's batches in the dataset's order, and the
statistics the :class:`~fairseq_localness.modules.observe.AttentionRecorder`
records, cut down to the real (non-padding) tokens of each sentence.

Shape notation: B = sentences in a batch, H = heads, Tq / Tk = (padded) query / key
length, n = real length of one sentence (including the end-of-sentence token fairseq
appends to every source and target).

fairseq and torch are imported inside the functions that need them.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional, Tuple

from fairseq_localness.analysis.cli_args import AnalysisError
from fairseq_localness.analysis.layers import side_of
from fairseq_localness.analysis.outputs import progress


@dataclass
class SentenceStats:
    """The recorded statistics of one sentence, cut to its real tokens.

    ``modules`` maps a recording module's name to ``(side, {stat name: tensor})``; a
    per-token statistic has its query axis last and of length n (``n``, ``H x n``),
    an attention distribution (``probs_*``, only when asked for) is ``H x n_q x n_k``.
    ``src``/``tgt`` are the real source/target token ids (with the final EOS).
    """

    id: int
    src: Any
    tgt: Any
    modules: Dict[str, Tuple[str, Dict[str, Any]]] = field(default_factory=dict)


def _real_query_slice(side: str, src_len: int, src_width: int, tgt_len: int) -> slice:
    """Which query positions of a padded batch row are real tokens."""
    if side == "encoder":  # fairseq left-pads sources
        return slice(src_width - src_len, src_width)
    return slice(0, tgt_len)  # targets are right-padded


def _real_key_slice(side: str, src_len: int, src_width: int, tgt_len: int) -> slice:
    if side == "decoder":
        return slice(0, tgt_len)
    return slice(src_width - src_len, src_width)


def batch_iterator(task, split: str, batch_size: int):
    """fairseq's batches of ``split``, in the dataset's length order, no shuffling."""
    try:
        task.load_dataset(split)
    except FileNotFoundError as e:
        raise AnalysisError(f"split {split!r}: {e}") from None
    dataset = task.dataset(split)
    itr = task.get_batch_iterator(
        dataset=dataset, max_sentences=batch_size, ignore_invalid_inputs=True
    ).next_epoch_itr(shuffle=False)
    return dataset, itr


def iter_samples(
    task,
    split: str,
    *,
    batch_size: int = 32,
    max_sentences: Optional[int] = None,
    use_cuda: bool = False,
    show_progress: bool = True,
    desc: str = "forward",
) -> Iterator[dict]:
    """fairseq's samples of ``split`` in the dataset's order (moved to the GPU with
    ``use_cuda``), with a progress bar over sentences; stops after the batch that
    reaches ``max_sentences`` (whole batches: the caller cuts the last one if needed)."""
    dataset, itr = batch_iterator(task, split, batch_size)
    total = len(dataset) if max_sentences is None else min(max_sentences, len(dataset))
    bar = progress(total=total, desc=desc, disable=not show_progress)
    done = 0
    try:
        for sample in itr:
            if done >= total:
                break
            if use_cuda:
                from fairseq import utils

                sample = utils.move_to_cuda(sample)
            n = min(sample["id"].numel(), total - done)
            done += n
            bar.update(n)
            yield sample
    finally:
        bar.close()


def iter_sentence_stats(
    model,
    task,
    split: str,
    *,
    max_sentences: Optional[int] = None,
    batch_size: int = 32,
    with_attention: bool = False,
    use_cuda: bool = False,
    show_progress: bool = True,
    desc: str = "forward",
) -> Iterator[SentenceStats]:
    """Run ``model`` teacher-forced over ``split`` of ``task`` inside an
    :class:`AttentionRecorder` and yield one :class:`SentenceStats` per sentence.

    ``with_attention`` keeps the ``probs_*`` distributions (large).
    """
    import torch

    from fairseq_localness.modules.observe import PROBS_PREFIX, AttentionRecorder

    pad = task.source_dictionary.pad()
    tgt_pad = task.target_dictionary.pad()
    done = 0
    for sample in iter_samples(task, split, batch_size=batch_size, max_sentences=max_sentences,
                               use_cuda=use_cuda, show_progress=show_progress, desc=desc):
        net_input = sample["net_input"]
        with AttentionRecorder(model) as rec, torch.no_grad():
            model(**net_input)
        src_tokens = net_input["src_tokens"].cpu()
        src_width = src_tokens.size(1)
        src_lens = src_tokens.ne(pad).sum(1).tolist()
        target = sample["target"].cpu() if sample.get("target") is not None else None
        tgt_lens = target.ne(tgt_pad).sum(1).tolist() if target is not None else [0] * len(src_lens)
        for b, sent_id in enumerate(sample["id"].tolist()):
            if max_sentences is not None and done >= max_sentences:
                return
            stats = SentenceStats(
                id=sent_id,
                src=src_tokens[b, src_width - src_lens[b]:],
                tgt=target[b, : tgt_lens[b]] if target is not None else None,
            )
            for module_name, calls in rec.records.items():
                side = side_of(module_name)
                rows = _real_query_slice(side, src_lens[b], src_width, tgt_lens[b])
                values = {}
                for name, value in calls[0].items():
                    if name.startswith(PROBS_PREFIX):
                        if not with_attention:
                            continue
                        cols = _real_key_slice(side, src_lens[b], src_width, tgt_lens[b])
                        values[name] = value[b][..., rows, cols]
                    else:
                        values[name] = value[b][..., rows]
                if values:
                    stats.modules[module_name] = (side, values)
            done += 1
            yield stats
