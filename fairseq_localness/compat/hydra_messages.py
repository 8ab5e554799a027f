"""hydra's deprecation warnings about fairseq's configuration, hidden.

What fairseq does wrong: every fairseq command builds its configuration through
``hydra.experimental`` (``convert_namespace_to_omegaconf``), and hydra 1.3 prints
about a dozen lines of deprecation warnings about it (no ``version_base``,
``# @package _group_``, schema matching, ``strict=``, ...), which a user cannot act
on.

What the fix changes: :func:`filter_hydra_deprecation_warnings` hides those
warnings, by message (:data:`HYDRA_DEPRECATIONS`), and nothing else. fairseq imports
the ``--user-dir`` while parsing the command line, before it builds the
configuration, so none of them is printed.

The tests that fail without it: ``tests/test_checkpoint_safety.py``,
``test_fairseq_train_prints_none_of_hydras_deprecation_warnings`` (and
``test_the_hydra_filter_hides_exactly_those_warnings``, of the function itself).
"""
import warnings

HYDRA_DEPRECATIONS = (
    r"hydra\.experimental\.initialize\(\) is no longer experimental",
    r"hydra\.experimental\.compose\(\) is no longer experimental",
    r"\s*The version_base parameter is not specified",
    r"In '[^']*': Usage of deprecated keyword in package header '# @package _group_'",
    r"\s*'[^']*' is validated against ConfigStore schema with the same name",
    r"\s*The strict flag in the compose API is deprecated",
)
"""The starts of the deprecation warnings hydra prints each time fairseq 0.12 builds
its configuration (``convert_namespace_to_omegaconf``: ``hydra.experimental``'s
``initialize``/``compose``, no ``version_base``, ``# @package _group_`` headers,
automatic schema matching, ``strict=``)."""


def filter_hydra_deprecation_warnings():
    """Hide the deprecation warnings of :data:`HYDRA_DEPRECATIONS`, by message, and
    only those: about a dozen lines on every fairseq command, about fairseq's use of
    hydra, which a user cannot act on. Idempotent (``warnings`` keeps one copy of a
    filter)."""
    for message in HYDRA_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)

