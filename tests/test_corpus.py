"""The embedded corpus: deterministic, and it has the properties its docstring claims.

The translation rules are checked by re-parsing both sides of generated pairs with
a parser written here (from the lexicon tables only), not by re-running the
generator's own code.
"""
import filecmp
import json
import os
import random
from itertools import combinations

import pytest

from fairseq_localness import corpus as C

SMALL = dict(train_size=300, valid_size=30, test_size=40)


def _files(d):
    return sorted(os.listdir(d))


# --------------------------------------------------------------------------- determinism
def test_same_seed_gives_byte_identical_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    C.write_corpus(str(a), C.CorpusConfig(seed=3, **SMALL))
    C.write_corpus(str(b), C.CorpusConfig(seed=3, **SMALL))
    assert _files(a) == _files(b)
    expected = {f"{s}.{x}" for s in ("train", "valid", "test") for x in ("src", "tgt", "phenomena.jsonl")}
    assert expected | {"corpus.json"} == set(_files(a))
    match, mismatch, errors = filecmp.cmpfiles(a, b, _files(a), shallow=False)
    assert not mismatch and not errors


def test_different_seed_gives_different_corpus(tmp_path):
    C.write_corpus(str(tmp_path / "a"), C.CorpusConfig(seed=3, **SMALL))
    C.write_corpus(str(tmp_path / "b"), C.CorpusConfig(seed=4, **SMALL))
    for name in ("train.src", "train.tgt", "test.src"):
        assert (tmp_path / "a" / name).read_bytes() != (tmp_path / "b" / name).read_bytes()


def test_generation_does_not_touch_the_global_random_state():
    random.seed(123)
    before = random.random()
    random.seed(123)
    C.generate_corpus(C.CorpusConfig(seed=1, **SMALL))
    assert random.random() == before


def test_test_set_does_not_depend_on_train_size():
    a = C.generate_corpus(C.CorpusConfig(seed=5, train_size=100, valid_size=20, test_size=50))
    b = C.generate_corpus(C.CorpusConfig(seed=5, train_size=400, valid_size=20, test_size=50))
    assert [e.src for e in a["test"]] == [e.src for e in b["test"]]
    assert [e.src for e in a["valid"]] == [e.src for e in b["valid"]]


# --------------------------------------------------------------------------- shares
@pytest.fixture(scope="module")
def big():
    """The default corpus (the one `make demo` trains on)."""
    return C.generate_corpus(C.CorpusConfig())


def test_each_phenomenon_appears_in_its_stated_share(big):
    train = big["train"]
    n = len(train)
    assert n == C.CorpusConfig().train_size
    for p, share in C.DEFAULT_SHARES.items():
        observed = sum(p in e.phenomena for e in train) / n
        # 8000 Bernoulli draws: standard error <= 0.0056; allow ~5 of them
        assert abs(observed - share) < 0.03, (p, observed, share)
    for split in ("valid", "test"):
        m = len(big[split])
        for p, share in C.DEFAULT_SHARES.items():
            observed = sum(p in e.phenomena for e in big[split]) / m
            assert abs(observed - share) < 0.08, (split, p, observed, share)


def test_phenomena_are_uncorrelated(big):
    train = big["train"]
    n = len(train)
    for p, q in combinations(C.PHENOMENA, 2):
        both = sum(p in e.phenomena and q in e.phenomena for e in train) / n
        assert abs(both - C.DEFAULT_SHARES[p] * C.DEFAULT_SHARES[q]) < 0.03, (p, q, both)


def test_attractors_are_about_half_of_long_agreement(big):
    train = big["train"]
    long_ = [e for e in train if "long_agreement" in e.phenomena]
    attr = [e for e in long_ if "attractor" in e.phenomena]
    assert all("long_agreement" in e.phenomena for e in train if "attractor" in e.phenomena)
    assert 0.35 < len(attr) / len(long_) < 0.65


def test_custom_shares_are_respected():
    shares = {"reorder": 1.0, "gender": 0.0, "polysemy": 1.0, "long_agreement": 0.0}
    splits = C.generate_corpus(C.CorpusConfig(seed=2, shares=shares, **SMALL))
    for e in splits["train"]:
        assert set(e.phenomena) == {"reorder", "polysemy"}


