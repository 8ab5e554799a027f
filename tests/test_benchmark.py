"""fairseq-localness-bench (fairseq_localness/cli/benchmark.py): its table of systems
(one place, models do not import the benchmark), usage errors, the dtype check, the
multiply-add counts behind the training and decoding bounds, the activation
breakdown, and a tiny in-process run in bf16 on the CPU."""
import ast
import json
import os
import sys

import pytest
import torch

import fairseq_localness  # noqa: F401  (registers the models)
from fairseq_localness.cli import bench_measure, bench_model, bench_run, bench_sweep
from fairseq_localness.cli import benchmark as bench
from fairseq_localness.cli.bench_systems import BASELINE, SYSTEMS, select

PACKAGE = os.path.dirname(os.path.abspath(fairseq_localness.__file__))
TINY_RUN = ["--size", "tiny", "--vocab", "64", "--batch-size", "2", "--src-len", "6", "--tgt-len", "6",
            "--decode-batch", "2", "--decode-len", "4", "--repeats", "1", "--threads", "1", "--cpu"]


# --------------------------------------------------------------------------- systems
def _imports(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


@pytest.mark.parametrize("area", ["models", "modules"])
def test_models_do_not_import_the_benchmark(area):
    for name in sorted(os.listdir(os.path.join(PACKAGE, area))):
        if name.endswith(".py"):
            found = [m for m in _imports(os.path.join(PACKAGE, area, name)) if "bench" in m]
            assert not found, f"{area}/{name} imports {found}"


def test_one_table_lists_every_model_and_builds():
    """Every model of the package is in the table (the hybrid variants too, which the
    model module used to add itself), and every system builds at the tiny preset."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    models = {model for model, _ in SYSTEMS.values()}
    ours = {name for name, cls in MODEL_REGISTRY.items() if cls.__module__.startswith("fairseq_localness")}
    assert {"localness_transformer", "hybrid_transformer", "hysan_transformer", "dc_transformer"} <= ours
    assert models == {"transformer"} | ours  # every model of the package has a system
    assert next(iter(SYSTEMS)) == BASELINE
    assert [n for n in SYSTEMS if n.startswith("hybrid")] == [
        "hybrid (gate, enc 1-2)", "hybrid (gate, enc 1-2 + dec 1-2)", "hybrid (concat)",
        "hybrid (local_pattern)", "hybrid (neighbor)", "hybrid (local_h)", "hybrid (local_s)"]
    task = bench_model._Toy(64)
    for name, (model, options) in SYSTEMS.items():
        assert f"{model}_tiny" in ARCH_MODEL_REGISTRY, name
        arch, built = bench_model.build(model, "tiny", options, task, torch.device("cpu"))
        assert sum(p.numel() for p in built.parameters()) > 0, name


def test_select_by_system_or_model_name():
    assert select([]) == list(SYSTEMS)
    assert select(["hysan_transformer", "enc-dc (f=2)"]) == [
        "hysan e1 (gated)", "hysan e1 (sum)", "hysan e1 (concat)", "enc-dc (f=2)"]
    with pytest.raises(ValueError, match=r"unknown system\(s\) \['nope'\]"):
        select(["nope", "transformer"])


def test_list(capsys):
    bench.main(["--list", "--size", "tiny"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(SYSTEMS)
    assert "hybrid (local_s): hybrid_transformer_tiny --hybrid-variant local_s" in lines


def test_console_script_points_to_the_cli_module():
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts["fairseq-localness-bench"] == "fairseq_localness.cli.benchmark:main"


# --------------------------------------------------------------------------- usage errors
BAD = {
    "fp16_on_cpu": (["--dtype", "fp16"], "--dtype fp16: needs a CUDA GPU"),
    "unknown_dtype": (["--dtype", "fp8"], "--dtype: invalid choice: 'fp8'"),
    "unknown_system": (["--systems", "nope"], "--systems: unknown system(s) ['nope']"),
    "no_repeats": (["--repeats", "0"], "--repeats must be >= 1, got 0"),
    "tiny_vocab": (["--vocab", "3"], "--vocab must be >= 8"),
    "unknown_attention_impl": (["--attention-impl", "flash"], "--attention-impl: invalid choice: 'flash'"),
    "attention_impl_twice": (["--attention-impl", "sdpa", "sdpa"], "--attention-impl: a value given twice"),
    "lengths_not_numbers": (["--lengths", "32,long"], "--lengths: expected comma-separated integers"),
    "lengths_empty_item": (["--lengths", "32,,256"], "--lengths: expected comma-separated integers"),
    "lengths_too_short": (["--lengths", "1,32"], "--lengths: every length must be >= 2, got [1]"),
    "lengths_twice": (["--lengths", "32,256,32"], "--lengths: a length given twice"),
    "lengths_with_batch": (["--lengths", "32", "--batch-size", "4", "--decode-len", "8"],
                           "--batch-size, --decode-len: not with --lengths"),
    "tokens_per_batch_zero": (["--lengths", "32", "--tokens-per-batch", "0"], "--tokens-per-batch must be >= 1"),
    "unknown_clock": (["--clock", "gpu"], "--clock: invalid choice: 'gpu'"),
    "sweep_option_without_lengths": (["--max-decode-len", "64"], "--max-decode-len: only with --lengths"),
    "width_not_multiple": (["--width", "40"], "--width must be a multiple of 16 and >= 16"),
    "width_zero": (["--width", "0"], "--width must be a multiple of 16 and >= 16"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_usage_errors_exit_2_before_any_work(case, tmp_path, capsys):
    extra, message = BAD[case]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--quick", "--cpu", "--output-dir", str(out), *extra])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_sweep_batch_rule():
    """Equal tokens per length: the defaults give the default run's 64 x 32 at T = 32,
    8 x 256 and 2 x 1024, beam searches over 32, 4 and 1 sentences, capped at 256 steps."""
    args = bench.parse_args(["--lengths", "1024,32,256", "--cpu"])
    assert args.lengths == [32, 256, 1024]
    shapes = [bench_sweep.shape(n, args) for n in args.lengths]
    assert [(s["batch_size"], s["src_len"], s["tgt_len"]) for s in shapes] == [(64, 32, 32), (8, 256, 256),
                                                                                (2, 1024, 1024)]
    assert [(s["decode_batch"], s["decode_len"]) for s in shapes] == [(32, 32), (4, 256), (1, 256)]
    assert "256 output steps (capped by --max-decode-len)" in bench_sweep.describe(1024, args)
    assert "capped" not in bench_sweep.describe(256, args)
    args = bench.parse_args(["--lengths", "3000", "--tokens-per-batch", "600", "--decode-tokens", "9",
                             "--max-decode-len", "4000", "--cpu"])
    assert bench_sweep.shape(3000, args) == dict(batch_size=1, src_len=3000, tgt_len=3000, decode_batch=1,
                                                 decode_len=3000)


def test_sweep_writes_after_each_length(monkeypatch, tmp_path):
    """An interrupted sweep (e.g. under ``timeout``) keeps the lengths done: the outputs
    are written after every length, and say which lengths are missing."""
    args = bench.parse_args(["--lengths", "4,8,16", "--cpu", "--output-dir", str(tmp_path)])
    monkeypatch.setattr(bench_sweep, "run", lambda one, after_round=None: [])
    seen = []
    sweep = bench_sweep.run_sweep(args, lambda done: seen.append([e["length"] for e in done]))
    assert seen == [[4], [4, 8]] and [e["length"] for e in sweep] == [4, 8, 16]
    payload, text = bench_sweep.report(sweep[:1], args, "a machine")
    assert "Lengths measured so far: [4] of [4, 8, 16]." in text
    assert [e["length"] for e in payload["sweep"]] == [4] and (tmp_path / bench_sweep.PLOT).exists()


@pytest.mark.parametrize("sweep", [False, True])
def test_a_run_stopped_after_a_round_keeps_its_rounds(sweep, monkeypatch, tmp_path):
    """A benchmark stopped by a time limit in its second round (here: the timer raises)
    has written the first: bench.md and bench.json with the round's ratios, saying how
    far the run went."""
    from fairseq_localness.cli import bench_run

    calls = []
    timed = bench_run._time_round

    def stops_in_round_2(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # round 2's training pass
            raise KeyboardInterrupt
        return timed(*args, **kwargs)

    monkeypatch.setattr(bench_run, "_time_round", stops_in_round_2)
    out = tmp_path / "out"
    shape = (["--lengths", "4", "--tokens-per-batch", "8", "--decode-tokens", "4", "--max-decode-len", "3"] if sweep
             else ["--batch-size", "2", "--src-len", "4", "--tgt-len", "4", "--decode-batch", "1", "--decode-len", "3"])
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--size", "tiny", "--vocab", "64", *shape, "--repeats", "3", "--threads", "1", "--cpu",
                    "--systems", "hybrid (gate, enc 1-2)", "--output-dir", str(out)])
    md = (out / "bench.md").read_text()
    assert "round 1 of 3 of group 1 of 1" in md and "| hybrid (gate, enc 1-2) |" in md
    payload = json.loads((out / "bench.json").read_text())
    results = payload["sweep"][0]["results"] if sweep else payload["results"]
    hybrid = next(r for r in results if r["name"] == "hybrid (gate, enc 1-2)")
    assert hybrid["train_ratio"] > 0 and len(hybrid["train_times"]) == 1
    assert (payload["sweep"][0]["partial"] if sweep else payload["partial"]) == "round 1 of 3 of group 1 of 1"


def test_cpu_clock_leaves_out_waiting():
    """``--clock cpu`` times by the process's CPU time: a pass that waits (here: sleeps)
    costs wall time but no CPU time."""
    import time

    cpu = torch.device("cpu")
    assert bench_measure._timed(lambda: time.sleep(0.2), cpu, "wall") >= 0.2
    assert bench_measure._timed(lambda: time.sleep(0.2), cpu, "cpu") < 0.05
    busy = bench_measure._timed(lambda: sum(range(3_000_000)), cpu, "cpu")
    assert busy > 0.01


def test_dtype_check_by_device():
    assert bench_model.check_dtype("fp32", "cpu") is None
    assert bench_model.check_dtype("bf16", "cpu") is None
    assert "needs a CUDA GPU" in bench_model.check_dtype("fp16", "cpu")
    assert bench_model.check_dtype("fp16", "cuda", "Tesla V100", (7, 0)) is None
    assert bench_model.check_dtype("bf16", "cuda", "NVIDIA H100 80GB HBM3", (9, 0)) is None
    problem = bench_model.check_dtype("bf16", "cuda", "Tesla V100", (7, 0))
    assert "Tesla V100 (compute capability 7.0) has no bfloat16 arithmetic" in problem


def test_mixed_precision_step_keeps_fp32_master_weights():
    """fp16/bf16 training as fairseq's FP16Optimizer: the model stays in bf16, Adam
    steps fp32 master weights, and the model gets them back (rounded)."""
    task = bench_model._Toy(64)
    _, model = bench_model.build("transformer", "tiny", [], task, torch.device("cpu"), torch.bfloat16)
    optimizer = bench_model.make_optimizer(model, torch.bfloat16)
    batch = bench_model.make_batch(task, 2, 5, 5, torch.device("cpu"))
    before = [m.clone() for m in optimizer.master]
    bench_model._train_step(model, optimizer, batch)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert {m.dtype for m in optimizer.master} == {torch.float32}
    assert any(not torch.equal(a, b) for a, b in zip(before, optimizer.master))
    for p, m in zip(optimizer.params, optimizer.master):
        assert torch.equal(p, m.to(torch.bfloat16))


def test_mixed_precision_step_unscales_into_fp32_gradients_and_skips_parameters_without_one():
    """The master gradients: each model gradient copied to fp32 and divided by the loss
    scale (fp16), all parameters in one multi-tensor call; a parameter that got no
    gradient this step is not stepped (its master and its Adam state stay as they
    were), as torch's Adam skips one."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)).to(torch.bfloat16)
    optimizer = bench_model._MixedPrecisionAdam(model, lr=1e-3, loss_scale=128.0)
    frozen_weight = model[0].weight
    model(torch.randn(5, 4, dtype=torch.bfloat16)).float().sum().mul(128.0).backward()
    frozen_weight.grad = None  # as if it took no part in this step
    expected = {id(m): p.grad.float() / 128.0 for p, m in zip(optimizer.params, optimizer.master)
                if p.grad is not None}
    before = [m.detach().clone() for m in optimizer.master]
    optimizer.step()
    for p, m, old in zip(optimizer.params, optimizer.master, before):
        if p is frozen_weight:
            assert m.grad is None and torch.equal(m, old) and m not in optimizer.optimizer.state
        else:
            assert m.grad.dtype == torch.float32 and torch.equal(m.grad, expected[id(m)])
            assert not torch.equal(m, old)
    # a second step in which another parameter gets none: its gradient of the first step
    # (still in its fp32 buffer) does not step it again
    optimizer.zero_grad()
    model(torch.randn(5, 4, dtype=torch.bfloat16)).float().sum().mul(128.0).backward()
    model[1].bias.grad = None
    before = [m.detach().clone() for m in optimizer.master]
    optimizer.step()
    for p, m, old in zip(optimizer.params, optimizer.master, before):
        assert (m.grad is None) == (p is model[1].bias)
        assert torch.equal(m, old) == (p is model[1].bias)


def test_mixed_precision_step_copies_gradients_in_multi_tensor_calls():
    """Around Adam's own step, the copies to and from the master weights are one
    multi-tensor call each, plus one unscaling call in fp16, however many parameter
    tensors the model has (not a copy and a multiply per tensor: on CUDA, two kernel
    launches per tensor)."""
    from model_utils import OperatorCalls

    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(5)]).to(torch.bfloat16)
    for scale, expected in ((1.0, ["_foreach_copy_", "_foreach_copy_"]),
                            (128.0, ["_foreach_copy_", "_foreach_mul_", "_foreach_copy_"])):
        optimizer = bench_model._MixedPrecisionAdam(model, lr=1e-3, loss_scale=scale)
        optimizer.optimizer.step = lambda: None  # Adam's own operator calls are not counted
        model(torch.randn(2, 4, dtype=torch.bfloat16)).float().sum().backward()
        with OperatorCalls() as calls:
            optimizer.step()
        assert calls.names == expected
        optimizer.zero_grad()


