"""The layers a plan builds: :class:`LayerSpec` (what goes into one layer), fairseq's
encoder and decoder layers with the attention a spec chooses, and the encoder and
decoder that build one layer per spec (:class:`LocalityTransformerEncoder`,
:class:`LocalityTransformerDecoder`)."""
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import (
    TransformerDecoderLayerBase,
    TransformerEncoderLayerBase,
)
from torch import nn

from fairseq_localness.modules.observe import Observable

SubmoduleBuilder = Callable[[int, object], nn.Module]  # (embed_dim, cfg) -> module

SIDES = ("encoder", "decoder")


@dataclass
class LayerSpec:
    """What the plan puts into one layer; None keeps fairseq's module."""

    side: str  # "encoder" or "decoder"
    # 0-based position in the built model (in a LayerDrop-pruned model, the position
    # among the kept layers: encoder.layers.<index>, labelled enc<index + 1>)
    index: int
    self_attention: Optional[SubmoduleBuilder] = None
    encoder_attention: Optional[SubmoduleBuilder] = None
    # Builds the whole layer, for variants that replace more than an attention
    # (called as layer_class(cfg, spec, ...) like the classes below).
    layer_class: Optional[type] = None

    @property
    def label(self) -> str:
        return f"{'enc' if self.side == 'encoder' else 'dec'}{self.index + 1}"


def _label_observables(module: Optional[nn.Module], prefix: str):
    if module is None:
        return
    for sub in module.modules():
        if isinstance(sub, Observable):
            sub.metric_prefix = prefix


class LocalityEncoderLayer(TransformerEncoderLayerBase):
    """fairseq's encoder layer with the self-attention chosen by a :class:`LayerSpec`."""

    def __init__(self, cfg, spec: LayerSpec, return_fc: bool = False):
        # fairseq's __init__ calls build_self_attention, which reads the spec; a plain
        # (non-Module) attribute may be set before nn.Module.__init__.
        self.layer_spec = spec
        super().__init__(cfg, return_fc=return_fc)
        _label_observables(self.self_attn, spec.label)

    def build_self_attention(self, embed_dim, cfg):
        if self.layer_spec.self_attention is not None:
            return self.layer_spec.self_attention(embed_dim, cfg)
        return super().build_self_attention(embed_dim, cfg)


class LocalityDecoderLayer(TransformerDecoderLayerBase):
    """fairseq's decoder layer with self- and encoder-decoder attention chosen by a
    :class:`LayerSpec`."""

    def __init__(self, cfg, spec: LayerSpec, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        self.layer_spec = spec  # read by the build_* methods that fairseq's __init__ calls
        super().__init__(cfg, no_encoder_attn, add_bias_kv, add_zero_attn)
        _label_observables(self.self_attn, spec.label + "_self")
        _label_observables(self.encoder_attn, spec.label + "_cross")

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if self.layer_spec.self_attention is not None:
            return self.layer_spec.self_attention(embed_dim, cfg)
        return super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn)

    def build_encoder_attention(self, embed_dim, cfg):
        if self.layer_spec.encoder_attention is not None:
            return self.layer_spec.encoder_attention(embed_dim, cfg)
        return super().build_encoder_attention(embed_dim, cfg)


def _wrap_like_fairseq(layer: nn.Module, cfg) -> nn.Module:
    """Activation checkpointing and FSDP wrapping, as fairseq's build_*_layer do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


class _SpecQueue:
    """The :class:`LayerSpec` of each layer of one side, handed out in layer order.

    fairseq's ``TransformerEncoderBase.__init__`` / ``TransformerDecoderBase.__init__``
    call ``build_encoder_layer(cfg)`` / ``build_decoder_layer(cfg, ...)`` once per layer,
    in order, without the layer's index. This is the one place that works around it:
    the encoder/decoder below hold a queue (a plain object, set before
    ``nn.Module.__init__``) from which each call takes the next spec.
    """

    def __init__(self, side: str, specs: Sequence[LayerSpec]):
        self.side = side
        self._specs = list(specs)
        self._next = 0

    def next_spec(self) -> LayerSpec:
        if self._next >= len(self._specs):
            raise RuntimeError(f"fairseq built more {self.side} layers than the plan has ({len(self._specs)})")
        spec = self._specs[self._next]
        self._next += 1
        return spec

    def check_done(self) -> None:
        if self._next != len(self._specs):
            raise RuntimeError(
                f"the plan has {len(self._specs)} {self.side} layers but fairseq built {self._next}"
            )

    @staticmethod
    @contextmanager
    def held_by(module: nn.Module, side: str, specs: Sequence[LayerSpec]):
        """``module.layer_queue`` while fairseq's ``__init__`` builds the layers of
        ``module``; checked to be used up, then removed."""
        module.layer_queue = _SpecQueue(side, specs)
        yield
        module.layer_queue.check_done()
        del module.layer_queue


class LocalityTransformerEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, specs: Sequence[LayerSpec], return_fc=False):
        with _SpecQueue.held_by(self, "encoder", specs):
            super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)

    def build_encoder_layer(self, cfg):
        spec = self.layer_queue.next_spec()
        layer_class = spec.layer_class or LocalityEncoderLayer
        return _wrap_like_fairseq(layer_class(cfg, spec, return_fc=self.return_fc), cfg)


class LocalityTransformerDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, specs: Sequence[LayerSpec], no_encoder_attn=False):
        with _SpecQueue.held_by(self, "decoder", specs):
            super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        spec = self.layer_queue.next_spec()
        layer_class = spec.layer_class or LocalityDecoderLayer
        return _wrap_like_fairseq(layer_class(cfg, spec, no_encoder_attn), cfg)

    def reorder_incremental_state_scripting(self, incremental_state, new_order):
        """fairseq's reorder for beam search (``FairseqIncrementalDecoder``): every
        submodule with a ``reorder_incremental_state`` reorders its state, once each.
        fairseq finds them at every step by walking ``modules()`` with ``hasattr``,
        which goes through ``nn.Module.__getattr__`` and an exception for each module
        without one; :func:`stateful_modules` looks at the classes. The same modules
        in the same order. For the 168 modules of a HySAN decoder (``iwslt_de_en``,
        one thread) fairseq's walk takes about 280 us a step, this one about 100."""
        for module in stateful_modules(self):
            result = module.reorder_incremental_state(incremental_state, new_order)
            if result is not None:
                incremental_state = result


_REORDER = "reorder_incremental_state"


def stateful_modules(root: nn.Module) -> List[nn.Module]:
    """The modules of ``root`` (itself included, each once, in the order of
    ``root.modules()``) that have a ``reorder_incremental_state``, on their class or
    as an attribute of their own."""
    found, seen = [], set()

    def visit(module: nn.Module):
        seen.add(id(module))
        if hasattr(type(module), _REORDER) or _REORDER in module.__dict__:
            found.append(module)
        for child in module._modules.values():
            if child is not None and id(child) not in seen:
                visit(child)

    visit(root)
    return found


def attention_heads(cfg, side: str) -> int:
    """H of ``side``'s attention (``cfg``: fairseq's transformer config)."""
    return cfg.encoder.attention_heads if side == "encoder" else cfg.decoder.attention_heads
