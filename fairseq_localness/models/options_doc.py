"""The option tables of ``docs/<model>.md``, generated from the option declarations
of each model (:func:`~fairseq_localness.models._locality.option`), so that the docs
say what ``--help`` says and what the code checks.

Each table sits between two marker comments in its doc::

    <!-- options:begin localness_transformer ... -->
    | option | default | what it does | applies to |
    ...
    <!-- options:end -->

and is rewritten, or checked, by::

    python -m fairseq_localness.models.options_doc           # rewrite the tables
    python -m fairseq_localness.models.options_doc --check   # exit 1 if one differs

(``tests/test_options_doc.py`` runs the check.)
"""
import argparse
import dataclasses
import os
import re
import sys
from typing import Dict, List, Optional

from fairseq_localness.models._locality import applies_to_text, option_flag

# model -> its doc, relative to the repository root
MODEL_DOCS: Dict[str, str] = {
    "localness_transformer": "docs/localness_transformer.md",
    "hybrid_transformer": "docs/hybrid_transformer.md",
    "hysan_transformer": "docs/hysan_transformer.md",
    "dc_transformer": "docs/dc_transformer.md",
}
REGENERATE = "python -m fairseq_localness.models.options_doc"
END = "<!-- options:end -->"


def begin_marker(model: str) -> str:
    return (
        f"<!-- options:begin {model}: generated from the declarations in "
        f"fairseq_localness/models/{model}.py by `{REGENERATE}`; edit those, not this table -->"
    )


_BLOCK = re.compile(r"<!-- options:begin (\w+)[^\n]*-->\n(.*?)" + re.escape(END), re.DOTALL)


def repo_root() -> str:
    """The checkout this package lives in (docs/ is next to the package)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def options_class(model: str):
    import fairseq_localness.models  # noqa: F401  (registers the models)
    from fairseq.models import MODEL_REGISTRY

    return MODEL_REGISTRY[model].options_class


def option_fields(model: str) -> List[dataclasses.Field]:
    """The declared options of ``model`` (FairseqDataclass's ``_name`` is not one): its
    own, then those all models share (:class:`~fairseq_localness.models._locality.LocalityOptions`)."""
    cls = options_class(model)
    own = cls.own_fields()
    return own + [fld for fld in dataclasses.fields(cls) if fld not in own and not fld.name.startswith("_")]


def _cell(text: str) -> str:
    """One line of Markdown table cell: ``|`` escaped, ``<name>`` not read as HTML."""
    text = " ".join(str(text).split()).replace("|", "\\|")
    return re.sub(r"<(?=[A-Za-z/])", "&lt;", text)


def _default(fld: dataclasses.Field) -> str:
    text = fld.metadata.get("default_text")
    if text:
        return _cell(text)
    value = fld.default
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return f"`{value}`"
    return _cell(value)


def options_table(model: str) -> str:
    """The Markdown table of ``model``'s options: option, default, what it does, and
    the settings of the other options (or the layers) it applies to."""
    rows = ["| option | default | what it does | applies to |", "|---|---|---|---|"]
    for fld in option_fields(model):
        if "doc" not in fld.metadata:
            raise ValueError(f"{model}: option {fld.name} is not declared with option() (no doc text)")
        applies_to = fld.metadata.get("applies_to") or {}
        where = "; ".join(filter(None, [applies_to_text(applies_to) if applies_to else "",
                                        fld.metadata.get("scope", "")]))
        rows.append(
            f"| `{option_flag(fld.name)}` | {_default(fld)} | {_cell(fld.metadata['doc'])} | "
            f"{_cell(where) if where else 'always'} |"
        )
    return "\n".join(rows) + "\n"


def update_text(text: str, model: str) -> str:
    """``text`` (a doc) with ``model``'s table between its markers regenerated."""
    blocks = [m for m in _BLOCK.finditer(text) if m.group(1) == model]
    if len(blocks) != 1:
        raise ValueError(
            f"expected one block '<!-- options:begin {model} ... -->' ... '{END}', found {len(blocks)}"
        )
    m = blocks[0]
    return text[: m.start()] + begin_marker(model) + "\n" + options_table(model) + END + text[m.end():]


def differing(root: Optional[str] = None) -> List[str]:
    """The docs whose option table differs from the generated one."""
    root = root or repo_root()
    out = []
    for model, doc in MODEL_DOCS.items():
        with open(os.path.join(root, doc), encoding="utf-8") as f:
            text = f.read()
        if update_text(text, model) != text:
            out.append(doc)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fairseq_localness.models.options_doc", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check; exit 1 if a table differs")
    parser.add_argument("--root", default=None, help="repository root (default: the checkout of this package)")
    args = parser.parse_args(argv)
    root = args.root or repo_root()
    if args.check:
        stale = differing(root)
        for doc in stale:
            print(f"{doc}: the option table differs from the declarations; run {REGENERATE}", file=sys.stderr)
        return 1 if stale else 0
    for model, doc in MODEL_DOCS.items():
        path = os.path.join(root, doc)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = update_text(text, model)
        if new != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
            print(f"updated {doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