# --------------------------------------------------------------------------- counting
def test_cpu_attention_kernels_are_counted():
    """torch's FlopCounterMode counts only the GPU kernels of scaled_dot_product_attention;
    the benchmark's counter counts the CPU kernels as torch counts the GPU ones: two
    B x H x T x T x Dh products forward, five backward (the scores are recomputed);
    one multiply-add = 2 flops."""
    q = torch.randn(2, 4, 8, 16, requires_grad=True)
    with bench_measure.flop_counter() as counter:
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    assert counter.get_total_flops() == 2 * (2 * 2 * 4 * 8 * 8 * 16)
    with bench_measure.flop_counter() as counter:
        out.sum().backward()
    assert counter.get_total_flops() == 2 * (5 * 2 * 4 * 8 * 8 * 16)


def test_decode_count_has_the_encoder_once():
    """Enc-DC and the transformer share their decoder: their beam searches differ by
    exactly the difference of one encoder pass over the source batch."""
    task = bench_model._Toy(64)
    src = bench_model.make_batch(task, 3, 7, 7, torch.device("cpu"), seed=1)[:2]

    def counts(options):
        _, model = bench_model.build("dc_transformer" if options else "transformer", "tiny", options, task,
                               torch.device("cpu"))
        model.eval()
        with bench_measure.flop_counter() as counter, torch.no_grad():
            model.encoder(src[0], src_lengths=src[1])
        return bench_measure.measure_decode_flops(model, task, src, 5), counter.get_total_flops()

    base_decode, base_encoder = counts([])
    dc_decode, dc_encoder = counts(["--dc-mode", "enc"])
    assert dc_encoder > base_encoder
    assert dc_decode - base_decode == dc_encoder - base_encoder


