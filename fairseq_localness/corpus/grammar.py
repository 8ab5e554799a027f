"""The grammar: one sentence pair, sampled from the base grammar until it has
exactly the wanted set of phenomena, realised in both languages with its
phenomenon tags and targeted checks (:func:`generate_example`).

The grammar and the differences between the languages are described in
:mod:`fairseq_localness.corpus`; the words and probabilities are in
:mod:`fairseq_localness.corpus.lexicon`.
"""
import random
from dataclasses import dataclass, field
from typing import Dict, List

from fairseq_localness.corpus.lexicon import (
    ADJECTIVES, DERIVED_PHENOMENA, FULL_STOP, MAX_TRIES, NAMES, NOUNS, P_ADJECTIVE, P_DEFINITE, P_NAME_OTHER,
    P_NAME_SUBJECT, P_PLURAL, P_POLYSEMOUS, P_PP, P_PP_IN_REL, PHENOMENA, POLYSEMOUS_VERBS, PREPOSITIONS, SRC_DET,
    SRC_PLURAL, SRC_REL, TGT_DET, TGT_PLURAL, TGT_REL, TGT_VERB_PLURAL, VERBS,
)


@dataclass
class Example:
    """One sentence pair and what it contains."""

    src: List[str]
    tgt: List[str]
    phenomena: List[str]
    subject_number: str
    agreement_distance: int  # source words from the subject's head noun to the main verb
    checks: List[dict] = field(default_factory=list)  # see score_checks

    def tags(self, index: int) -> dict:
        return {
            "id": index,
            "phenomena": self.phenomena,
            "subject_number": self.subject_number,
            "agreement_distance": self.agreement_distance,
            "checks": self.checks,
        }



def _sample_np(rng: random.Random, p_name: float) -> dict:
    if rng.random() < p_name:
        return {"name": rng.choice(NAMES)}
    noun = rng.choice(NOUNS)
    return {
        "noun": noun,
        "plural": rng.random() < P_PLURAL,
        "definite": rng.random() < P_DEFINITE,
        "adj": rng.choice(ADJECTIVES) if rng.random() < P_ADJECTIVE else None,
    }


def _sample_verb(rng: random.Random):
    if rng.random() < P_POLYSEMOUS:
        return ("poly", rng.choice(POLYSEMOUS_VERBS))
    return ("plain", rng.choice(VERBS))


def _sample_clause(rng: random.Random, p_pp: float) -> dict:
    clause = {"verb": _sample_verb(rng), "obj": _sample_np(rng, P_NAME_OTHER)}
    if rng.random() < p_pp:
        clause["pp"] = (rng.choice(PREPOSITIONS), _sample_np(rng, P_NAME_OTHER))
    return clause


def _sample_sentence(rng: random.Random, relative: bool) -> dict:
    sent = {"subj": _sample_np(rng, P_NAME_SUBJECT)}
    if relative:
        sent["rel"] = _sample_clause(rng, P_PP_IN_REL)
    sent["main"] = _sample_clause(rng, P_PP)
    return sent


def _nps(sent: dict) -> List[dict]:
    out = [sent["subj"]]
    for key in ("rel", "main"):
        if key in sent:
            out.append(sent[key]["obj"])
            if "pp" in sent[key]:
                out.append(sent[key]["pp"][1])
    return out


def _is_plural(np: dict) -> bool:
    return "noun" in np and np["plural"]


def _is_animate(np: dict) -> bool:
    return "name" in np or np["noun"][3] == "animate"


def _phenomena(sent: dict) -> List[str]:
    nps = _nps(sent)
    found = set()
    if any(np.get("adj") for np in nps):
        found.add("reorder")
    if any("noun" in np and not np["plural"] for np in nps):
        found.add("gender")
    if any(sent[k]["verb"][0] == "poly" for k in ("rel", "main") if k in sent):
        found.add("polysemy")
    if "rel" in sent:
        found.add("long_agreement")
        rel = sent["rel"]
        nearest = rel["pp"][1] if "pp" in rel else rel["obj"]
        if _is_plural(nearest) != _is_plural(sent["subj"]):
            found.add("attractor")
    return [p for p in PHENOMENA + DERIVED_PHENOMENA if p in found]


def _src_np(np: dict) -> List[str]:
    if "name" in np:
        return [np["name"]]
    noun = np["noun"][0] + (SRC_PLURAL if np["plural"] else "")
    adj = [np["adj"][0]] if np["adj"] else []
    return [SRC_DET["def" if np["definite"] else "indef"]] + adj + [noun]


def _tgt_np(np: dict) -> List[str]:
    if "name" in np:
        return [np["name"]]
    _, tgt, gender, _ = np["noun"]
    det = TGT_DET[("def" if np["definite"] else "indef", "pl" if np["plural"] else gender)]
    noun = tgt + (TGT_PLURAL if np["plural"] else "")
    adj = [np["adj"][1]] if np["adj"] else []
    return [det, noun] + adj


