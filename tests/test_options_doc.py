"""The option tables of docs/<model>.md are generated from the option declarations
in fairseq_localness/models/*.py, and what a declaration says (its help, the settings
it applies to) is what the code does."""
import argparse
import dataclasses
import enum
import os

import pytest
import torch

from model_utils import TINY, build_model, command_line_error, random_batch
from fairseq.models import MODEL_REGISTRY

from fairseq_localness.models import options_doc
from fairseq_localness.models._locality import option_flag

MODELS = list(options_doc.MODEL_DOCS)


@pytest.mark.parametrize("model", MODELS)
def test_doc_table_is_the_generated_one(model):
    path = os.path.join(options_doc.repo_root(), options_doc.MODEL_DOCS[model])
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert options_doc.update_text(text, model) == text, (
        f"the option table of {options_doc.MODEL_DOCS[model]} differs from the declarations in "
        f"fairseq_localness/models/{model}.py; regenerate it with: {options_doc.REGENERATE}"
    )


def test_check_mode_reports_a_stale_table(tmp_path, capsys):
    root = tmp_path
    for model, doc in options_doc.MODEL_DOCS.items():
        (root / "docs").mkdir(exist_ok=True)
        with open(os.path.join(options_doc.repo_root(), doc), encoding="utf-8") as f:
            (root / doc).write_text(f.read(), encoding="utf-8")
    assert options_doc.main(["--check", "--root", str(root)]) == 0
    doc = root / options_doc.MODEL_DOCS["hybrid_transformer"]
    doc.write_text(doc.read_text().replace("| `--hybrid-window-m` | 1 |", "| `--hybrid-window-m` | 2 |"))
    assert options_doc.main(["--check", "--root", str(root)]) == 1
    assert "docs/hybrid_transformer.md: the option table differs" in capsys.readouterr().err
    assert options_doc.main(["--root", str(root)]) == 0  # regenerates
    assert options_doc.main(["--check", "--root", str(root)]) == 0


def _parser_help(model: str) -> dict:
    parser = argparse.ArgumentParser()
    MODEL_REGISTRY[model].add_args(parser)
    return {action.dest: action.help for action in parser._actions}


@pytest.mark.parametrize("model", MODELS)
def test_help_is_the_declaration_with_where_it_applies(model):
    helps = _parser_help(model)
    for fld in options_doc.option_fields(model):
        assert "doc" in fld.metadata, f"{fld.name}: declare it with option()"
        text = helps[fld.name]
        assert text.startswith(fld.metadata["doc"]), fld.name
        applies = bool(fld.metadata["applies_to"] or fld.metadata["scope"])
        assert ("Applies to " in text) == applies, (fld.name, text)
        for other in fld.metadata["applies_to"]:
            assert option_flag(other) in text
        if fld.name.endswith("_min_window"):  # the floor as the code applies it
            assert "D = F + (max(I, F) - F) * sigmoid(z)" in text
            assert "D = F + (N - F) * sigmoid(z)" in text


def _other_value(fld: dataclasses.Field):
    """A valid value of ``fld`` other than its default (on the tiny model: d = 32)."""
    special = {"hybrid_gate": "head", "hybrid_neighbor_window": "layer", "dc_encoder_layers": "1",
               "dc_decoder_layers": "1", "hysan_gate_reduction": 8}
    if fld.name in special:
        return special[fld.name]
    if isinstance(fld.default, bool):
        return not fld.default
    if isinstance(fld.default, (int, float)):
        return fld.default + 1
    raise AssertionError(f"no test value for {fld.name}")


def _choices(model: str, name: str):
    fld = next(f for f in options_doc.option_fields(model) if f.name == name)
    if isinstance(fld.type, type) and issubclass(fld.type, enum.Enum):
        return [e.value for e in fld.type]
    assert isinstance(fld.default, bool), name
    return [True, False]


def _args(values: dict):
    out = []
    for name, value in values.items():
        if value is True:
            out.append(option_flag(name))
        elif value is not False:
            out += [option_flag(name), str(value)]
    return out


APPLIES = [(model, fld.name) for model in MODELS for fld in options_doc.option_fields(model)
           if fld.metadata.get("applies_to")]


@pytest.mark.parametrize("model, name", APPLIES)
def test_applies_to_is_what_the_code_checks(model, name, capsys):
    """Given under the settings it applies to, the option is accepted; given with the
    first condition broken, it is refused on the command line, naming it."""
    fld = next(f for f in options_doc.option_fields(model) if f.name == name)
    conditions = fld.metadata["applies_to"]
    arch = f"{model}_tiny"
    applicable = {other: values[0] for other, values in conditions.items()}
    build_model(arch, TINY + _args({**applicable, name: _other_value(fld)}))
    first = next(iter(conditions))
    outside = next(v for v in _choices(model, first) if v not in conditions[first])
    err = command_line_error(arch, _args({**applicable, first: outside, name: _other_value(fld)}), capsys)
    assert option_flag(name) in err.splitlines()[-1], err


def test_a_fixed_window_below_the_floor_is_used_as_given():
    """The floor parametrizes learned windows; a fixed window (Yang et al. 2018, section
    3.3: a constant D) is used as given, here D = 0.5 below the default floor 1."""
    model, task = build_model("localness_transformer_tiny",
                              TINY + ["--localness-window", "fixed", "--localness-fixed-window", "0.5"])
    branch = model.encoder.layers[0].self_attn.branches[-1]
    assert (branch.window, branch.fixed_window, branch.min_window) == ("fixed", 0.5, 1.0)
    src, lengths, prev, _ = random_batch(task, [6, 4])
    with torch.no_grad():
        assert torch.isfinite(model(src, lengths, prev)[0]).all()
