"""Analysis tools: the papers' figures and probing tasks from any trained checkpoint.

Each tool is a module with a command line (``python -m fairseq_localness.analysis.<tool>``
or ``fairseq-localness-analysis <tool>``) that writes its numbers as CSV/JSON and a
PNG plot into ``--output-dir``; ``docs/analysis.md`` lists them with the figure each
reproduces.

==================  =============================================================
tool                reproduces
==================  =============================================================
``gates``           Xu et al. 2019 Fig. 3 (mean gate per layer) and Fig. 4 (per
                    POS tag); HySAN's squeeze gates per branch
``window_sweep``    Xu et al. 2019 Fig. 2 (BLEU and gate per window size)
``windows``         Yang et al. 2018 Fig. 3 (centres and windows per layer) and
                    Fig. 2 (windows per head)
``heatmaps``        Song et al. 2019 Fig. 5 (per-branch attention maps)
``learning_curves`` Song et al. 2019 Fig. 4 (BLEU and loss during training)
``divergence``      DC paper Fig. 4 (JS divergence between the FI units per layer)
``bleu_breakdown``  DC paper Fig. 5 (BLEU by source length) and Yang et al. 2018
                    Fig. 4 (BLEU gain by n-gram order)
``efficiency``      the papers' "Param." and "Speed" columns
``probing``         Xu et al. 2019 Tables 3-4, DC paper Table 4 (SentEval probing)
``pos_tags``        helper: Universal POS tags for the embedded corpus
``corpus_probes``   helper: SentEval-format probing tasks from the embedded corpus
==================  =============================================================
"""

TOOLS = (
    "gates",
    "window_sweep",
    "windows",
    "heatmaps",
    "learning_curves",
    "divergence",
    "bleu_breakdown",
    "efficiency",
    "probing",
    "pos_tags",
    "corpus_probes",
)
