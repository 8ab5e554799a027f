"""configs/papers/*.sh: every variable of a paper's configuration is labelled as the
paper's ([paper]) or ours ([*]), as docs/reproduce.md asks."""
import os

import pytest

from conftest import REPO

LABELLED = ("[paper]", "[*]")
RECIPE_CALLS = ("vaswani_recipe", "cosine_recipe", "song2019_recipe", "dc_recipe")


def config_statements(path):
    """(variable, label text) of every top-level assignment of a configuration file (a
    recipe call counts as TRAIN_ARGS): the comment lines above the group of
    statements it belongs to (statements with no blank line or comment between
    them share one), and a comment on its own line."""
    out, comments, in_block, depth = [], [], False, 0
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    for line in lines:
        if depth:  # inside a multi-line array
            depth += line.count("(") - line.count(")")
            continue
        if line.startswith("#"):
            if in_block:
                comments, in_block = [], False
            comments.append(line)
            continue
        if not line.strip():
            comments, in_block = [], False
            continue
        if line[0].isspace() or line.startswith("}"):  # a function's body (base/recipes.sh)
            continue
        name = line.split("=", 1)[0] if "=" in line.split()[0] else line.split()[0]
        if name in RECIPE_CALLS:
            name = "TRAIN_ARGS"
        if name.isupper() or name == "TRAIN_ARGS":
            trailing = line.split("#", 1)[1] if " # " in line else ""
            out.append((name, "\n".join(comments) + trailing))
            depth = line.count("(") - line.count(")")
        in_block = True
    return out


CONFIG_FILES = sorted(
    os.path.join(d, f) for d in (os.path.join(REPO, "configs", "papers"), os.path.join(REPO, "configs", "papers", "base"))
    for f in os.listdir(d) if f.endswith(".sh"))


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: os.path.relpath(p, REPO))
def test_every_config_variable_is_labelled_the_papers_or_ours(path):
    statements = config_statements(path)
    unlabelled = [name for name, text in statements if not any(label in text for label in LABELLED)]
    assert not unlabelled, f"{path}: no [paper] or [*] label above {unlabelled} (docs/reproduce.md)"


def test_the_label_check_sees_every_variable(tmp_path):
    """The parser finds each assignment, multi-line arrays and recipe calls included,
    and a variable without a label is reported."""
    path = tmp_path / "c.sh"
    path.write_text('# [paper] "quoted"\nBEAM=4\nLENPEN=0.6\n\n# [*] ours\nvaswani_recipe 1 2 3 4\n'
                    'PAIRS=(\n    "a|b"\n)\n\n# plain words\nMAX_UPDATE=1\nAVERAGE_LAST=5  # [*] why\n')
    got = config_statements(str(path))
    assert [n for n, _ in got] == ["BEAM", "LENPEN", "TRAIN_ARGS", "PAIRS", "MAX_UPDATE", "AVERAGE_LAST"]
    labelled = {n: any(label in t for label in LABELLED) for n, t in got}
    assert labelled == {"BEAM": True, "LENPEN": True, "TRAIN_ARGS": True, "PAIRS": True, "MAX_UPDATE": False,
                        "AVERAGE_LAST": True}