def test_stats_report_the_shares(big):
    stats = C.phenomenon_stats(big)
    assert set(stats) == {"train", "valid", "test"}
    assert stats["train"]["sentences"] == len(big["train"])
    share = sum("polysemy" in e.phenomena for e in big["train"]) / len(big["train"])
    assert stats["train"]["shares"]["polysemy"] == pytest.approx(share)
    assert 6 < stats["train"]["mean_src_len"] < 14
    table = C.format_stats(stats)
    assert table.splitlines()[0].startswith("| split | sentences | reorder | gender | polysemy | long_agreement")


# --------------------------------------------------------------------------- splits
def test_no_sentence_is_shared_between_splits(big):
    seen = {}
    for split, examples in big.items():
        srcs = [" ".join(e.src) for e in examples]
        assert len(set(srcs)) == len(srcs), f"duplicates within {split}"
        seen[split] = set(srcs)
    assert not seen["test"] & seen["train"]
    assert not seen["test"] & seen["valid"]
    assert not seen["valid"] & seen["train"]


def test_not_a_copy_task(big):
    names = set(C.NAMES) | {C.FULL_STOP}
    src_words = {w for e in big["train"] for w in e.src}
    tgt_words = {w for e in big["train"] for w in e.tgt}
    assert src_words & tgt_words <= names  # only names and the full stop are shared
    same_position = sum(s == t for e in big["train"] for s, t in zip(e.src, e.tgt))
    total = sum(len(e.tgt) for e in big["train"])
    assert same_position / total < 0.25


def test_word_forms_are_unambiguous():
    """Every surface form belongs to one category (so the parser below is exact)."""
    src = [n[0] for n in C.NOUNS] + [n[0] + C.SRC_PLURAL for n in C.NOUNS] + [a[0] for a in C.ADJECTIVES]
    src += [v[0] for v in C.VERBS] + [v[0] for v in C.POLYSEMOUS_VERBS] + list(C.SRC_DET.values())
    src += [p[0] for p in C.PREPOSITIONS] + [C.SRC_REL] + C.NAMES
    assert len(src) == len(set(src))
    stems = [v[1] for v in C.VERBS] + [s for v in C.POLYSEMOUS_VERBS for s in v[1:]]
    tgt = [n[1] for n in C.NOUNS] + [n[1] + C.TGT_PLURAL for n in C.NOUNS] + [a[1] for a in C.ADJECTIVES]
    tgt += stems + [s + C.TGT_VERB_PLURAL for s in stems] + list(C.TGT_DET.values())
    tgt += [p[1] for p in C.PREPOSITIONS] + [C.TGT_REL] + C.NAMES
    assert len(tgt) == len(set(tgt))
    genders = {g for _, _, g, _ in C.NOUNS}
    assert genders == {"m", "f"}
    # gender is not readable off the target noun's last letter
    for ending in {t[-1] for _, t, _, _ in C.NOUNS}:
        assert len({g for _, t, g, _ in C.NOUNS if t.endswith(ending)}) == 2 or \
            sum(t.endswith(ending) for _, t, _, _ in C.NOUNS) == 1


# --------------------------------------------------------------------------- the rules, re-parsed
SRC_NOUN = {s: (t, g, c) for s, t, g, c in C.NOUNS}
SRC_ADJ = dict(C.ADJECTIVES)
SRC_VERB = dict(C.VERBS)
SRC_POLY = {s: (a, t) for s, a, t in C.POLYSEMOUS_VERBS}
SRC_PREP = dict(C.PREPOSITIONS)
DETS = {"ta": "def", "en": "indef"}
TGT_DET_FORMS = {"def": {"m": "lo", "f": "la", "pl": "lei"}, "indef": {"m": "un", "f": "ume", "pl": "dei"}}


def parse_src_np(tokens, i):
    """-> (np dict, next index). NP = NAME | DET [ADJ] NOUN[ek]."""
    if tokens[i] in C.NAMES:
        return {"name": tokens[i], "plural": False, "animate": True}, i + 1
    det = DETS[tokens[i]]
    i += 1
    adj = None
    if tokens[i] in SRC_ADJ:
        adj, i = tokens[i], i + 1
    word = tokens[i]
    plural = word.endswith("ek") and word[:-2] in SRC_NOUN
    noun = word[:-2] if plural else word
    assert noun in SRC_NOUN, f"expected a noun at {i} in {tokens}"
    return {"det": det, "adj": adj, "noun": noun, "plural": plural,
            "animate": SRC_NOUN[noun][2] == "animate"}, i + 1


