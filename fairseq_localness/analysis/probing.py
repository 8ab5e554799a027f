"""Probing tasks (Conneau et al. 2018) on a frozen NMT encoder: Xu et al. 2019 Tables
3-4, the DC paper's Table 4.

Each sentence is encoded by the checkpoint's encoder (frozen, eval mode) and its
vector is the **mean of the last encoder layer's output over the sentence's real
tokens** (padding excluded; the end-of-sentence token fairseq appends to every
source is included, as the model always sees it). A classifier is trained on the
vectors of the ``tr`` sentences, early-stopped on the accuracy of the ``va``
sentences, and scored on the ``te`` sentences.

Data: SentEval's probing files (``tr|va|te <TAB> label <TAB> sentence``, one
example per line; the sentences are tokenized text), downloaded by the user
(``https://github.com/facebookresearch/SentEval``, ``data/probing``). The ten
tasks and their groups (Conneau et al. 2018, as the papers group them):

============  ==============================  ==========
task          SentEval file                   group
============  ==============================  ==========
SentLen       sentence_length.txt             surface
WC            word_content.txt                surface
TreeDepth     tree_depth.txt                  syntactic
TopConst      top_constituents.txt            syntactic
BShift        bigram_shift.txt                syntactic
Tense         past_present.txt                semantic
SubjNum       subj_number.txt                 semantic
ObjNum        obj_number.txt                  semantic
SOMO          odd_man_out.txt                 semantic
CoordInv      coordination_inversion.txt      semantic
============  ==============================  ==========

``--senteval-dir DIR`` runs every one of these files found in DIR (``--tasks``
selects some); ``--task NAME=FILE[:GROUP]`` adds any file in the same format. The
sentences are segmented like the model's training data before the dictionary
lookup: ``--bpe sentencepiece --sentencepiece-model M`` or ``--bpe subword_nmt
--bpe-codes CODES`` (``--bpe none``: already segmented); apply the model's
tokenizer/truecaser to the files first if its training data had one.

Classifier (SentEval's MLP): ``Linear(d, hidden) -> Dropout -> Sigmoid ->
Linear(hidden, classes)`` (``--hidden 0``: logistic regression), cross-entropy,
mini-batches of ``--batch-size`` (64), ``--optimizer adam`` (lr 1e-3) or
``rmsprop`` (the DC paper: lr 2.5e-4), L2 weight decay ``--weight-decay`` (1e-4,
the DC paper's), at most ``--max-epochs`` (100) epochs, stopping when the
validation accuracy has not improved for ``--patience`` (5) epochs; the test
accuracy is that of the epoch with the best validation accuracy. Inputs are
standardized with the training set's mean and deviation (``--no-standardize`` to
keep them raw). The classifier runs on one CPU thread (its matrices are tiny).

The accuracy of a group is the unweighted mean of its tasks' test accuracies (this
reproduces the group columns of Xu et al.'s Table 3 from their Table 4).

Outputs in ``--output-dir``: ``probing.csv`` (model, task, group, classes, split
sizes, validation and test accuracy, epochs), ``probing_groups.csv`` (model, group,
tasks, accuracy), ``probing.json`` and ``probing.png`` (test accuracy per task and
per group, one bar per model).

Example (Xu et al. Table 3: baseline vs hybrid encoder)::

    python -m fairseq_localness.analysis.probing data-bin/wmt14_en_de \\
        --path ckpt/transformer/checkpoint_best.pt --path ckpt/hybrid/checkpoint_best.pt \\
        --labels TRANSFORMER HYBRID --senteval-dir SentEval/data/probing \\
        --bpe subword_nmt --bpe-codes wmt14_en_de/code --output-dir analysis/probing
"""
import argparse
import os
import random
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_localness.analysis.checkpoint import load_checkpoint
from fairseq_localness.analysis.cli_args import (
    AnalysisError, add_checkpoint_args, add_output_args, labels_for, logger, require_file, run_cli, single_thread,
    start_tool,
)
from fairseq_localness.analysis.outputs import progress, write_csv, write_json
from fairseq_localness.analysis.plotting import finish_figure, pyplot
from fairseq_localness.analysis.segmentation import (
    add_segmenter_args, collate_source, encode_lines, segmenter_from_args,
)