def test_activation_breakdown_adds_up_and_names_the_dc_units():
    task = bench_model._Toy(64)
    _, model = bench_model.build("dc_transformer", "tiny", ["--dc-mode", "enc"], task, torch.device("cpu"))
    batch = bench_model.make_batch(task, 2, 6, 6, torch.device("cpu"))
    _flops, total, by_module, *_ = bench_measure.measure_static(model, batch, 4, torch.device("cpu"))
    assert sum(by_module.values()) == total
    assert {"encoder.layers.*.self_attn.local_context", "encoder.layers.*.self_attn.fi_local",
            "encoder.layers.*.self_attn.fi_global", "encoder.layers.*.self_attn.aggregate",
            "(loss)"} <= set(by_module)
    assert not any(k.startswith("decoder.layers.*.self_attn.") for k in by_module)


# --------------------------------------------------------------------------- a run
def test_tiny_run_in_bf16_on_the_cpu(tmp_path, capsys):
    out = tmp_path / "bench"
    bench.main([*TINY_RUN, "--dtype", "bf16", "--systems", "dec-dc (f=2)", "--output-dir", str(out)])
    payload = json.loads((out / "bench.json").read_text())
    assert payload["settings"]["dtype"] == "bf16" and payload["device"] == "cpu"
    assert payload["machine"].endswith(", bf16")
    base, dc = payload["results"]
    assert [base["name"], dc["name"]] == ["transformer", "dec-dc (f=2)"]
    assert base["arithmetic_bound"] == base["decode_bound"] == 1.0
    assert dc["error"] is None and 0 < dc["decode_bound"] < 1 and 0 < dc["arithmetic_bound"] < 1
    assert dc["train_ratio"] > 0 and dc["decode_ratio"] > 0
    md = (out / "bench.md").read_text()
    header = md.splitlines()[2]
    assert "| decode bound | dec. ratio / bound |" in header
    row = next(line for line in md.splitlines() if line.startswith("| dec-dc"))
    assert row.count("|") == header.count("|")
    assert f"| {dc['decode_bound']:.3f} |" in row


