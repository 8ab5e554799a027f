"""matplotlib for the analysis tools: pyplot on the non-interactive Agg backend (imported
when a tool first plots, so that ``--help`` starts quickly) and saving a figure."""
import logging
from typing import Optional

logger = logging.getLogger("fairseq_localness.analysis")


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str) -> str:
    fig.savefig(path, dpi=120, bbox_inches="tight")
    pyplot().close(fig)
    logger.info("wrote %s", path)
    return path


def finish_figure(fig, path: str, suptitle: Optional[str] = None) -> str:
    """Lay ``fig`` out (with ``suptitle`` above its panels when given) and save it."""
    if suptitle is not None:
        fig.suptitle(suptitle, fontsize=9)
    fig.tight_layout()
    return save_figure(fig, path)