SENTEVAL_TASKS: Tuple[Tuple[str, str, str], ...] = (
    ("SentLen", "sentence_length.txt", "surface"),
    ("WC", "word_content.txt", "surface"),
    ("TreeDepth", "tree_depth.txt", "syntactic"),
    ("TopConst", "top_constituents.txt", "syntactic"),
    ("BShift", "bigram_shift.txt", "syntactic"),
    ("Tense", "past_present.txt", "semantic"),
    ("SubjNum", "subj_number.txt", "semantic"),
    ("ObjNum", "obj_number.txt", "semantic"),
    ("SOMO", "odd_man_out.txt", "semantic"),
    ("CoordInv", "coordination_inversion.txt", "semantic"),
)
GROUPS = ("surface", "syntactic", "semantic")
SPLITS = ("tr", "va", "te")


@dataclass
class ProbeConfig:
    hidden: int = 50
    dropout: float = 0.0
    optimizer: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 64
    max_epochs: int = 100
    patience: int = 5
    standardize: bool = True
    seed: int = 1


@dataclass
class ProbingTask:
    name: str
    path: str
    group: str
    sentences: Dict[str, List[str]]
    labels: Dict[str, List[str]]

    @property
    def classes(self) -> List[str]:
        return sorted({y for split in SPLITS for y in self.labels[split]})


# --------------------------------------------------------------------------- data
def read_task(name: str, path: str, group: str, max_per_split: Optional[int] = None, seed: int = 1) -> ProbingTask:
    """Read a SentEval probing file; ``max_per_split`` keeps a random subset."""
    require_file(path, f"probing task {name}:")
    sentences = {s: [] for s in SPLITS}
    labels = {s: [] for s in SPLITS}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            parts = line.split("\t")
            if len(parts) != 3 or parts[0] not in SPLITS:
                raise AnalysisError(
                    f"{path}:{lineno}: expected 'tr|va|te<TAB>label<TAB>sentence' (SentEval's probing format), "
                    f"got {line[:80]!r}"
                )
            sentences[parts[0]].append(parts[2])
            labels[parts[0]].append(parts[1])
    for s in SPLITS:
        if not sentences[s]:
            raise AnalysisError(f"{path}: no '{s}' examples (need tr, va and te)")
    if max_per_split:
        rng = random.Random(seed)
        for s in SPLITS:
            if len(sentences[s]) > max_per_split:
                keep = sorted(rng.sample(range(len(sentences[s])), max_per_split))
                sentences[s] = [sentences[s][i] for i in keep]
                labels[s] = [labels[s][i] for i in keep]
    return ProbingTask(name, path, group, sentences, labels)


def task_list(args) -> List[Tuple[str, str, str]]:
    """(name, file, group) of the tasks to run."""
    tasks = []
    if args.senteval_dir:
        if not os.path.isdir(args.senteval_dir):
            raise AnalysisError(f"--senteval-dir {args.senteval_dir!r} does not exist")
        known = {t[0]: t for t in SENTEVAL_TASKS}
        wanted = args.tasks or [t[0] for t in SENTEVAL_TASKS]
        unknown = [t for t in wanted if t not in known]
        if unknown:
            raise AnalysisError(f"--tasks {unknown}: allowed: {', '.join(known)}")
        for name in wanted:
            _, fname, group = known[name]
            path = os.path.join(args.senteval_dir, fname)
            if os.path.isfile(path):
                tasks.append((name, path, group))
            elif args.tasks:
                raise AnalysisError(f"--tasks {name}: {path} does not exist")
        if not tasks:
            raise AnalysisError(f"--senteval-dir {args.senteval_dir!r} holds none of SentEval's probing files "
                                f"({', '.join(t[1] for t in SENTEVAL_TASKS)})")
    elif args.tasks:
        raise AnalysisError("--tasks selects tasks of --senteval-dir")
    for spec in args.task or []:
        if "=" not in spec:
            raise AnalysisError(f"--task {spec!r}: expected NAME=FILE or NAME=FILE:GROUP")
        name, rest = spec.split("=", 1)
        path, group = rest, "other"
        if ":" in rest and not os.path.isfile(rest):
            path, group = rest.rsplit(":", 1)
        tasks.append((name, path, group))
    if not tasks:
        raise AnalysisError("no probing tasks: give --senteval-dir and/or --task")
    names = [t[0] for t in tasks]
    if len(set(names)) < len(names):
        raise AnalysisError(f"task names are not unique: {names}")
    return tasks


