"""CUDA's choice of paths, taken on the CPU: for tests that check what CUDA computes
where no GPU is at hand.

Each choice that differs between the devices is a tuple of device types in its own
module; :func:`cuda_paths_on_cpu` adds the CPU to the CUDA side of each, for the
duration of a ``with`` block:

* :data:`.choice.FUSED_DEVICES`: every call with anything of its own goes to one
  FlexAttention call (:mod:`.flex`), in training too; several branches that are
  windows alone to one call for all (HySAN's, the hybrid's); a call with Shaw et
  al.'s value term and attention dropout to one autograd function per branch
  (:func:`.dense.dense_relative`);
* :data:`~fairseq_localness.modules.projections.STACKED_PROJECTION_DEVICES`: the
  projections of one input as one product (and Yang et al.'s P and D together);
* :data:`~fairseq_localness.modules.dual_context.JOINT_PASS_DEVICES`: the Dual
  Contextual module's two FI units as one call;
* :data:`.flex.EPILOGUE_DEVICES`: a fusion within the fused call of the branches;
* :data:`.flex.PROLOGUE_DEVICES`: a score term's prologue (Yang et al.'s P and sigma)
  within the fused call that reads it;
* :data:`.step.FUSED_STEP_DEVICES`: one query row (a beam-search step) as one call of
  SDPA's fused kernel with its mask or bias as data;
* :data:`~fairseq_localness.modules.hysan.BRANCH_LOOP_DEVICES` (the CPU leaves it):
  HySAN's squeeze gate after a fused call over all branches as one product.

The rules that stay the CPU's own: a head dimension under 16 (which Inductor's CUDA
kernels do not take, :func:`.flex.supports`) still takes the fused call; Shaw et al.'s
table gets no kernel options (the CUDA kernel's block sizes); several windows of one
query row over more than :data:`.choice.EAGER_MAX_KEYS` keys take a step per window
(each one fused call), and a call the fused kernel does not take (attention dropout)
keeps the CPU's kernels, but for Shaw et al.'s value term (above).

The fused calls run uncompiled on the CPU: torch's reference implementation of
FlexAttention (``torch.nn.attention.flex_attention``), which computes the scores of
the score function densely, forward and backward. torch refuses a CPU call that
needs gradients (Inductor's CPU kernels have no backward pass); within the block
that refusal is lifted, the reference's own backward pass being exact. What only a
GPU checks is what Inductor makes of the calls (the compiled kernels, their blocks
and shared memory); the graphs themselves are traced on the CPU by the tests that
add a backend to :data:`.flex.COMPILE_BACKENDS`.

Not for training: the switches are process-wide, and the reference implementation
keeps ``Tq x Tk`` scores per call.
"""
import contextlib


def _cpu_backward_allowed(original):
    """torch's device check of a FlexAttention call, without its refusal of a CPU call
    that needs gradients (every other check kept)."""

    def check(query, key, value):
        if query.device.type == "cpu":
            return None
        return original(query, key, value)

    return check


@contextlib.contextmanager
def cuda_paths_on_cpu():
    """Within it, a CPU takes the paths that CUDA takes (the module docstring); the
    switches are restored on leaving, also on an error."""
    from fairseq_localness.modules import dual_context, hysan, projections
    from fairseq_localness.modules.kernels import choice, flex, step

    switches = [
        (choice, "FUSED_DEVICES", choice.FUSED_DEVICES + ("cpu",)),
        (flex, "EPILOGUE_DEVICES", flex.EPILOGUE_DEVICES + ("cpu",)),
        (flex, "PROLOGUE_DEVICES", flex.PROLOGUE_DEVICES + ("cpu",)),
        (projections, "STACKED_PROJECTION_DEVICES", projections.STACKED_PROJECTION_DEVICES + ("cpu",)),
        (dual_context, "JOINT_PASS_DEVICES", dual_context.JOINT_PASS_DEVICES + ("cpu",)),
        (step, "FUSED_STEP_DEVICES", step.FUSED_STEP_DEVICES + ("cpu",)),
        (hysan, "BRANCH_LOOP_DEVICES", tuple(d for d in hysan.BRANCH_LOOP_DEVICES if d != "cpu")),
    ]
    try:
        import torch.nn.attention.flex_attention as torch_flex
    except ImportError:  # pragma: no cover - a torch without FlexAttention: no fused calls
        torch_flex = None
    if torch_flex is not None and hasattr(torch_flex, "_validate_device"):
        switches.append((torch_flex, "_validate_device", _cpu_backward_allowed(torch_flex._validate_device)))
    saved = [(module, name, getattr(module, name)) for module, name, _ in switches]
    try:
        for module, name, value in switches:
            setattr(module, name, value)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