def test_width_builds_every_system_at_that_width(tmp_path):
    """``--width C``: the transformer and the systems at embedding C, feed-forward 2C
    and 4 heads on both sides (the preset's layers), said in the report's header."""
    out = tmp_path / "bench"
    bench.main([*TINY_RUN, "--width", "32", "--systems", "hysan e1 (gated)", "--output-dir", str(out)])
    payload = json.loads((out / "bench.json").read_text())
    assert payload["settings"]["width"] == 32
    assert "every model at width 32" in payload["machine"]
    tiny = [r["params"] for r in payload["results"]]
    bench.main([*TINY_RUN, "--width", "64", "--systems", "hysan e1 (gated)", "--output-dir", str(out)])
    wider = [r["params"] for r in json.loads((out / "bench.json").read_text())["results"]]
    assert all(r["error"] is None for r in payload["results"]) and all(w > t for w, t in zip(wider, tiny))


def test_width_options():
    from fairseq_localness.cli.bench_run import width_options

    assert width_options(None) == []
    options = width_options(64)
    for side in ("encoder", "decoder"):
        at = options.index(f"--{side}-embed-dim")
        assert options[at + 1] == "64"
        assert options[options.index(f"--{side}-ffn-embed-dim") + 1] == "128"
        assert options[options.index(f"--{side}-attention-heads") + 1] == "4"


def test_rounds_alternate_the_transformer_first_and_last():
    """Each round times the transformer first (even rounds) or last (odd rounds), the
    systems of the group in their order, and returns every time by name."""
    calls = []
    members = {"a": ("model a", "opt a"), "b": ("model b", "opt b")}
    times = {"base model": 2.0, "model a": 4.0, "model b": 8.0}

    def fake_timed(fn, device, clock="wall"):
        return fn()

    def run_pass(model, opt):
        calls.append(model)
        return times[model]

    original = bench_run._timed
    bench_run._timed = fake_timed
    try:
        first = bench_run._time_round(run_pass, "base model", "base opt", members, False, "cpu", "wall")
        order_first, calls[:] = list(calls), []
        last = bench_run._time_round(run_pass, "base model", "base opt", members, True, "cpu", "wall")
    finally:
        bench_run._timed = original
    assert order_first == ["base model", "model a", "model b"]
    assert calls == ["model a", "model b", "base model"]
    assert first == last == {BASELINE: 2.0, "a": 4.0, "b": 8.0}


def test_a_run_alternates_the_order_round_by_round(tmp_path, monkeypatch, capsys):
    """The run itself asks each round for the transformer first, then last, then first
    again, for training and decoding alike."""
    seen = []
    original = bench_run._time_round

    def recording(run_pass, base_model, base_opt, members, base_last, device, clock):
        seen.append(base_last)
        return original(run_pass, base_model, base_opt, members, base_last, device, clock)

    monkeypatch.setattr(bench_run, "_time_round", recording)
    bench.main([*TINY_RUN[:-5], "--repeats", "3", "--threads", "1", "--cpu", "--systems", "hybrid (gate, enc 1-2)",
                "--output-dir", str(tmp_path / "bench")])
    assert seen == [False, False, True, True, False, False]  # (train, decode) per round


