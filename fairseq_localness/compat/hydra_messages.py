"""hydra's deprecation warnings and debug lines about fairseq's configuration, hidden.

What fairseq does wrong: every fairseq command builds its configuration through
``hydra.experimental`` (``convert_namespace_to_omegaconf``), and hydra 1.3 prints
about a dozen lines of deprecation warnings about it (no ``version_base``,
``# @package _group_``, schema matching, ``strict=``, ...), which a user cannot act
on. And ``fairseq/models/wav2vec/wav2vec2_classification.py``, imported with every
model of fairseq, calls ``logging.basicConfig(level=logging.DEBUG)`` at import: every
command that configures its logging after importing the models (``fairseq-generate``,
so ``scripts/evaluate.sh``; ``fairseq-interactive``) logs at DEBUG, and hydra's
``JobRuntime`` prints ``DEBUG:hydra.core.utils:Setting JobRuntime:name=UNKNOWN_NAME``
and ``...:name=utils`` each time fairseq builds a configuration.

What the fix changes: :func:`filter_hydra_deprecation_warnings` hides those
warnings, by message (:data:`HYDRA_DEPRECATIONS`), and nothing else;
:func:`filter_hydra_job_runtime_lines` drops the ``Setting JobRuntime:`` records of
``hydra.core.utils``, and nothing else (the level fairseq's import left is not
changed, so nothing else a command logs is lost). fairseq imports the ``--user-dir``
while parsing the command line, before it builds the configuration, so none of them
is printed.

The tests that fail without it: ``tests/test_checkpoint_safety.py``,
``test_the_hydra_filter_hides_exactly_those_warnings`` and
``test_fairseq_train_prints_no_line_a_user_cannot_act_on`` (the warnings);
``tests/test_evaluation.py``, ``test_averaging_and_evaluation_print_no_line_a_user_cannot_act_on``
(the debug lines).
"""
import logging
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

JOB_RUNTIME = "Setting JobRuntime:"
"""The start of the debug lines of ``hydra.core.utils`` that
:func:`filter_hydra_job_runtime_lines` drops."""


def filter_hydra_deprecation_warnings():
    """Hide the deprecation warnings of :data:`HYDRA_DEPRECATIONS`, by message, and
    only those: about a dozen lines on every fairseq command, about fairseq's use of
    hydra, which a user cannot act on. Idempotent (``warnings`` keeps one copy of a
    filter)."""
    for message in HYDRA_DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=UserWarning)


class _WithoutJobRuntime(logging.Filter):
    """Drops the records whose message starts with :data:`JOB_RUNTIME`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(JOB_RUNTIME)


def filter_hydra_job_runtime_lines():
    """Drop hydra's ``Setting JobRuntime:...`` debug records (logger
    ``hydra.core.utils``), and only those. Idempotent."""
    logger = logging.getLogger("hydra.core.utils")
    if not any(isinstance(f, _WithoutJobRuntime) for f in logger.filters):
        logger.addFilter(_WithoutJobRuntime())
