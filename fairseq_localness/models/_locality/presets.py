"""The named architectures every model registers: fairseq's own sizes
(:func:`fairseq_presets`), small ones (:func:`transformer_small`), each checking the
model's options when applied to a command line (:func:`register_presets`)."""
from typing import Callable, Dict, Optional

from fairseq.models.transformer import base_architecture

def transformer_small(layers: int, ffn_embed_dim: int = 1024):
    """A fill function for a small transformer (tensor2tensor's ``transformer_small``
    sizes): d = 256, 4 heads, ``ffn_embed_dim`` (default 1024 = 4d), ``layers`` layers
    on each side; the rest as fairseq's base architecture. Values given on the command
    line win, as in fairseq's own architecture functions."""

    def fill(args):
        for side in ("encoder", "decoder"):
            for name, value in (("embed_dim", 256), ("ffn_embed_dim", ffn_embed_dim),
                                ("attention_heads", 4), ("layers", layers)):
                setattr(args, f"{side}_{name}", getattr(args, f"{side}_{name}", value))
        base_architecture(args)

    fill.__name__ = f"transformer_small_{layers}_layers"
    fill.__doc__ = (
        f"{layers} + {layers} layers, d = 256, 4 heads, FFN {ffn_embed_dim} (tensor2tensor's transformer_small sizes)"
    )
    return fill


def fairseq_presets() -> Dict[str, Callable]:
    """The sizes every model registers, from fairseq's own architecture functions:
    suffix ("" for the model's base) -> function filling the sizes into ``args``."""
    from fairseq.models.transformer import transformer_legacy as tl

    return {
        "": tl.base_architecture,
        "tiny": tl.tiny_architecture,  # tests and the demo
        "iwslt_de_en": tl.transformer_iwslt_de_en,
        "wmt_en_de": tl.transformer_wmt_en_de,
        "vaswani_wmt_en_de_big": tl.transformer_vaswani_wmt_en_de_big,
    }


def register_presets(model_name: str, extra: Optional[Dict[str, Callable]] = None):
    """Register ``<model_name>_<suffix>`` architectures: :func:`fairseq_presets` and
    ``extra`` (suffix -> fill function, e.g. ``{"iwslt_small": transformer_small(2)}``).

    The registered function fills in the sizes, then, when it is applied to a
    freshly parsed command line (fairseq's ``parse_args_and_arch``; a config built by
    fairseq for a model or read from a checkpoint carries ``_name``), checks the
    model's options with :meth:`LocalityTransformerModel.check_command_line`.
    """
    from fairseq.models import register_model_architecture

    for suffix, fill in {**fairseq_presets(), **(extra or {})}.items():
        arch = model_name + ("_" + suffix if suffix else "")
        register_model_architecture(model_name, arch)(_checked_architecture(model_name, fill))


def _checked_architecture(model_name: str, fill):
    def architecture(args):
        fill(args)
        if getattr(args, "_name", None) is None:
            from fairseq.models import MODEL_REGISTRY

            MODEL_REGISTRY[model_name].check_command_line(args)

    architecture.__name__ = getattr(fill, "__name__", "architecture")
    architecture.__doc__ = fill.__doc__
    return architecture
