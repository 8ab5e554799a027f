"""configs/demo.sh: every system of the demo builds with the demo's shared settings.

Catches, in a second and without training, what would otherwise stop `make demo`
minutes in (an unknown architecture, an option the model rejects at this size).
"""
import os
import subprocess

import pytest
import torch
from fairseq import options
from fairseq.data import Dictionary
from fairseq.models import ARCH_MODEL_REGISTRY

import fairseq_localness  # noqa: F401  (registers the models)
from conftest import REPO

CONFIG = os.path.join(REPO, "configs", "demo.sh")


def read_config():
    """(systems as (name, arch, extra args), shared model args, shared train args)."""
    script = (
        f'set -euo pipefail; . "{CONFIG}"; '
        'for s in "${DEMO_SYSTEMS[@]}"; do printf "%s\\n" "$s"; done; echo "@@"; '
        'printf "%s\\n" "${DEMO_MODEL_ARGS[@]}"; echo "@@"; printf "%s\\n" "${DEMO_TRAIN_ARGS[@]}"'
    )
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    systems, model_args, train_args = out.split("@@\n")
    parsed = []
    for line in systems.splitlines():
        name, arch, extra = (line.split("|") + ["", ""])[:3]
        parsed.append((name, arch, extra.split()))
    return parsed, model_args.split(), train_args.split()


SYSTEMS, MODEL_ARGS, TRAIN_ARGS = read_config()


class _Task:
    def __init__(self):
        d = Dictionary()
        for i in range(50):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d


def test_system_names_are_unique_and_transformer_is_first():
    names = [s[0] for s in SYSTEMS]
    assert len(names) == len(set(names))
    assert SYSTEMS[0][:2] == ("transformer", "transformer")


def test_default_systems_cover_every_model():
    """`make demo` (DEMO_DEFAULT) trains the transformer and each model, listed in
    DEMO_SYSTEMS."""
    out = subprocess.run(["bash", "-c", f'set -euo pipefail; . "{CONFIG}"; echo "$DEMO_DEFAULT"'],
                         capture_output=True, text=True, check=True).stdout.split()
    by_name = {name: arch for name, arch, _ in SYSTEMS}
    assert set(out) <= set(by_name), set(out) - set(by_name)
    assert {by_name[n] for n in out} == {"transformer", "localness_transformer", "hybrid_transformer",
                                         "hysan_transformer", "dc_transformer"}


@pytest.mark.parametrize("name, arch, extra", SYSTEMS, ids=[s[0] for s in SYSTEMS])
def test_demo_system_builds(name, arch, extra):
    assert arch in ARCH_MODEL_REGISTRY, f"{name}: unknown architecture {arch}"
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser, ["/dev/null", "--task", "translation", "--arch", arch, *MODEL_ARGS, *TRAIN_ARGS, *extra]
    )
    torch.manual_seed(0)
    task = _Task()
    model = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    vocab = len(task.target_dictionary)
    tokens = torch.randint(task.target_dictionary.nspecial, vocab, (2, 7))
    tokens[:, -1] = 2
    prev = torch.roll(tokens, 1, dims=1)
    out, _ = model(tokens, torch.tensor([7, 7]), prev)
    assert out.shape == (2, 7, vocab) and torch.isfinite(out).all()
