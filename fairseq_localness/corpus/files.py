"""The corpus on disk: :func:`write_corpus` streams it into its files (text,
phenomenon tags, ``corpus.json``), :func:`read_corpus` reads them back."""
import json
import os
import tempfile
from collections import Counter
from dataclasses import asdict
from typing import Dict, List, Optional

from fairseq_localness.atomic import write_text
from fairseq_localness.corpus.config import CorpusConfig
from fairseq_localness.corpus.generate import GENERATOR_VERSION, iter_corpus
from fairseq_localness.corpus.lexicon import detokenize, tokenize
from fairseq_localness.corpus.size import check_size
from fairseq_localness.corpus.stats import _StatsAccumulator



def write_corpus(out_dir: str, cfg: Optional[CorpusConfig] = None, progress: bool = False) -> Dict[str, dict]:
    """Generate and write the corpus; returns :func:`phenomenon_stats` of it.

    Files: ``{split}.{src_lang}``, ``{split}.{tgt_lang}``, ``{split}.phenomena.jsonl``
    for split in train/valid/test, and ``corpus.json`` (config, version, statistics).
    Sentences are written as they are generated, to temporary files renamed at the
    end, so an interrupted run never leaves a truncated file under a final name.
    ``progress``: a progress bar on stderr (100,000 sentences or more).
    """
    cfg = cfg or CorpusConfig()
    cfg.validate()
    check_size(cfg)
    os.makedirs(out_dir, exist_ok=True)
    names = {split: [f"{split}.{cfg.src_lang}", f"{split}.{cfg.tgt_lang}", f"{split}.phenomena.jsonl"]
             for split in ("train", "valid", "test")}
    tmp = {}
    files = {}
    stats = {split: _StatsAccumulator() for split in names}
    try:
        for split, split_names in names.items():
            for name in split_names:
                fd, tmp[name] = tempfile.mkstemp(dir=out_dir, prefix="." + name + ".")
                files[name] = os.fdopen(fd, "w", encoding="utf-8", newline="\n")
        index = Counter()
        for split, ex in iter_corpus(cfg, progress=progress):
            src, tgt, tags = (files[n] for n in names[split])
            src.write(detokenize(ex.src) + "\n")
            tgt.write(detokenize(ex.tgt) + "\n")
            tags.write(json.dumps(ex.tags(index[split]), sort_keys=True) + "\n")
            index[split] += 1
            stats[split].add(ex)
        for f in files.values():
            f.close()
        for name, path in tmp.items():
            os.chmod(path, 0o644)
            os.replace(path, os.path.join(out_dir, name))
    finally:
        for f in files.values():
            f.close()
        for path in tmp.values():
            if os.path.exists(path):
                os.unlink(path)
    result = {split: stats[split].stats() for split in ("train", "valid", "test")}
    meta = {"generator_version": GENERATOR_VERSION, "config": asdict(cfg), "stats": result}
    write_text(os.path.join(out_dir, "corpus.json"), json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return result


def read_corpus(out_dir: str, src_lang: str = "src", tgt_lang: str = "tgt") -> Dict[str, List[dict]]:
    """Read a written corpus back: split -> list of {src, tgt, phenomena, ...}."""
    splits = {}
    for split in ("train", "valid", "test"):
        paths = [os.path.join(out_dir, f"{split}.{x}") for x in (src_lang, tgt_lang, "phenomena.jsonl")]
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(f"corpus in {out_dir} lacks {', '.join(missing)}")
        with open(paths[0], encoding="utf-8") as fs, open(paths[1], encoding="utf-8") as ft, \
                open(paths[2], encoding="utf-8") as fp:
            src, tgt, tags = fs.read().splitlines(), ft.read().splitlines(), fp.read().splitlines()
        if not len(src) == len(tgt) == len(tags):
            raise ValueError(f"{split}: {len(src)} source, {len(tgt)} target, {len(tags)} tag lines")
        splits[split] = [dict(json.loads(t), src=tokenize(s), tgt=tokenize(g)) for s, g, t in zip(src, tgt, tags)]
    return splits