def test_the_spread_of_the_rounds_is_reported_under_the_table(tmp_path, capsys):
    """With several rounds ``bench.md`` gives, under the table, each system's paired
    ratios over the rounds divided by its bound: the median (the table's ratio /
    bound) and the quartiles, from the rounds that ``bench.json`` lists."""
    import statistics

    out = tmp_path / "bench"
    bench.main([*TINY_RUN[:-5], "--repeats", "4", "--threads", "1", "--cpu", "--systems", "hybrid (gate, enc 1-2)",
                "--output-dir", str(out)])
    payload = json.loads((out / "bench.json").read_text())
    system = payload["results"][1]
    assert len(system["train_ratios"]) == len(system["decode_ratios"]) == 4
    md = (out / "bench.md").read_text()
    table_row = next(line for line in md.splitlines() if line.startswith("| hybrid"))
    spread_row = [line for line in md.splitlines() if line.startswith("| hybrid")][1]
    cells = [c.strip() for c in spread_row.strip("|").split("|")]
    assert cells[:2] == ["hybrid (gate, enc 1-2)", "4"]
    for cell, ratios, bound, column in ((cells[2], system["train_ratios"], system["arithmetic_bound"], 5),
                                        (cells[3], system["decode_ratios"], system["decode_bound"], 9)):
        scaled = [r / bound for r in ratios]
        q1, median, q3 = statistics.quantiles(scaled, n=4, method="inclusive")
        assert cell == f"{median:.3f} ({q1:.3f}-{q3:.3f})"
        assert min(scaled) <= q1 <= median <= q3 <= max(scaled)
        assert table_row.split("|")[column + 1].strip() == f"{median:.3f}"  # the table's ratio / bound


def test_one_round_has_no_spread(tmp_path, capsys):
    out = tmp_path / "bench"
    bench.main([*TINY_RUN, "--systems", "hybrid (gate, enc 1-2)", "--output-dir", str(out)])
    assert "Spread over the rounds" not in (out / "bench.md").read_text()


def test_tiny_length_sweep(tmp_path, capsys):
    """``--lengths``: one run per length at about equal tokens, per-length entries and a
    summary in bench.json, the summary table in bench.md and the PNG of the curves."""
    out = tmp_path / "sweep"
    bench.main(["--size", "tiny", "--vocab", "64", "--lengths", "8,4", "--tokens-per-batch", "16",
                "--decode-tokens", "8", "--max-decode-len", "6", "--repeats", "1", "--threads", "1", "--cpu",
                "--clock", "cpu", "--systems", "hysan e1 (gated)", "--output-dir", str(out)])
    payload = json.loads((out / "bench.json").read_text())
    assert payload["settings"]["clock"] == "cpu" and payload["machine"].endswith("timed by process CPU time")
    assert payload["settings"]["lengths"] == [4, 8] and payload["settings"]["tokens_per_batch"] == 16
    sweep = payload["sweep"]
    assert [(e["length"], e["batch_size"], e["decode_batch"], e["decode_len"]) for e in sweep] == [
        (4, 4, 2, 4), (8, 2, 1, 6)]
    assert "6 output steps (capped by --max-decode-len)" in sweep[1]["note"]
    for entry in sweep:
        base, hysan = entry["results"]
        assert [base["name"], hysan["name"]] == ["transformer", "hysan e1 (gated)"]
        assert hysan["error"] is None and hysan["train_tokens"] == entry["batch_size"] * entry["length"]
        assert hysan["decode_sentences"] == entry["decode_batch"]
        row = payload["summary"]["hysan e1 (gated)"][str(entry["length"])]
        assert row["train_ratio_over_bound"] == pytest.approx(hysan["train_ratio"] / hysan["arithmetic_bound"])
        assert row["decode_ratio_over_bound"] == pytest.approx(hysan["decode_ratio"] / hysan["decode_bound"])
        assert row["activations_ratio"] == pytest.approx(hysan["activation_bytes"] / base["activation_bytes"])
        assert row["activations_ratio"] > 1  # the gate's bottleneck and the branches
        assert payload["summary"]["transformer"][str(entry["length"])]["activations_ratio"] == 1.0
    md = (out / "bench.md").read_text()
    assert "| system | train ratio / bound, T=4 | T=8 | decode ratio / bound, T=4 | T=8 |" in md
    assert "## T = 4" in md and "## T = 8" in md
    png = (out / payload["plot"]).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_profile_and_attention_impl(tmp_path, capsys):
    """``--profile`` writes torch.profiler's tables of a training step and a beam search
    per system and their top ops to bench.json (self times that add up to at most the
    whole pass, sorted); ``--attention-impl`` reaches every attention core (eager: no
    SDPA call in the system's training step) and is named in the machine line and the
    settings."""
    out = tmp_path / "bench"
    bench.main([*TINY_RUN, "--systems", "hysan e1 (sum)", "--profile", "--attention-impl", "eager",
                "--output-dir", str(out)])
    payload = json.loads((out / "bench.json").read_text())
    assert payload["settings"]["attention_impl"] == ["eager"] and payload["settings"]["profile"] is True
    assert payload["machine"].endswith(", fp32, attention_impl eager")
    base, hysan = payload["results"]
    assert hysan["name"] == "hysan e1 (sum)" and hysan["attention_impl"] == "eager"
    for result in (base, hysan):
        for kind in ("train", "decode"):
            ops = result["profile"][kind]
            assert 0 < len(ops) <= bench_measure.PROFILE_ROWS
            assert all(op["self_ms"] >= 0 and 0 <= op["share"] <= 1 for op in ops)
            assert sum(op["share"] for op in ops) <= 1 + 1e-6
            assert [op["self_ms"] for op in ops] == sorted((op["self_ms"] for op in ops), reverse=True)
            text = (out / "profile" / f"{bench_run._slug(result['name'])}.{kind}.txt").read_text()
            assert "Self CPU" in text and all(op["op"] in text for op in ops)  # whole names
    assert not any("scaled_dot_product" in op["op"] for op in hysan["profile"]["train"])
    assert {"aten::mm", "aten::addmm", "aten::bmm"} & {op["op"] for op in base["profile"]["train"]}
    # each attention sublayer's forward calls and host time, by side, kind and class
    sublayers = {}
    for result in (base, hysan):
        text = (out / "profile" / f"{bench_run._slug(result['name'])}.train.txt").read_text()
        lines = text.split("Attention sublayers' forward calls")[1].strip().splitlines()[1:]
        sublayers[result["name"]] = {line.split("  calls")[0].strip(): int(line.split("calls")[1].split()[0])
                                     for line in lines if line.strip()}
    assert sublayers[base["name"]] == {"encoder self_attn (MultiheadAttention)": 2,
                                       "decoder self_attn (MultiheadAttention)": 2,
                                       "decoder encoder_attn (MultiheadAttention)": 2}
    assert "encoder self_attn (AttentionCore)" in sublayers[hysan["name"]]
    assert sum(sublayers[hysan["name"]].values()) == 6


