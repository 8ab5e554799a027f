"""Loading fairseq checkpoints without running code from them, within bounded memory.

A checkpoint is a pickle, and fairseq builds a model from the settings it holds; a
file from a model zoo or a colleague's run directory may have been written to run
code or exhaust memory by either route. Every checkpoint this package or fairseq
(through ``--user-dir``) loads goes through :func:`torch_load_checkpoint`:

- :mod:`.scan`: the zip container and the pickle's opcodes, checked before anything
  is built;
- :mod:`.load`: torch's restricted unpickler with exactly the globals fairseq
  checkpoints hold, and the trust switch;
- :mod:`.settings`: the loaded state, before fairseq reads it;
- :mod:`.literals`: fairseq's ``eval()`` of its settings, as literal parsing;
- :mod:`.files`: no file a checkpoint's settings name is opened; the files the hub
  reads beside it are regular, bounded and inside its folder;
- :mod:`.values`: sizes fairseq can build and translate with, finite weights;
- :mod:`.errors`: the one-line errors.

The threat model, what is guaranteed and how it is tested: ``docs/security.md``.
"""
from fairseq_localness.checkpoint.errors import (TRUST_ENV, CheckpointError, MalformedCheckpointError,
                                                 UntrustedCheckpointError, install_excepthook)
from fairseq_localness.checkpoint.load import (TRUST_FLAG, add_trust_argument, check_file, torch_load_checkpoint,
                                               trusted, trusting)

__all__ = ["TRUST_ENV", "TRUST_FLAG", "CheckpointError", "MalformedCheckpointError", "UntrustedCheckpointError",
           "add_trust_argument", "check_file", "install_excepthook", "torch_load_checkpoint", "trusted", "trusting"]