# --------------------------------------------------------------------------- sentence vectors
def sentence_vectors(model, dictionary, sentences: Sequence[str], segmenter, *, batch_size: int = 128,
                     use_cuda: bool = False, show_progress: bool = True, desc: str = "encode"):
    """Mean of the last encoder layer over the real tokens of each sentence,
    ``N x C`` float32 CPU tensor (rows in the order of ``sentences``)."""
    import torch

    max_positions = None
    try:
        max_positions = int(model.encoder.max_positions())
    except Exception:  # noqa: BLE001 - encoders without a limit
        pass
    tokens, unk = encode_lines(sentences, dictionary, segmenter, max_positions)
    if unk > 0.2:
        logger.warning("%s: %.0f%% of the subwords are unknown to the model's dictionary: check --bpe", desc,
                       100 * unk)
    order = sorted(range(len(tokens)), key=lambda i: tokens[i].numel())
    out = torch.zeros(len(tokens), model.encoder.embed_tokens.embedding_dim)
    bar = progress(total=len(tokens), desc=desc, disable=not show_progress)
    with torch.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            src, lengths = collate_source([tokens[i] for i in idx], dictionary, use_cuda)
            enc = model.encoder(src, src_lengths=lengths)
            states = enc["encoder_out"][0].float()  # T x B x C
            pad = enc["encoder_padding_mask"][0] if enc.get("encoder_padding_mask") else src.eq(dictionary.pad())
            keep = (~pad).t().unsqueeze(-1).float()  # T x B x 1
            mean = (states * keep).sum(0) / keep.sum(0).clamp(min=1.0)  # B x C
            out[torch.tensor(idx)] = mean.cpu()
            bar.update(len(idx))
    bar.close()
    return out


