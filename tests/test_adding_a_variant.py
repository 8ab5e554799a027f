"""docs/adding_a_variant.md's worked example works as written.

The walk-through's two files (the branch, ``fairseq_localness/modules/strided.py``,
and the model, ``fairseq_localness/models/strided_transformer.py``) are taken from
the document's first two Python blocks, loaded under those module names in a fresh
process (so the registered model does not outlive the test), and the model built from
fairseq's command line meets the contract: incremental decoding equals the full pass,
batch and padding invariance, and the fast attention path equals the eager reference.
A document that names a moved import or a changed interface fails here.
"""
import os
import re
import subprocess
import sys
import textwrap

from conftest import REPO

DOC = os.path.join(REPO, "docs", "adding_a_variant.md")
TESTS = os.path.dirname(os.path.abspath(__file__))

CHECK = textwrap.dedent("""
    import importlib.util, sys
    import torch
    import fairseq_localness  # noqa: F401  (the package, as --user-dir imports it)

    def load(name, path):
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)

    load("fairseq_localness.modules.strided", sys.argv[1])
    load("fairseq_localness.models.strided_transformer", sys.argv[2])

    from model_utils import (build_model, check_batch_invariance, check_fast_path_equals_eager,
                             check_incremental_equals_full, size_args)

    torch.set_num_threads(1)
    for extra in (["--strided-decoder-layers", "1", "--strided-stride", "3"], ["--strided-fusion", "concat"]):
        model, task = build_model("strided_transformer", size_args(2, 16, 32, 2) + ["--dropout", "0"] + extra)
        strided = [m for m in model.modules() if type(m).__name__ == "StridedBranch"]
        assert strided, "the model holds no strided branch"
        check_incremental_equals_full(model, task)
        check_batch_invariance(model, task)
        check_fast_path_equals_eager(model, task)
        print("ok", len(strided), "strided branches", " ".join(extra))
""")


def _python_blocks(text: str):
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_worked_example_builds_and_meets_the_contract(tmp_path):
    with open(DOC) as f:
        blocks = _python_blocks(f.read())
    branch, model = blocks[0], blocks[1]
    assert "class StridedBranch(AttentionBranch)" in branch
    assert '@register_model("strided_transformer")' in model
    (tmp_path / "strided.py").write_text(branch)
    (tmp_path / "strided_transformer.py").write_text(model)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path / "strided.py"), str(tmp_path / "strided_transformer.py")],
        capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines == ["ok 3 strided branches --strided-decoder-layers 1 --strided-stride 3",
                     "ok 2 strided branches --strided-fusion concat"], proc.stdout
