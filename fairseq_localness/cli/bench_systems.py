"""The benchmark's systems (``fairseq-localness-bench``): the one table of what
``make bench`` runs, read by the benchmark (:mod:`fairseq_localness.cli.benchmark` and its
``bench_*`` modules) and nothing else.
Models do not know about the benchmark.

Each system is an architecture family of this package (or fairseq's ``transformer``)
plus options; the benchmark builds ``<model>_<size>`` (e.g.
``hybrid_transformer_iwslt_de_en``). Per model: the default and the main variants of
its paper; for the hybrid model also the gate in the decoder, where beam search pays
for both branches at every step, and the other rows of Xu et al. 2019, Table 1.
"""
from typing import Dict, List, Tuple

BASELINE = "transformer"

# name -> (model, extra options), in the order of the benchmark's table
SYSTEMS: Dict[str, Tuple[str, List[str]]] = {
    "transformer": ("transformer", []),
    "localness (query, enc 1-3)": ("localness_transformer", []),
    "localness (fixed)": ("localness_transformer", ["--localness-window", "fixed"]),
    "localness (layer)": ("localness_transformer", ["--localness-window", "layer"]),
    "localness (head)": ("localness_transformer", ["--localness-window", "head"]),
    "localness + rel_pos": ("localness_transformer", ["--localness-rel-pos"]),
    "hybrid (gate, enc 1-2)": ("hybrid_transformer", []),
    "hybrid (gate, enc 1-2 + dec 1-2)": ("hybrid_transformer", ["--hybrid-decoder-layers", "1-2"]),
    "hybrid (concat)": ("hybrid_transformer", ["--hybrid-variant", "concat"]),
    "hybrid (local_pattern)": ("hybrid_transformer", ["--hybrid-variant", "local_pattern"]),
    "hybrid (neighbor)": ("hybrid_transformer", ["--hybrid-variant", "neighbor"]),
    "hybrid (local_h)": ("hybrid_transformer", ["--hybrid-variant", "local_h"]),
    "hybrid (local_s)": ("hybrid_transformer", ["--hybrid-variant", "local_s"]),
    "hysan e1 (gated)": ("hysan_transformer", []),
    "hysan e1 (sum)": ("hysan_transformer", ["--hysan-fusion", "sum"]),
    "hysan e1 (concat)": ("hysan_transformer", ["--hysan-fusion", "concat"]),
    "enc-dc (f=2)": ("dc_transformer", ["--dc-mode", "enc"]),
    "dec-dc (f=2)": ("dc_transformer", ["--dc-mode", "dec"]),
    "full-dc (f=2)": ("dc_transformer", ["--dc-mode", "full"]),
}


def select(names: List[str]) -> List[str]:
    """The systems named in ``names`` (system names or model names, e.g.
    ``hysan_transformer`` for all its systems), in table order; all for an empty list.
    Raises ``ValueError`` naming the unknown ones."""
    models = {model for model, _ in SYSTEMS.values()}
    unknown = [n for n in names if n not in SYSTEMS and n not in models]
    if unknown:
        raise ValueError(f"unknown system(s) {unknown}; known: {list(SYSTEMS)} or a model name: {sorted(models)}")
    return [n for n in SYSTEMS if not names or n in names or SYSTEMS[n][0] in names]