def test_flex_rows_are_observed_on_the_eager_path_and_timed_on_their_own(tmp_path, capsys, monkeypatch):
    """``--attention-impl flex`` on the CPU (its beam searches run FlexAttention, which
    no Python dispatch mode can observe: ``FlopCounterMode`` raises under it) counts
    multiply-adds on the eager path, which are then the eager row's, says so in
    bench.json, puts the cores back on flex afterwards, and warms the model's own path
    up before the timed rounds."""
    from fairseq_localness.modules.kernels import flex

    calls = []
    original = flex.flex_branch

    def counting(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(flex, "flex_branch", counting)
    searches = []  # flex calls of each beam search that bench_run runs itself
    original_decode = bench_run._decode

    def decode(*args, **kwargs):
        before = len(calls)
        result = original_decode(*args, **kwargs)
        searches.append(len(calls) - before)
        return result

    monkeypatch.setattr(bench_run, "_decode", decode)
    out = tmp_path / "bench"
    bench.main([*TINY_RUN, "--systems", "localness (fixed)", "--attention-impl", "flex", "eager",
                "--output-dir", str(out)])
    rows = {r["name"]: r for r in json.loads((out / "bench.json").read_text())["results"]}
    flex_row, eager_row = rows["localness (fixed) [flex]"], rows["localness (fixed) [eager]"]
    assert flex_row["error"] is None and flex_row["observed_on_eager"] is True
    assert eager_row["observed_on_eager"] is False and rows["transformer"]["observed_on_eager"] is False
    assert flex_row["decode_flops"] == eager_row["decode_flops"] > 0
    assert flex_row["train_flops"] == eager_row["train_flops"] > 0
    md = (out / "bench.md").read_text()
    assert "and timed on their own: the bounds, activations and largest tensors of localness (fixed) [flex]." in md
    # flex ran without gradients only, in two searches of the flex row: the warm-up on
    # its own path (the count's search ran on the eager path) and the timed one
    assert calls and not any(calls)
    assert [n for n in searches if n] == [len(calls) // 2] * 2


def test_a_system_that_fails_is_reported_and_the_others_are_measured(tmp_path, capsys, monkeypatch):
    """An error while a system is measured or warmed up (here its multiply-add count)
    goes to its row and its traceback to stderr; the run goes on with the others."""
    original = bench_run.measure_static

    def failing(model, batch, heads, device):
        if type(model).__name__ == "HysanTransformerModel":
            raise RuntimeError("no rule for flex_attention\nsecond line")
        return original(model, batch, heads, device)

    monkeypatch.setattr(bench_run, "measure_static", failing)
    out = tmp_path / "bench"
    assert bench.main([*TINY_RUN, "--systems", "hysan e1 (gated)", "localness (fixed)",
                       "--output-dir", str(out)]) is None
    rows = {r["name"]: r for r in json.loads((out / "bench.json").read_text())["results"]}
    assert rows["hysan e1 (gated)"]["error"] == "failed: RuntimeError: no rule for flex_attention"
    assert rows["localness (fixed)"]["error"] is None and rows["localness (fixed)"]["train_times"]
    captured = capsys.readouterr()
    assert "Traceback" in captured.err and "second line" in captured.err
    assert "| hysan e1 (gated) | failed: RuntimeError: no rule for flex_attention |" in (out / "bench.md").read_text()


def test_largest_activations_sees_through_higher_order_operators():
    """:class:`LargestActivations` takes higher-order operators (FlexAttention's fused
    call reaches a dispatch mode as one) and observes their outputs like any op's; a
    tensor computed from parameters alone (a cast weight) is no activation."""
    weight = torch.randn(8, 8)
    x = torch.randn(3, 5, 8)
    assert bench_measure.LargestActivations.supports_higher_order_operators
    with bench_measure.LargestActivations([weight], vocab=1000, seq_lens={5}) as seen:
        w = weight.t().double()  # parameter-derived: not counted
        y = x.double() @ w  # 3 x 5 x 8
        scores = y @ y.transpose(1, 2)  # 3 x 5 x 5: attention-shaped
        torch.cond(torch.tensor(True), lambda t: t * 2, lambda t: t, (scores,))
    assert seen.any == 3 * 5 * 8 and seen.attention == 3 * 5 * 5


@pytest.mark.parametrize("dtype, per_parameter", [
    (torch.float32, 4 + 4 + 8),  # the parameter, its gradient, Adam's two moments
    (torch.bfloat16, 2 + 2 + 4 + 4 + 8),  # and the fp32 master copy with its gradient
])
def test_what_a_model_holds_between_steps_is_counted_once(dtype, per_parameter):
    """The standing part of the GPU peak (:func:`held_bytes`, measured here on the CPU):
    after a step, every parameter's bytes in each copy that lives between steps, each
    storage once (in fp32 the optimizer's parameters are the model's); Adam's step
    counters (0-d tensors) are a few bytes each."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)).to(dtype)
    opt = bench_model.make_optimizer(model, dtype)
    model(torch.randn(3, 8, dtype=dtype)).float().sum().backward()
    opt.step()
    count = sum(p.numel() for p in model.parameters())
    inner = getattr(opt, "optimizer", opt)
    steps = sum(state["step"].element_size() for state in inner.state.values())  # a 0-d counter per tensor
    assert len(inner.state) == 4 and steps <= 4 * 8
    assert bench_run.held_bytes(model, opt, "cpu") == count * per_parameter + steps
    assert bench_run.held_bytes(model, opt, "cuda") == 0


def test_the_fp32_gradient_buffers_are_held_from_the_start():
    """The mixed-precision optimizer's fp32 gradient buffers exist before its first step
    (and stay where a parameter gets no gradient): they count as held then too."""
    model = torch.nn.Linear(8, 4).to(torch.bfloat16)
    opt = bench_model.make_optimizer(model, torch.bfloat16)
    count = sum(p.numel() for p in model.parameters())
    assert bench_run.held_bytes(model, opt, "cpu") == count * (2 + 4 + 4)  # model, master, gradient buffer


def test_gpu_launches_are_tabulated_under_the_table():
    """With ``--profile`` on a GPU, each system's kernels per pass and their ratio to the
    transformer's go under the table; a CPU run (no launches) adds nothing."""
    from fairseq_localness.cli import bench_report

    base = bench_run.Result(name=BASELINE, arch="transformer", options=[],
                            launches={"train": {"kernels": 1000, "device_ms": 16.5, "syncs": 2},
                                      "decode": {"kernels": 4000, "device_ms": 30.0, "syncs": 40}})
    system = bench_run.Result(name="hysan e1 (gated)", arch="hysan", options=[],
                              launches={"train": {"kernels": 1250, "device_ms": 20.0, "syncs": 14}})
    older = bench_run.Result(name="localness", arch="localness", options=[],  # a results.json without syncs
                             launches={"train": {"kernels": 1100, "device_ms": 17.0}})
    lines = bench_report.launches([base, system, older], base)
    assert "| transformer | 1,000 | 1.00 | 16.5 | 2 | 4,000 | 1.00 | 30.0 | 40 |" in lines
    assert "| hysan e1 (gated) | 1,250 | 1.25 | 20.0 | 14 | n/a | n/a | n/a | n/a |" in lines
    assert "| localness | 1,100 | 1.10 | 17.0 | n/a | n/a | n/a | n/a | n/a |" in lines
    assert bench_report.launches([bench_run.Result(name=BASELINE, arch="transformer", options=[])], None) == []


def test_count_syncs_counts_the_waits_by_where_python_made_them(monkeypatch):
    """The sync debug mode's warnings are counted by their Python line, the mode set
    only around the pass and restored after it (also when the pass fails); other
    warnings are not counted; no GPU, no count. (The mode itself needs a GPU: stood in
    for here.)"""
    import warnings

    from fairseq_localness.cli import bench_measure

    modes = []
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    monkeypatch.setattr(bench_measure, "_sync", lambda device: None)

    def step():
        for _ in range(3):
            warnings.warn(bench_measure.SYNC_WARNING + ", but the warning is enabled")  # line A
        warnings.warn("another warning")
        warnings.warn(bench_measure.SYNC_WARNING + ", but the warning is enabled")  # line B

    syncs = bench_measure.count_syncs(step, torch.device("cuda"))
    assert modes == ["warn", 0]
    assert sorted(syncs.values()) == [1, 3] and all(site.startswith("test_benchmark.py:") for site in syncs)

    def failing():
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        bench_measure.count_syncs(failing, torch.device("cuda"))
    assert modes[-2:] == ["warn", 0]
    assert bench_measure.count_syncs(step, torch.device("cpu")) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_count_syncs_sees_a_value_read_on_the_host():
    from fairseq_localness.cli import bench_measure

    x = torch.ones(4, device="cuda")
    syncs = bench_measure.count_syncs(lambda: (x * 2).sum().item(), torch.device("cuda"))
    assert sum(syncs.values()) >= 1, syncs
    assert sum(bench_measure.count_syncs(lambda: x * 2, torch.device("cuda")).values()) == 0

    class ReadsInBackward(torch.autograd.Function):  # a wait in the autograd engine's thread
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, grad):
            return grad * float(grad.sum())

    w = torch.ones(4, device="cuda", requires_grad=True)
    syncs = bench_measure.count_syncs(lambda: ReadsInBackward.apply(w).sum().backward(), torch.device("cuda"))
    assert sum(syncs.values()) >= 1, syncs


def test_attention_impl_choices_are_the_cores_settings():
    """The option's choices (a literal, so that usage errors need no fairseq import)
    are the core's settings."""
    from fairseq_localness.modules.kernels.choice import ATTENTION_IMPLS

    action = next(a for a in bench.get_parser()._actions if a.dest == "attention_impl")
    assert tuple(action.choices) == ATTENTION_IMPLS


def test_several_attention_impls_are_interleaved_in_one_run(tmp_path, capsys):
    """``--attention-impl eager sdpa``: one row per system and value (systems in table
    order, values in the order given), timed in the same rounds, each model on its
    path; for one branch the fused kernel's backward pass recomputes ``q k^T`` (five
    T x T products against the eager path's four), and that is the whole difference
    of their counts."""
    out = tmp_path / "bench"
    bench.main([*TINY_RUN, "--systems", "hysan e1 (sum)", "localness (fixed)", "--attention-impl", "eager", "sdpa",
                "--output-dir", str(out)])
    payload = json.loads((out / "bench.json").read_text())
    rows = {r["name"]: r for r in payload["results"]}
    assert list(rows) == ["transformer", "localness (fixed) [eager]", "localness (fixed) [sdpa]",
                          "hysan e1 (sum) [eager]", "hysan e1 (sum) [sdpa]"]
    assert payload["machine"].endswith("attention_impl eager sdpa")
    for name, row in rows.items():
        assert row["error"] is None and len(row["train_times"]) == 1 and len(row["decode_times"]) == 1
        if name != "transformer":
            assert row["attention_impl"] == name.split("[")[1].rstrip("]")
    # tiny: both encoder layers localized (layers 1-3), 2 heads of 32; batch 2 x 6 tokens
    one_product = 2 * (2 * 2 * 6 * 6 * 32)  # flops of one B x H x T x T x Dh product
    assert (rows["localness (fixed) [sdpa]"]["train_flops"] - rows["localness (fixed) [eager]"]["train_flops"]
            == 2 * one_product)
    # several branches: SDPA computes q k^T once per branch (and again in its backward)
    assert rows["hysan e1 (sum) [sdpa]"]["train_flops"] > rows["hysan e1 (sum) [eager]"]["train_flops"]
    assert rows["hysan e1 (sum) [eager]"]["params"] == rows["hysan e1 (sum) [sdpa]"]["params"]
    md = (out / "bench.md").read_text()
    assert "| hysan e1 (sum) [sdpa] |" in md


def test_hysan_gate_saves_only_its_bottleneck():
    """HySAN's gated sum keeps, beyond what the sum fusion keeps, the squeeze gate's
    bottleneck ReLU(f1(x_b)) (C/r values per token and branch) and the branch output
    x_b only where the attention's fast path does not keep it already: the flash
    kernel's output of the global and forward branches is x_b itself, while a backward
    branch's output is the reversed kernel output and a window branch's comes from the
    banded path, which keeps its probabilities (plain autograd would keep x_b, f1(x_b),
    the bottleneck and SG(x_b): 2 C + 2 C/r for every branch)."""
    from fairseq_localness.modules.attention import set_attention_impl
    from fairseq_localness.modules.hysan import GatedSumFusion

    task = bench_model._Toy(64)
    batch = bench_model.make_batch(task, 3, 9, 9, torch.device("cpu"))
    saved, models = {}, {}
    for fusion in ("sum", "gated"):
        _, model = bench_model.build("hysan_transformer", "tiny", ["--hysan-fusion", fusion], task, torch.device("cpu"))
        set_attention_impl(model, "sdpa")
        model.train()
        saved[fusion], models[fusion] = bench_measure.measure_static(model, batch, 4, torch.device("cpu"))[2], model
    expected = 0
    for name, module in models["gated"].named_modules():
        if isinstance(module, GatedSumFusion):
            tokens = batch[0].numel() if name.startswith("encoder") else batch[2].numel()
            outputs_not_kept = sum(1 for b in module.names if b == "backward" or b.startswith("local"))
            expected += len(module.names) * tokens * module.gate.f1.out_features * 4
            expected += outputs_not_kept * tokens * module.gate.f1.in_features * 4
    assert expected > 0
    attention = {fusion: sum(b for k, b in saved[fusion].items() if "self_attn" in k) for fusion in saved}
    assert attention["gated"] - attention["sum"] == expected


def test_module_runs_as_a_script():
    """``python -m fairseq_localness.cli.benchmark`` reads the same table."""
    import subprocess

    p = subprocess.run([sys.executable, "-m", "fairseq_localness.cli.benchmark", "--list"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert len(p.stdout.splitlines()) == len(SYSTEMS)
