"""The registered models. Importing this package registers every architecture
(each module below registers its model and presets with fairseq when imported)."""
from fairseq_localness.models import (  # noqa: F401
    dc_transformer,
    hybrid_transformer,
    hysan_transformer,
    localness_transformer,
)
