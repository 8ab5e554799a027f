"""README.md: its own-data block runs as it is written; its sections; the docs index.

The block between ``<!-- own-data:begin -->`` and ``<!-- own-data:end -->`` is taken
from the README and run by bash, unchanged, in a directory that holds what the README
tells the user to provide: ``raw/{train,valid,test}.{de,en}`` (a tiny corpus from the
generator) and the repository's ``scripts/`` (linked). The one thing the test sets is
``UPDATES`` (the block reads ``${UPDATES:-3000}``): 6 updates of the tiny preset, three
epochs of 60 training pairs (epoch checkpoints for the average of the last 3), so the
block's steps, for two systems, run in about a minute and a half on 2 cores.
Every later line of the block depends on the earlier ones' outputs, so a script whose
options or outputs change under the README fails here.
"""
import json
import os
import re

import pytest

from conftest import REPO, run_command, tool_env

README = os.path.join(REPO, "README.md")
DOCS = os.path.join(REPO, "docs")

SECTIONS = ["Quick start", "Your own data", "Models", "Reproducing the papers", "Analysis", "Benchmark",
            "Tests", "Layout", "Security"]


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def own_data_block() -> str:
    m = re.search(r"<!-- own-data:begin -->\n```bash\n(.*?)```\n<!-- own-data:end -->", read(README), re.S)
    assert m, "README.md: no ```bash block between <!-- own-data:begin --> and <!-- own-data:end -->"
    return m.group(1)


def printed_commands(stderr):
    return [line[2:] for line in stderr.splitlines() if line.startswith("+ ")]


@pytest.mark.timeout(900)
def test_the_own_data_block_runs_as_written(tmp_path):
    from fairseq_localness.corpus import CorpusConfig, write_corpus

    block = own_data_block()
    assert "UPDATES=${UPDATES:-" in block  # the only value the test sets
    for step in ("prepare_bpe.sh", "preprocess.sh", "train.sh --preset tiny", "average.sh", "evaluate.sh",
                 "significance.sh"):
        assert f"scripts/{step}" in block, step
    write_corpus(str(tmp_path / "raw"), CorpusConfig(seed=3, train_size=60, valid_size=12, test_size=24,
                                                     src_lang="de", tgt_lang="en"))
    os.symlink(os.path.join(REPO, "scripts"), tmp_path / "scripts")
    cmd = ["bash", "-euo", "pipefail", "-c", block]
    p = run_command(cmd, cwd=str(tmp_path), env=tool_env({"UPDATES": "6"}), timeout=840)
    assert p.returncode == 0, f"the README's own-data block failed:\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"

    out = tmp_path / "runs" / "mydata"
    commands = printed_commands(p.stderr)
    train = [c for c in commands if c.startswith("fairseq-train ")]
    assert len(train) == 2
    for c, arch in zip(train, ("transformer", "hybrid_transformer")):
        assert f"--arch {arch} " in c and "--max-update 6 " in c
        assert "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 64" in c  # the tiny preset
    for arch in ("transformer", "hybrid_transformer"):
        assert (out / arch / "checkpoint_avg_last3.pt").is_file()
        assert (out / arch / "eval" / "bleu.json").is_file()
    bleu_lines = [line for line in p.stdout.splitlines() if line.startswith("BLEU = ")]
    assert len(bleu_lines) == 2 and all("(sacrebleu nrefs:1|case:mixed" in line for line in bleu_lines)
    report = json.loads((out / "significance" / "significance.json").read_text())
    assert sorted(report["systems"]) == ["hybrid", "transformer"]
    for name, arch in (("transformer", "transformer"), ("hybrid", "hybrid_transformer")):
        assert report["systems"][name]["file"].endswith(f"{arch}/eval/hyp.detok")
        assert 0 <= report["systems"][name]["bleu"] <= 100
        assert 0 <= json.loads((out / arch / "eval" / "bleu.json").read_text())["score"] <= 100
    assert len(report["comparisons"]) == 1
    # the log shows the commands a user would run, not the scripts' file bookkeeping
    bookkeeping = [c for c in commands if re.match(r"(mv|rm|cp) ", c)]
    assert bookkeeping == [], bookkeeping


def test_the_readme_is_short_and_in_order():
    text = read(README)
    assert len(text.splitlines()) <= 250
    sections = re.findall(r"^## (.+)$", text, re.M)
    assert [s for s in sections if s in SECTIONS] == SECTIONS, sections
    # the models table names every registered architecture family, each with its page
    for model in ("localness_transformer", "hybrid_transformer", "hysan_transformer", "dc_transformer"):
        assert f"(docs/{model}.md)" in text, model
    # the reproduce table names every driver
    drivers = sorted(f for f in os.listdir(os.path.join(REPO, "scripts", "reproduce"))
                     if re.fullmatch(r"\w+_table\d+\.sh", f))  # not the sourced helpers
    assert len(drivers) == 8, drivers
    for driver in drivers:
        assert f"scripts/reproduce/{driver}" in text, driver


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    text = re.sub(r"```.*?```", "", read(path), flags=re.S)
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("page", ["README.md", "docs/README.md"])
def test_every_link_of_the_front_pages_resolves(page):
    path = os.path.join(REPO, page)
    text = re.sub(r"```.*?```", "", read(path), flags=re.S)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        target, _, anchor = link.partition("#")
        target = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
        assert os.path.exists(target), f"{page}: {link}: no such file"
        if anchor:
            assert anchor in anchors(target), f"{page}: {link}: no such heading"


def test_the_docs_index_lists_every_doc():
    index = read(os.path.join(DOCS, "README.md"))
    listed = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    docs = {f for f in os.listdir(DOCS) if f.endswith(".md") and f != "README.md"}
    assert docs - listed == set(), f"docs/README.md does not list {sorted(docs - listed)}"