def _src_clause(clause: dict) -> List[str]:
    kind, verb = clause["verb"]
    out = [verb[0]] + _src_np(clause["obj"])
    if "pp" in clause:
        out += [clause["pp"][0][0]] + _src_np(clause["pp"][1])
    return out


def _tgt_clause(clause: dict, subject_plural: bool) -> List[str]:
    kind, verb = clause["verb"]
    if kind == "poly":
        stem = verb[1] if _is_animate(clause["obj"]) else verb[2]
    else:
        stem = verb[1]
    out = [stem + (TGT_VERB_PLURAL if subject_plural else "")] + _tgt_np(clause["obj"])
    if "pp" in clause:
        out += [clause["pp"][0][1]] + _tgt_np(clause["pp"][1])
    return out


def _np_checks(np: dict) -> List[dict]:
    """Targeted checks of one NP: adjective order, determiner gender (see score_checks)."""
    if "name" in np:
        return []
    words = _tgt_np(np)
    det, noun = words[0], words[1]
    out = []
    if np["adj"]:
        adj = words[2]
        out.append({"phenomenon": "reorder", "correct": [f"{noun} {adj}"], "wrong": [f"{adj} {noun}"]})
    if not np["plural"]:
        definite = "def" if np["definite"] else "indef"
        other = TGT_DET[(definite, "f" if np["noun"][2] == "m" else "m")]
        # the determiner with the noun, whether or not the adjective was put in between
        gaps = [""] + ([words[2] + " "] if np["adj"] else [])
        out.append({"phenomenon": "gender",
                    "correct": [f"{det} {gap}{noun}" for gap in gaps],
                    "wrong": [f"{other} {gap}{noun}" for gap in gaps]})
    return out


def _clause_checks(clause: dict, subject_plural: bool, main_after_relative: bool) -> List[dict]:
    """Targeted checks of one clause: polysemous verb sense, long-distance agreement.

    Each is blind to the other: the sense check accepts either number, the agreement
    check either sense.
    """
    kind, verb = clause["verb"]
    stem = _tgt_clause(clause, subject_plural)[0]
    if subject_plural:
        stem = stem[: -len(TGT_VERB_PLURAL)]
    stems = [stem]
    out = []
    if kind == "poly":
        other = verb[2] if stem == verb[1] else verb[1]
        stems.append(other)
        out.append({"phenomenon": "polysemy", "correct": [stem, stem + TGT_VERB_PLURAL],
                    "wrong": [other, other + TGT_VERB_PLURAL]})
    if main_after_relative:
        right, wrong = (TGT_VERB_PLURAL, "") if subject_plural else ("", TGT_VERB_PLURAL)
        out.append({"phenomenon": "long_agreement", "correct": [s + right for s in stems],
                    "wrong": [s + wrong for s in stems]})
    out += _np_checks(clause["obj"])
    if "pp" in clause:
        out += _np_checks(clause["pp"][1])
    return out


def _realise(sent: dict) -> Example:
    subj = sent["subj"]
    plural = _is_plural(subj)
    src, tgt = _src_np(subj), _tgt_np(subj)
    distance = 1
    if "rel" in sent:
        rel_src = [SRC_REL] + _src_clause(sent["rel"])
        src += rel_src
        tgt += [TGT_REL] + _tgt_clause(sent["rel"], plural)
        distance += len(rel_src)
    src += _src_clause(sent["main"]) + [FULL_STOP]
    tgt += _tgt_clause(sent["main"], plural) + [FULL_STOP]
    checks = _np_checks(subj)
    if "rel" in sent:
        checks += _clause_checks(sent["rel"], plural, main_after_relative=False)
    checks += _clause_checks(sent["main"], plural, main_after_relative="rel" in sent)
    return Example(
        src=src,
        tgt=tgt,
        phenomena=_phenomena(sent),
        subject_number="pl" if plural else "sg",
        agreement_distance=distance,
        checks=checks,
    )


def generate_example(rng: random.Random, wanted: Dict[str, bool]) -> Example:
    """One sentence pair containing exactly the phenomena set to True in ``wanted``.

    Rejection sampling from the base grammar keeps the distribution of everything
    else (lexical choices, lengths) the grammar's own, conditioned on the set.
    """
    for _ in range(MAX_TRIES):
        sent = _sample_sentence(rng, relative=wanted["long_agreement"])
        found = set(_phenomena(sent))
        if all((p in found) == wanted[p] for p in PHENOMENA):
            return _realise(sent)
    raise RuntimeError(f"no sentence with phenomena {wanted} after {MAX_TRIES} tries")