def parse_src(tokens):
    """Sentence -> (subject, relative clause or None, main clause, index of the main
    verb); a clause is (verb, object, (prep, np) or None)."""
    subj, i = parse_src_np(tokens, 0)

    def clause(i):
        verb = tokens[i]
        assert verb in SRC_VERB or verb in SRC_POLY, f"expected a verb at {i} in {tokens}"
        obj, i = parse_src_np(tokens, i + 1)
        pp = None
        if tokens[i] in SRC_PREP:
            np_, j = parse_src_np(tokens, i + 1)
            pp, i = (tokens[i], np_), j
        return (verb, obj, pp), i

    rel = None
    if tokens[i] == "ke":
        rel, i = clause(i + 1)
    main_verb_at = i
    main, i = clause(i)
    assert tokens[i:] == ["."], tokens
    return subj, rel, main, main_verb_at


def expected_tgt_np(np_):
    """The target words the rules demand for a source NP."""
    if "name" in np_:
        return [np_["name"]]
    tgt, gender, _ = SRC_NOUN[np_["noun"]]
    det = TGT_DET_FORMS[np_["det"]]["pl" if np_["plural"] else gender]  # agreement
    noun = tgt + ("ri" if np_["plural"] else "")
    adj = [SRC_ADJ[np_["adj"]]] if np_["adj"] else []
    return [det, noun] + adj  # adjective after the noun


def expected_verb(verb, obj, subject_plural):
    if verb in SRC_POLY:
        stem = SRC_POLY[verb][0] if obj["animate"] else SRC_POLY[verb][1]  # chosen by the object
    else:
        stem = SRC_VERB[verb]
    return stem + ("n" if subject_plural else "")  # agrees with the subject


def test_translation_rules_hold_on_generated_pairs(big):
    counts = {"reorder": 0, "gender": 0, "polysemy": 0, "long_agreement": 0}
    for ex in big["train"][:3000] + big["test"]:
        subj, rel, main, main_verb_at = parse_src(ex.src)
        pl = subj["plural"]
        tgt = list(expected_tgt_np(subj))
        if rel:
            tgt += ["ko", expected_verb(rel[0], rel[1], pl)] + expected_tgt_np(rel[1])
            if rel[2]:
                tgt += [SRC_PREP[rel[2][0]]] + expected_tgt_np(rel[2][1])
        tgt += [expected_verb(main[0], main[1], pl)] + expected_tgt_np(main[1])
        if main[2]:
            tgt += [SRC_PREP[main[2][0]]] + expected_tgt_np(main[2][1])
        tgt += ["."]
        assert ex.tgt == tgt, (ex.src, ex.tgt, tgt)

        # the tags say what the parse finds
        nps = [subj, main[1]] + ([main[2][1]] if main[2] else [])
        if rel:
            nps += [rel[1]] + ([rel[2][1]] if rel[2] else [])
        verbs = [main[0]] + ([rel[0]] if rel else [])
        found = {
            "reorder": any(n.get("adj") for n in nps),
            "gender": any("noun" in n and not n["plural"] for n in nps),
            "polysemy": any(v in SRC_POLY for v in verbs),
            "long_agreement": rel is not None,
        }
        if rel:
            nearest = rel[2][1] if rel[2] else rel[1]
            found["attractor"] = nearest["plural"] != pl
        assert sorted(p for p, v in found.items() if v) == sorted(ex.phenomena), ex.src
        for p in counts:
            counts[p] += found[p]
        # distance from the subject's head noun to the main verb, in source words
        head = 0 if "name" in subj else (2 if subj["adj"] else 1)
        assert ex.agreement_distance == main_verb_at - head
    assert all(c > 100 for c in counts.values()), counts


def test_long_agreement_spans_several_words(big):
    d = [e.agreement_distance for e in big["train"] if "long_agreement" in e.phenomena]
    assert min(d) >= 3 and max(d) >= 8
    assert all(e.agreement_distance == 1 for e in big["train"] if "long_agreement" not in e.phenomena)


def test_polysemous_verbs_get_both_senses(big):
    form_to_sense = {}
    for verb, animate, thing in C.POLYSEMOUS_VERBS:
        for sense in (animate, thing):
            form_to_sense[sense] = form_to_sense[sense + "n"] = (verb, sense)
    seen = {verb: set() for verb in SRC_POLY}
    for e in big["train"]:
        for w in e.tgt:
            if w in form_to_sense:
                verb, sense = form_to_sense[w]
                seen[verb].add(sense)
    for verb, senses in seen.items():
        assert senses == set(SRC_POLY[verb]), (verb, senses)


