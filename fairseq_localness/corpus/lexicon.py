"""The two invented languages of the corpus: the phenomena, the words, the base
grammar's probabilities and the written form of a sentence.

Every word of both languages is listed here (:mod:`fairseq_localness.corpus`
describes the grammar that combines them and the phenomena that each difference
between the languages makes); the analyses read the word lists to tag parts of
speech (:mod:`fairseq_localness.analysis.pos_tags`) and to build probing tasks
(:mod:`fairseq_localness.analysis.corpus_probes`).
"""
from typing import List

PHENOMENA = ("reorder", "gender", "polysemy", "long_agreement")
"""The phenomena whose share is controlled (in this order in the tags)."""

DERIVED_PHENOMENA = ("attractor",)
"""Tags that are observed, not controlled: a subset of ``long_agreement``."""

DEFAULT_SHARES = {"reorder": 0.5, "gender": 0.5, "polysemy": 0.4, "long_agreement": 0.4}

# --------------------------------------------------------------------------- lexicon
# Nouns: (source, target, target gender, class). Class decides polysemous verbs.
NOUNS = [
    ("dovan", "kelo", "m", "animate"),
    ("miren", "sabu", "f", "animate"),
    ("tolki", "runa", "m", "animate"),
    ("fasin", "velo", "f", "animate"),
    ("gorim", "dazi", "f", "animate"),
    ("pelun", "mire", "m", "animate"),
    ("sarik", "tonu", "m", "animate"),
    ("wuden", "lisa", "f", "animate"),
    ("habro", "quena", "m", "animate"),
    ("nilse", "jorvo", "f", "animate"),
    ("bakor", "pimo", "f", "thing"),
    ("tesin", "kara", "m", "thing"),
    ("lumet", "soru", "f", "thing"),
    ("harun", "neve", "f", "thing"),
    ("kolip", "duro", "m", "thing"),
    ("vemas", "zina", "f", "thing"),
    ("ridol", "faru", "m", "thing"),
    ("nusek", "bela", "m", "thing"),
    ("pavot", "gumo", "f", "thing"),
    ("sileb", "tera", "m", "thing"),
    ("jomar", "hubi", "m", "thing"),
    ("ketul", "rina", "f", "thing"),
]
SRC_PLURAL = "ek"  # source noun + "ek"
TGT_PLURAL = "ri"  # target noun + "ri"

# Names: singular, animate, no determiner, copied unchanged.
NAMES = ["Kalu", "Menta", "Oriv", "Sunik", "Tabo", "Ezri"]

ADJECTIVES = [
    ("somal", "ivre"), ("kedru", "ospa"), ("lanik", "urme"), ("pirot", "eska"),
    ("vusel", "alno"), ("marek", "odri"), ("tulop", "ingo"), ("finar", "ebla"),
    ("gosti", "umpe"), ("zurin", "anve"), ("hemor", "ipsa"), ("debal", "olme"),
]

# Transitive verbs: source (invariable) -> target stem (+ "n" with a plural subject).
VERBS = [
    ("lupi", "fenda"), ("rasu", "borki"), ("mesko", "talvi"), ("vinta", "grusa"),
    ("pokel", "dremi"), ("suvar", "klema"), ("tiben", "plosa"), ("garvu", "snedi"),
    ("hovik", "trapa"), ("zelma", "bruni"),
]
# Polysemous verbs: source -> (target with an animate object, with a thing object).
POLYSEMOUS_VERBS = [
    ("zemu", "kaba", "toli"),
    ("ravo", "sipra", "delko"),
    ("nuki", "framo", "vesti"),
    ("pelsa", "gordu", "liska"),
]
TGT_VERB_PLURAL = "n"

# Determiners: source definiteness -> target form by (gender or plural).
SRC_DET = {"def": "ta", "indef": "en"}
TGT_DET = {
    ("def", "m"): "lo", ("def", "f"): "la", ("def", "pl"): "lei",
    ("indef", "m"): "un", ("indef", "f"): "ume", ("indef", "pl"): "dei",
}
PREPOSITIONS = [("nu", "sen"), ("po", "kon"), ("dar", "pur"), ("vel", "sul")]
SRC_REL, TGT_REL = "ke", "ko"
FULL_STOP = "."

# Probabilities of the base grammar (before the phenomenon constraints are applied).
P_NAME_SUBJECT = 0.25
P_NAME_OTHER = 0.15
P_PLURAL = 0.45
P_ADJECTIVE = 0.35
P_DEFINITE = 0.6
P_PP = 0.35
P_PP_IN_REL = 0.35
P_POLYSEMOUS = 0.35
MAX_TRIES = 10000


# --------------------------------------------------------------------------- written form
def detokenize(tokens: List[str]) -> str:
    """The written form of a sentence: words separated by spaces, the full stop
    attached to the last word (like ordinary text, so the pipeline's tokenizer and
    detokenizer have work to do and sacrebleu sees detokenized text)."""
    if tokens and tokens[-1] == FULL_STOP:
        return " ".join(tokens[:-1]) + FULL_STOP
    return " ".join(tokens)


def tokenize(line: str) -> List[str]:
    """Inverse of :func:`detokenize` on this corpus's sentences."""
    line = line.strip()
    if line.endswith(FULL_STOP):
        return line[: -len(FULL_STOP)].split() + [FULL_STOP]
    return line.split()
