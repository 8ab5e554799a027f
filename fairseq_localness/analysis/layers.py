"""Names of the recorded attention layers: a module name such as
``encoder.layers.0.self_attn`` -> the label ``enc1`` of the tables and plots, the
order of those labels, and which attention (encoder, decoder, cross) a module is."""
import re

_LAYER_RE = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(self_attn|encoder_attn)")


def layer_label(module_name: str) -> str:
    """``encoder.layers.0.self_attn...`` -> ``enc1``; decoder self-attention ->
    ``dec1_self``, encoder-decoder attention -> ``dec1_cross`` (1-based, the same
    names as the training metrics)."""
    m = _LAYER_RE.match(module_name)
    if not m:
        return module_name
    side, index, kind = m.group(1), int(m.group(2)) + 1, m.group(3)
    if side == "encoder":
        return f"enc{index}"
    return f"dec{index}_{'self' if kind == 'self_attn' else 'cross'}"


def layer_sort_key(label: str):
    m = re.match(r"^(enc|dec)(\d+)(?:_(self|cross))?$", label)
    if not m:
        return (2, 0, label)
    return (0 if m.group(1) == "enc" else 1, int(m.group(2)), m.group(3) or "")


def side_of(module_name: str) -> str:
    """``encoder`` (encoder self-attention), ``decoder`` (decoder self-attention) or
    ``cross`` (encoder-decoder attention)."""
    if module_name.startswith("encoder."):
        return "encoder"
    return "cross" if ".encoder_attn" in module_name else "decoder"
