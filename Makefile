# fairseq_localness: set-up, demo and tests.
#   make demo    install into .venv/ and run the demo on the embedded corpus
#   make test    install into .venv/ and run the test suite
#   make analysis  the papers' analyses of the finished demo (scripts/analyze_demo.sh)
#   make bench   speed, memory and size of every model against the transformer
#                (fairseq-localness-bench, fairseq_localness/cli/benchmark.py;
#                --quick by default, BENCH_ARGS="" for the full run,
#                BENCH_ARGS="--dtype bf16" for every model in bfloat16)
# Both are safe to rerun: the install step is skipped while its inputs are unchanged.

PYTHON     ?= python3
VENV       ?= .venv
# A torch already importable in the venv (e.g. a CUDA build, via
# VENV_FLAGS=--system-site-packages) is left alone; otherwise this one is installed.
TORCH_SPEC ?= torch==2.13.0
VENV_FLAGS ?=
PY         := $(VENV)/bin/python
STAMP      := $(VENV)/.fairseq_localness-installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: one more than the cores (the suite's longest
# tests wait on SLURM jobs and subprocesses: 17 min 15 s against 18 min 57 s with one
# per core, from fresh clones on 2 cores); auto: one per core; 0: one process
TEST_JOBS   ?= $(shell echo $$(( $$(nproc) + 1 )))
BENCH_ARGS  ?= --quick

.PHONY: install demo analysis test bench clean-venv

$(PY):
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)

$(STAMP): setup.py requirements/fairseq.txt | $(PY)
	@$(PY) -c "import torch" 2>/dev/null \
		&& echo "torch already present: $$($(PY) -c 'import torch; print(torch.__version__)')" \
		|| $(PY) -m pip install "$(TORCH_SPEC)"
	$(PY) -m pip install --no-deps -r requirements/fairseq.txt
	$(PY) -m pip install -e ".[test]"
	@touch $(STAMP)

install: $(STAMP)

demo: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/demo.sh

analysis: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" bash scripts/analyze_demo.sh --force

test: install
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS) tests

bench: install
	$(VENV)/bin/fairseq-localness-bench $(BENCH_ARGS)

clean-venv:
	rm -rf $(VENV)