# --------------------------------------------------------------------------- classifier
def train_probe(x_tr, y_tr, x_va, y_va, x_te, y_te, cfg: ProbeConfig) -> Dict:
    """Train the MLP on (x_tr, y_tr) with early stopping on the accuracy on (x_va,
    y_va); returns the validation and test accuracy (in %) of the best epoch.

    ``x_*``: float tensors ``N x C``; ``y_*``: long tensors of class indices.
    """
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    x_tr, x_va, x_te = x_tr.float(), x_va.float(), x_te.float()
    if cfg.standardize:
        mean = x_tr.mean(0, keepdim=True)
        std = x_tr.std(0, keepdim=True).clamp(min=1e-6)
        x_tr, x_va, x_te = [(x - mean) / std for x in (x_tr, x_va, x_te)]
    classes = int(max(y_tr.max(), y_va.max(), y_te.max())) + 1
    dim = x_tr.size(1)
    if cfg.hidden > 0:
        net = nn.Sequential(nn.Linear(dim, cfg.hidden), nn.Dropout(cfg.dropout), nn.Sigmoid(),
                            nn.Linear(cfg.hidden, classes))
    else:
        net = nn.Sequential(nn.Dropout(cfg.dropout), nn.Linear(dim, classes))
    if cfg.optimizer == "adam":
        opt = torch.optim.Adam(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    elif cfg.optimizer == "rmsprop":
        opt = torch.optim.RMSprop(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    else:
        raise AnalysisError(f"--optimizer {cfg.optimizer!r}: allowed: adam, rmsprop")
    loss_fn = nn.CrossEntropyLoss()

    def accuracy(x, y) -> float:
        net.eval()
        with torch.no_grad():
            pred = torch.cat([net(x[i:i + 4096]).argmax(-1) for i in range(0, x.size(0), 4096)])
        net.train()
        return 100.0 * float((pred == y).float().mean())

    best = (-1.0, None, 0)  # valid accuracy, state, epoch
    bad = 0
    epochs = 0
    for epoch in range(1, cfg.max_epochs + 1):
        epochs = epoch
        net.train()
        perm = torch.randperm(x_tr.size(0), generator=g)
        for i in range(0, x_tr.size(0), cfg.batch_size):
            idx = perm[i:i + cfg.batch_size]
            opt.zero_grad()
            loss_fn(net(x_tr[idx]), y_tr[idx]).backward()
            opt.step()
        acc = accuracy(x_va, y_va)
        if acc > best[0]:
            best = (acc, {k: v.clone() for k, v in net.state_dict().items()}, epoch)
            bad = 0
        else:
            bad += 1
            if bad >= cfg.patience:
                break
    net.load_state_dict(best[1])
    return {"valid_acc": best[0], "test_acc": accuracy(x_te, y_te), "train_acc": accuracy(x_tr, y_tr),
            "best_epoch": best[2], "epochs": epochs}


def run_task(model, dictionary, task: ProbingTask, segmenter, cfg: ProbeConfig, *, encode_batch_size=128,
             use_cuda=False, show_progress=True, label="") -> Dict:
    import torch

    classes = task.classes
    index = {c: i for i, c in enumerate(classes)}
    xs, ys = {}, {}
    for s in SPLITS:
        xs[s] = sentence_vectors(model, dictionary, task.sentences[s], segmenter, batch_size=encode_batch_size,
                                 use_cuda=use_cuda, show_progress=show_progress, desc=f"{label} {task.name} {s}")
        ys[s] = torch.tensor([index[y] for y in task.labels[s]], dtype=torch.long)
    with single_thread():
        result = train_probe(xs["tr"], ys["tr"], xs["va"], ys["va"], xs["te"], ys["te"], cfg)
    majority = max(sum(1 for y in task.labels["te"] if y == c) for c in classes) / len(task.labels["te"])
    return dict(task=task.name, group=task.group, classes=len(classes), train=len(task.labels["tr"]),
                valid=len(task.labels["va"]), test=len(task.labels["te"]), majority_acc=100.0 * majority, **result)


# --------------------------------------------------------------------------- outputs
def group_rows(rows: List[Dict]) -> List[Dict]:
    out = []
    models = list(dict.fromkeys(r["model"] for r in rows))
    groups = list(dict.fromkeys(r["group"] for r in rows))
    groups = [g for g in GROUPS if g in groups] + [g for g in groups if g not in GROUPS]
    for m in models:
        for g in groups:
            accs = [r["test_acc"] for r in rows if r["model"] == m and r["group"] == g]
            if accs:
                out.append({"model": m, "group": g, "tasks": len(accs), "test_acc": sum(accs) / len(accs)})
    return out


def plot(rows: List[Dict], groups: List[Dict], path: str, title: str):
    plt = pyplot()
    models = list(dict.fromkeys(r["model"] for r in rows))
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    group_names = list(dict.fromkeys(g["group"] for g in groups))
    width = 0.8 / len(models)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(7, 0.8 * len(tasks) * len(models) ** 0.5 + 4), 3.8),
                                   gridspec_kw={"width_ratios": [max(len(tasks), 1), max(len(group_names), 1) + 0.5]})
    for k, m in enumerate(models):
        xs = [i + (k - (len(models) - 1) / 2) * width for i in range(len(tasks))]
        ys = [next(r["test_acc"] for r in rows if r["model"] == m and r["task"] == t) for t in tasks]
        ax1.bar(xs, ys, width=width * 0.95, color=f"C{k}", label=m)
        xs = [i + (k - (len(models) - 1) / 2) * width for i in range(len(group_names))]
        ys = [next(g["test_acc"] for g in groups if g["model"] == m and g["group"] == n) for n in group_names]
        ax2.bar(xs, ys, width=width * 0.95, color=f"C{k}", label=m)
    chance = [next(r["majority_acc"] for r in rows if r["task"] == t) for t in tasks]
    ax1.scatter(range(len(tasks)), chance, marker="_", s=200, color="black", label="majority class", zorder=3)
    ax1.set_xticks(range(len(tasks)))
    ax1.set_xticklabels(tasks, rotation=30, ha="right", fontsize=8)
    ax1.set_ylabel("test accuracy (%)")
    ax1.set_ylim(0, 100)
    ax1.set_title("per task", fontsize=9)
    ax2.set_xticks(range(len(group_names)))
    ax2.set_xticklabels(group_names, fontsize=8)
    ax2.set_ylim(0, 100)
    ax2.set_title("per group (mean of tasks)", fontsize=9)
    ax1.legend(fontsize=7, loc="lower left")
    return finish_figure(fig, path, title)


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-localness-analysis probing", description=__doc__.split("\n\n")[0])
    add_checkpoint_args(p, multiple=True)
    p.add_argument("--senteval-dir", default=None, help="directory with SentEval's probing files")
    p.add_argument("--tasks", nargs="+", default=None, help="run only these of the ten tasks (with --senteval-dir)")
    p.add_argument("--task", action="append", default=None, metavar="NAME=FILE[:GROUP]",
                   help="a probing file in SentEval's format (repeatable); GROUP defaults to 'other'")
    p.add_argument("--max-per-split", type=int, default=None,
                   help="use a random subset of at most this many examples per split (quick runs)")
    add_segmenter_args(p)
    p.add_argument("--encode-batch-size", type=int, default=128, help="sentences per encoder call (default: 128)")
    d = ProbeConfig()
    p.add_argument("--hidden", type=int, default=d.hidden, help=f"MLP hidden units, 0 = linear (default: {d.hidden})")
    p.add_argument("--dropout", type=float, default=d.dropout, help=f"default: {d.dropout}")
    p.add_argument("--optimizer", choices=["adam", "rmsprop"], default=d.optimizer, help=f"default: {d.optimizer}")
    p.add_argument("--lr", type=float, default=d.lr, help=f"default: {d.lr}")
    p.add_argument("--weight-decay", type=float, default=d.weight_decay, help=f"L2 (default: {d.weight_decay})")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"classifier mini-batch (default: {d.batch_size})")
    p.add_argument("--max-epochs", type=int, default=d.max_epochs, help=f"default: {d.max_epochs}")
    p.add_argument("--patience", type=int, default=d.patience,
                   help=f"stop after this many epochs without a better validation accuracy (default: {d.patience})")
    p.add_argument("--no-standardize", action="store_true", help="do not standardize the sentence vectors")
    p.add_argument("--seed", type=int, default=d.seed, help=f"default: {d.seed}")
    add_output_args(p)
    return p


