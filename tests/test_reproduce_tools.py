"""What the reproduce scripts add to fairseq and sacrebleu: ``--optimizer adam_l2``
(Xu et al. 2019's L2 regularization, :mod:`fairseq_localness.optim`) and
scripts/reproduce/paired_bs.py (Koehn 2004's paired bootstrap)."""
import json
import os
import subprocess
import sys

from conftest import tool_env
from reproduce_utils import REPRO

def test_adam_l2_is_an_l2_penalty_on_the_loss():
    """--optimizer adam_l2 --l2-regularization L (Xu et al.'s L2 1e-7): the same steps as
    torch.optim.Adam(weight_decay=L), whose weight decay is added to the gradient;
    fairseq's own --weight-decay (decoupled, AdamW) gives other steps."""
    import torch
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.optim import build_optimizer

    import fairseq_localness  # noqa: F401

    def build(*opts):
        args = options.parse_args_and_arch(options.get_training_parser(), [
            "/dev/null", "--task", "translation", "--arch", "transformer", "--lr", "0.01",
            "--adam-betas", "(0.9,0.98)", "--cpu", *opts])
        return convert_namespace_to_omegaconf(args).optimizer

    torch.manual_seed(0)
    start = torch.randn(6)
    weights = [torch.nn.Parameter(start.clone()) for _ in range(3)]
    ours = build_optimizer(build("--optimizer", "adam_l2", "--l2-regularization", "0.1"), [weights[0]])
    ref = torch.optim.Adam([weights[1]], lr=0.01, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1)
    adamw = build_optimizer(build("--optimizer", "adam", "--weight-decay", "0.1"), [weights[2]])
    for _ in range(4):
        g = torch.randn(6)
        for w in weights:
            w.grad = g.clone()
        for o in (ours, ref, adamw):
            o.step()
    assert torch.allclose(weights[0], weights[1], atol=1e-7)
    assert not torch.allclose(weights[0], weights[2], atol=1e-4)
    # with mixed precision's scaled gradients (scale = 1/loss scale) the penalty scales too
    w = torch.nn.Parameter(start.clone())
    scaled = build_optimizer(build("--optimizer", "adam_l2", "--l2-regularization", "0.1"), [w])
    w_ref = torch.nn.Parameter(start.clone())
    ref = torch.optim.Adam([w_ref], lr=0.01, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.1)
    g = torch.randn(6)
    w.grad, w_ref.grad = g * 8, g.clone()
    scaled._optimizer.step = (lambda step: (lambda closure=None, scale=1.0: (
        [setattr(p, "grad", p.grad / scale) for p in scaled.params], step(closure))))(scaled._optimizer.step)
    scaled.step(scale=8.0)
    ref.step()
    assert torch.allclose(w, w_ref, atol=1e-7)


def test_paired_bootstrap(tmp_path):
    """paired_bs.py: Koehn's test through sacrebleu --paired-bs; a clearly better system
    gets a small p; bad inputs exit with a message."""
    import random

    rng = random.Random(0)
    words = "the a cat dog sat on mat house tree green big small".split()
    refs = [" ".join(rng.choice(words) for _ in range(8)) for _ in range(200)]
    base = [" ".join(w if rng.random() < 0.5 else "x" for w in r.split()) for r in refs]
    better = [" ".join(w if rng.random() < 0.9 else "x" for w in r.split()) for r in refs]
    for name, text in (("ref", refs), ("base", base), ("better", better)):
        (tmp_path / name).write_text("\n".join(text) + "\n")
    script = os.path.join(REPRO, "paired_bs.py")
    p = subprocess.run([sys.executable, script, "--ref", tmp_path / "ref", "--baseline", f"b={tmp_path / 'base'}",
                        "--system", f"s={tmp_path / 'better'}", "--samples", "200", "--out", tmp_path / "out"],
                       capture_output=True, text=True, env=tool_env())
    assert p.returncode == 0, p.stderr
    result = json.loads((tmp_path / "out" / "paired_bs.json").read_text())
    assert result["samples"] == 200 and result["tokenize"] == "13a" and "Koehn 2004" in result["test"]
    assert result["system"]["bleu"] > result["baseline"]["bleu"] and result["p_value"] < 0.01
    assert "--paired-bs" in result["command"]
    p = subprocess.run([sys.executable, script, "--ref", tmp_path / "ref", "--baseline", f"b={tmp_path / 'base'}",
                        "--system", f"s={tmp_path / 'base'}", "--samples", "50", "--out", tmp_path / "same"],
                       capture_output=True, text=True, env=tool_env())
    same = json.loads((tmp_path / "same" / "paired_bs.json").read_text())  # one file as both: runs on a copy
    assert same["system"]["bleu"] == same["baseline"]["bleu"] and 0 < same["p_value"] <= 1
    (tmp_path / "short").write_text("one line\n")
    p = subprocess.run([sys.executable, script, "--ref", tmp_path / "ref", "--baseline", f"b={tmp_path / 'base'}",
                        "--system", f"s={tmp_path / 'short'}", "--out", tmp_path / "bad"],
                       capture_output=True, text=True, env=tool_env())
    assert p.returncode != 0 and "has 1 lines, --ref has 200" in p.stderr and not (tmp_path / "bad").exists()
