"""What to generate: :class:`CorpusConfig` (seed, split sizes, language codes,
shares of the phenomena), with its validation."""
import re
from dataclasses import dataclass, field
from typing import Dict

from fairseq_localness.corpus.lexicon import DEFAULT_SHARES, PHENOMENA

_LANG_RE = re.compile(r"^[A-Za-z0-9_]+$")


# --------------------------------------------------------------------------- config
@dataclass
class CorpusConfig:
    """What to generate. The defaults are the corpus ``make demo`` uses."""

    seed: int = 1
    train_size: int = 8000
    valid_size: int = 400
    test_size: int = 500
    src_lang: str = "src"
    tgt_lang: str = "tgt"
    shares: Dict[str, float] = field(default_factory=lambda: dict(DEFAULT_SHARES))

    def validate(self):
        for name in ("train_size", "valid_size", "test_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("src_lang", "tgt_lang"):
            if not _LANG_RE.match(getattr(self, name)):
                raise ValueError(
                    f"{name} must be letters, digits or '_' (it names files and the "
                    f"fairseq language pair), got {getattr(self, name)!r}"
                )
        if self.src_lang == self.tgt_lang:
            raise ValueError(f"src_lang and tgt_lang must differ, both are {self.src_lang!r}")
        if set(self.shares) != set(PHENOMENA):
            raise ValueError(f"shares must give exactly {list(PHENOMENA)}, got {sorted(self.shares)}")
        for name, p in self.shares.items():
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"share of {name} must be in [0, 1], got {p}")
