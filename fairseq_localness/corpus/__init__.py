"""The embedded default corpus: a synthetic translation task that needs local context.

``fairseq-localness-corpus --out DIR`` writes a parallel corpus ``train``/``valid``/
``test`` (``DIR/train.src``, ``DIR/train.tgt``, ...; DIR defaults to ``data/corpus``) generated from a small grammar
with a fixed seed (pure Python ``random.Random(seed)``: the same seed gives
byte-identical files on every machine). Both languages use invented words; nothing
in it comes from real text. It is the testbed on which ``make demo`` compares the
attention variants, so it mixes phenomena that reward attending to neighbours with
one that needs a long-distance dependency, each in a known share of sentences.

Grammar (source side; ``[...]`` optional, ``|`` alternatives)::

    S    -> NP_subj [REL] V NP [PP] "."
    REL  -> "ke" V NP [PP]                  (relative clause on the subject)
    PP   -> P NP
    NP   -> NAME | DET [ADJ] N | DET [ADJ] N-ek   (-ek: plural suffix)
    DET  -> "ta" (definite) | "en" (indefinite)

The target language has the same constituent order with these differences:

``reorder`` (local reordering)
    Adjectives precede the noun in the source and follow it in the target:
    ``ta somal dovan`` -> ``lo kelo ivre``.
``gender`` (local agreement)
    Target nouns have a lexical gender (masculine/feminine, not predictable from
    the word's form) and singular determiners agree with it: definite ``lo``/``la``,
    indefinite ``un``/``ume``; plural determiners (``lei``, ``dei``) do not show
    gender. The source determiner shows no gender, so the model must look at the
    noun one or two words to the right.
``polysemy`` (word choice decided by the neighbourhood)
    Four source verbs have two translations each, chosen by the class of their
    object (a person or animal vs. a thing), whose head noun is 1-3 words away:
    ``zemu ta dovan`` -> ``kaba lo kelo`` ("lead") but ``zemu ta bakor`` ->
    ``toli la pimo`` ("carry").
``long_agreement`` (long-distance dependency)
    Target verbs agree in number with their subject (plural ``-n``); source verbs
    do not inflect, so the model has to find the subject. When the subject carries
    a relative clause, 3-9 source words separate the subject noun from the main
    verb. ``attractor`` marks the subset where the noun nearest to the main verb
    has the other number (a "nearest noun" heuristic gets these wrong).

Shares. Each sentence first draws, independently, whether it contains each phenomenon
(``reorder`` 0.5, ``gender`` 0.5, ``polysemy`` 0.4, ``long_agreement`` 0.4), and the
grammar is then sampled until the sentence has exactly that set. So the phenomena are
uncorrelated, every subset of test sentences has a clean contrast group, and the
share of each is its stated probability up to sampling noise; ``attractor`` comes
out at about half of ``long_agreement``. Names are copied unchanged (a small copy
component); every other word is translated through the lexicon below, so the task
is not a copy task.

Splits. Sentences are unique across all three splits (no source sentence of the test
set occurs in train or valid). The test set is drawn first, so it does not change
when ``--train-size`` changes.

Size. The grammar makes a finite number of distinct source sentences with each set
of phenomena (:func:`distinct_sentences`), drawn with very unequal probabilities, so
repeats (drawn again) grow with the corpus. Before anything is generated,
:func:`check_size` computes the expected number of draws from the grammar's
probabilities and refuses a corpus that needs more sentences of some set than there
are, or more than :data:`MAX_DRAWS_PER_SENTENCE` draws per sentence
(:func:`max_corpus_size`: 32,000,000 sentences in all at the default shares). The
corpus is written as it is generated (only the source sentences are kept, to keep
them unique: ~150 bytes each), with a progress bar on stderr from 100,000 sentences
on.

Phenomenon tags. Every split gets ``<split>.phenomena.jsonl``: one JSON object per
line (same line order as the text files) with the phenomena the sentence contains,
its subject number, the source distance from subject noun to main verb, and the
targeted ``checks`` of the sentence (the target words each phenomenon decides, and
the wrong words a model missing it would write). :func:`score_checks` (``--score
HYP``) turns them into an accuracy per phenomenon for any system's translations;
:func:`phenomenon_stats` summarises a corpus (shares per split, lengths, vocabulary
sizes), ``--stats`` prints it.

Modules, one concern each: :mod:`~fairseq_localness.corpus.lexicon` (the phenomena,
the words of both languages, the base grammar's probabilities, the written form of
a sentence), :mod:`~fairseq_localness.corpus.config` (:class:`CorpusConfig`),
:mod:`~fairseq_localness.corpus.grammar` (one sentence pair with its tags and
checks), :mod:`~fairseq_localness.corpus.size` (the size arithmetic),
:mod:`~fairseq_localness.corpus.generate` (the three splits as drawn),
:mod:`~fairseq_localness.corpus.stats` (statistics and targeted scores),
:mod:`~fairseq_localness.corpus.files` (writing and reading the files) and
:mod:`~fairseq_localness.corpus.cli` (``fairseq-localness-corpus``). The names
below are the package's interface: ``from fairseq_localness.corpus import ...``.
"""
from fairseq_localness.corpus.cli import DEFAULT_OUT, cli_main, get_parser
from fairseq_localness.corpus.config import CorpusConfig
from fairseq_localness.corpus.files import read_corpus, write_corpus
from fairseq_localness.corpus.generate import GENERATOR_VERSION, generate_corpus, iter_corpus
from fairseq_localness.corpus.grammar import Example, generate_example
from fairseq_localness.corpus.lexicon import (
    ADJECTIVES, DEFAULT_SHARES, DERIVED_PHENOMENA, FULL_STOP, NAMES, NOUNS, PHENOMENA, POLYSEMOUS_VERBS, PREPOSITIONS,
    SRC_DET, SRC_PLURAL, SRC_REL, TGT_DET, TGT_PLURAL, TGT_REL, TGT_VERB_PLURAL, VERBS, detokenize, tokenize,
)
from fairseq_localness.corpus.size import (
    MAX_DRAWS_PER_SENTENCE, check_size, distinct_sentences, draws_per_sentence, max_corpus_size,
)
from fairseq_localness.corpus.stats import format_stats, phenomenon_stats, score_checks

__all__ = [
    "ADJECTIVES", "DEFAULT_OUT", "DEFAULT_SHARES", "DERIVED_PHENOMENA", "FULL_STOP", "GENERATOR_VERSION",
    "MAX_DRAWS_PER_SENTENCE", "NAMES", "NOUNS", "PHENOMENA", "POLYSEMOUS_VERBS", "PREPOSITIONS", "SRC_DET",
    "SRC_PLURAL", "SRC_REL", "TGT_DET", "TGT_PLURAL", "TGT_REL", "TGT_VERB_PLURAL", "VERBS",
    "CorpusConfig", "Example", "check_size", "cli_main", "detokenize", "distinct_sentences",
    "draws_per_sentence", "format_stats", "generate_corpus", "generate_example", "get_parser",
    "iter_corpus", "max_corpus_size", "phenomenon_stats", "read_corpus", "score_checks", "tokenize",
    "write_corpus",
]
