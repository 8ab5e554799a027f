"""On a GPU, no system makes the host wait for the device more often than fairseq's
transformer: a training step and a beam search of each main system, in bf16, with
torch's sync debug mode counting the waits it reports (a GPU tensor's value read on the
host: ``.item()``, ``bool()``, a blocking copy, ``nonzero``; :func:`count_syncs`).

A training step bound by its host (the transformer's on an H200: 14 ms of kernels in
a 40 ms step, docs/benchmark.md) loses the GPU's queue at each wait; the attention
code reads values on the host only for CPU tensors (``modules/attention.py``). These
tests need CUDA and skip elsewhere; ``scripts/gpu_check.sh --stages tests`` runs them.
"""
import pytest
import torch

from fairseq_localness.cli.bench_measure import count_syncs
from fairseq_localness.cli.bench_model import _Toy, _decode, _train_step, build, make_batch, make_optimizer
from fairseq_localness.cli.bench_run import width_options
from fairseq_localness.cli.bench_systems import SYSTEMS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MAIN_SYSTEMS = ["localness (query, enc 1-3)", "localness + rel_pos", "hybrid (gate, enc 1-2)", "hysan e1 (gated)",
                "enc-dc (f=2)", "dec-dc (f=2)", "full-dc (f=2)"]
BASELINE = "transformer"


def _waits(name: str):
    """The waits of the second training step and of the second beam search (the first
    of each compiles what compiles), by where they were made."""
    device = torch.device("cuda")
    task = _Toy(1000)
    model_name, options = SYSTEMS[name]
    _, model = build(model_name, "iwslt_de_en", options + width_options(64), task, device, torch.bfloat16)
    model.train()
    optimizer = make_optimizer(model, torch.bfloat16)
    batch = make_batch(task, 8, 24, 24, device)
    decode_src = make_batch(task, 2, 16, 16, device)[:2]
    for _ in range(2):
        _train_step(model, optimizer, batch)
        _decode(model, task, decode_src, 8)
    return (count_syncs(lambda: _train_step(model, optimizer, batch), device),
            count_syncs(lambda: _decode(model, task, decode_src, 8), device))


@pytest.fixture(scope="module")
def transformer_waits():
    return _waits(BASELINE)


@pytest.mark.parametrize("name", MAIN_SYSTEMS)
def test_cuda_no_more_host_syncs_than_the_transformer(name, transformer_waits):
    train, decode = _waits(name)
    base_train, base_decode = transformer_waits
    assert sum(train.values()) <= sum(base_train.values()), (dict(train), dict(base_train))
    assert sum(decode.values()) <= sum(base_decode.values()), (dict(decode), dict(base_decode))
