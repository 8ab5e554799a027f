"""fairseq_localness: locality-aware self-attention for fairseq.

fairseq itself is installed separately (see ``requirements/fairseq.txt`` and the
README): its published metadata requires torchaudio, which would pull a second torch
build onto CPU-only machines, so ``make install`` installs it with ``--no-deps`` and
its real runtime dependencies are listed here.
"""
from setuptools import find_packages, setup

FAIRSEQ_RUNTIME = [
    # hydra/omegaconf: the 3.11-capable forks need the 1.3 / 2.3 line, official
    # fairseq 0.12.2 (Python <= 3.10) pins the 1.0 / 2.0 line.
    'hydra-core>=1.3.2,<1.4; python_version >= "3.11"',
    'omegaconf>=2.3,<2.4; python_version >= "3.11"',
    'hydra-core>=1.0.7,<1.1; python_version < "3.11"',
    'omegaconf<2.1; python_version < "3.11"',
    "bitarray",
    "cffi",
    "cython",
    "numpy>=1.21.3",
    "packaging",
    "regex",
    "scikit-learn",
    "tqdm",
    # torch is deliberately unpinned above the floor: `make install` puts a CPU
    # build in place first, and a torch the user already has is left alone.
    "torch>=1.13",
]

SEGMENT = ["fugashi", "unidic-lite", "jieba"]

setup(
    name="fairseq_localness",
    version="0.1.0",
    description="Locality-aware self-attention (Gaussian localness, hybrid local/global, "
    "HySAN, Dual Contextual) as fairseq models",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.8",
    packages=find_packages(include=["fairseq_localness", "fairseq_localness.*"]),
    install_requires=FAIRSEQ_RUNTIME
    + [
        "sacrebleu>=2.3",
        "sacremoses",
        "sentencepiece",
        "subword-nmt",
        "compare-mt",
        "six",  # compare-mt imports it without declaring it
        "matplotlib",
        # fairseq's --tensorboard-logdir writes through it (torch.utils.tensorboard
        # needs the full tensorboard package); without it every fairseq command
        # prints "Please install tensorboardX"
        "tensorboardX>=2.6",
        # --slurm of the reproduce drivers and train.sh (fairseq_localness/slurm/)
        "submitit>=1.5,<2",
    ],
    extras_require={
        # word segmentation for scripts/prepare_data.sh: Japanese (MeCab with the
        # UniDic-lite dictionary) and Chinese (jieba)
        "segment": SEGMENT,
        # pytest-xdist: `make test` runs one worker more than the cores
        # websocket-client: the report's browser tests talk to headless chromium (tests/browser.py)
        "test": ["pytest", "pytest-timeout", "pytest-xdist", "websocket-client"] + SEGMENT,
    },
    entry_points={
        "console_scripts": [
            "fairseq-localness-average=fairseq_localness.cli.average_checkpoints:cli_main",
            "fairseq-localness-corpus=fairseq_localness.corpus:cli_main",
            "fairseq-localness-dump=fairseq_localness.cli.dump_stats:cli_main",
            "fairseq-localness-analysis=fairseq_localness.analysis.__main__:cli_main",
            "fairseq-localness-bench=fairseq_localness.cli.benchmark:main",
            "fairseq-localness-prepare=fairseq_localness.data.prepare:cli_main",
            "fairseq-localness-results=fairseq_localness.cli.results:cli_main",
            "fairseq-localness-report=fairseq_localness.cli.report:cli_main",
            "fairseq-localness-train-check=fairseq_localness.cli.train_check:cli_main",
        ]
    },
)