def cli_main(argv=None):
    return run_cli("probing", main, argv, get_parser())


def main(args):
    out_dir = start_tool(args)
    cfg = ProbeConfig(hidden=args.hidden, dropout=args.dropout, optimizer=args.optimizer, lr=args.lr,
                      weight_decay=args.weight_decay, batch_size=args.batch_size, max_epochs=args.max_epochs,
                      patience=args.patience, standardize=not args.no_standardize, seed=args.seed)
    if cfg.hidden < 0 or cfg.max_epochs < 1 or cfg.patience < 1 or cfg.batch_size < 1:
        raise AnalysisError("--hidden must be >= 0, --max-epochs, --patience and --batch-size >= 1")
    tasks = [read_task(n, p, g, args.max_per_split, args.seed) for n, p, g in task_list(args)]
    segmenter = segmenter_from_args(args)
    labels = labels_for(args.path, args.labels)
    rows = []
    for path, label in zip(args.path, labels):
        model, model_cfg, task, use_cuda = load_checkpoint(path, args.data, args.cpu)
        for t in tasks:
            r = run_task(model, task.source_dictionary, t, segmenter, cfg, encode_batch_size=args.encode_batch_size,
                         use_cuda=use_cuda, show_progress=not args.no_progress, label=label)
            logger.info("%s %s: test accuracy %.2f (validation %.2f, epoch %d)", label, t.name, r["test_acc"],
                        r["valid_acc"], r["best_epoch"])
            rows.append(dict(model=label, **r))
        del model
    groups = group_rows(rows)
    cols = ["model", "task", "group", "classes", "train", "valid", "test", "majority_acc", "train_acc", "valid_acc",
            "test_acc", "best_epoch", "epochs"]
    write_csv(f"{out_dir}/probing.csv", rows, cols)
    write_csv(f"{out_dir}/probing_groups.csv", groups, ["model", "group", "tasks", "test_acc"])
    plot(rows, groups, f"{out_dir}/probing.png", "probing tasks (frozen encoder, mean of the last layer)")
    summary = {"checkpoints": dict(zip(labels, args.path)), "classifier": vars(cfg), "tasks": rows, "groups": groups}
    write_json(f"{out_dir}/probing.json", summary)
    return summary


if __name__ == "__main__":
    cli_main()