# --------------------------------------------------------------------------- files and CLI
def test_files_round_trip_and_tags_align(tmp_path):
    cfg = C.CorpusConfig(seed=9, src_lang="xx", tgt_lang="yy", **SMALL)
    C.write_corpus(str(tmp_path), cfg)
    assert (tmp_path / "train.xx").exists() and (tmp_path / "train.yy").exists()
    first = (tmp_path / "test.xx").read_text().splitlines()[0]
    assert first.endswith(".") and not first.endswith(" .")  # written as ordinary text
    back = C.read_corpus(str(tmp_path), "xx", "yy")
    direct = C.generate_corpus(cfg)
    for split in ("train", "valid", "test"):
        assert [r["src"] for r in back[split]] == [e.src for e in direct[split]]
        assert [r["tgt"] for r in back[split]] == [e.tgt for e in direct[split]]
        assert [r["phenomena"] for r in back[split]] == [e.phenomena for e in direct[split]]
        assert [r["id"] for r in back[split]] == list(range(len(direct[split])))
    meta = json.loads((tmp_path / "corpus.json").read_text())
    assert meta["config"]["seed"] == 9 and meta["generator_version"] == C.GENERATOR_VERSION
    assert C.phenomenon_stats(back)["test"]["shares"] == meta["stats"]["test"]["shares"]


def test_cli_writes_and_prints_stats(tmp_path, capsys):
    out = tmp_path / "c"
    assert C.cli_main(["--out", str(out), "--train-size", "50", "--valid-size", "5",
                       "--test-size", "5", "--src", "aa", "--tgt", "bb"]) == 0
    printed = capsys.readouterr().out
    assert "| train | 50 |" in printed
    assert (out / "valid.aa").read_text().count("\n") == 5
    assert C.cli_main(["--out", str(out), "--stats", "--src", "aa", "--tgt", "bb"]) == 0
    assert "| test | 5 |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--src", "x-y"], "src_lang must be letters"),
    (["--src", "aa", "--tgt", "aa"], "must differ"),
    (["--train-size", "0"], "train_size must be >= 1"),
    (["--share-polysemy", "1.5"], "share of polysemy must be in [0, 1]"),
    (["--stats"], "lacks"),
])
def test_cli_rejects_bad_options(tmp_path, capsys, argv, message):
    out = tmp_path / "c"
    assert C.cli_main(["--out", str(out)] + argv) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


# --------------------------------------------------------------------------- targeted checks
def _apply_wrong(example, phenomenon):
    """The reference with every check of one phenomenon answered wrongly."""
    words = " " + " ".join(example.tgt) + " "
    for check in example.checks:
        if check["phenomenon"] == phenomenon:
            for good, bad in zip(check["correct"], check["wrong"]):
                if f" {good} " in words:
                    words = words.replace(f" {good} ", f" {bad} ", 1)
                    break
    return C.detokenize(words.split())


def test_checks_cover_each_phenomenon(big):
    for e in big["test"]:
        kinds = {c["phenomenon"] for c in e.checks}
        assert kinds == set(e.phenomena) - {"attractor"}, (e.tgt, e.checks)
        assert sum(c["phenomenon"] == "long_agreement" for c in e.checks) == ("long_agreement" in e.phenomena)


def test_score_checks_isolates_each_phenomenon(big):
    test = big["test"]
    refs = [C.detokenize(e.tgt) for e in test]
    tags = [e.tags(i) for i, e in enumerate(test)]
    perfect = C.score_checks(refs, refs, tags)
    assert all(v["accuracy"] == 1.0 and v["checks"] > 50 for v in perfect.values()), perfect
    for p in C.PHENOMENA:
        scores = C.score_checks([_apply_wrong(e, p) for e in test], refs, tags)
        for q in C.PHENOMENA + C.DERIVED_PHENOMENA:
            acc = scores[q]["accuracy"]
            if q == p or (p == "long_agreement" and q == "attractor"):
                # polysemy: a verb used twice with both senses cannot be told apart by counts
                assert acc < 0.05, (p, q, acc)
            else:
                assert acc == 1.0, (p, q, acc)


def test_score_cli(tmp_path, capsys):
    out = tmp_path / "c"
    C.write_corpus(str(out), C.CorpusConfig(seed=2, **SMALL))
    hyp = tmp_path / "hyp"
    hyp.write_text((out / "test.tgt").read_text())
    assert C.cli_main(["--out", str(out), "--score", str(hyp)]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert all(v["accuracy"] in (1.0, None) for v in scores.values())
    hyp.write_text("x.\n")
    assert C.cli_main(["--out", str(out), "--score", str(hyp)]) == 2
    assert "1 hypotheses, 40 references" in capsys.readouterr().err
