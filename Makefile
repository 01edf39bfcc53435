# The README's commands. Each target does its own set-up in .venv.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.stamp-setup
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false
export WANDB_MODE ?= offline
export PYTHONUNBUFFERED := 1

.PHONY: setup demo-models demo test test-fast lint bench ablation-demo reproduce clean

setup: $(STAMP)

# torch 2.14.1 / torchvision 0.29.1 go together (docs/method.md section 10);
# installing them first keeps pip from resolving another torch build from the index.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --disable-pip-version-check "torch==2.14.1" "torchvision==0.29.1"
	$(PIP) install --quiet --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

# The demo configs' tiny models (cpr_tools/tiny_models.py: random weights, tokenizer trained on the data),
# built into outputs/models/ where missing; the demo recipes also build them on first use.
demo-models: $(STAMP)
	$(PY) -m cpr_tools.tiny_models --demo

demo: $(STAMP)
	$(PY) -m cpr_tools.tiny_models --demo recipes/configs/demo.yaml
	$(PY) recipes/cpr_curriculum.py

# pytest exits 5 when it collected no tests: that is a failure, said in words.
test: $(STAMP)
	$(VENV)/bin/lint-imports
	@$(PY) -m pytest -q tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: no tests were collected" >&2; exit 1; fi; exit $$rc

# The everyday tier: every test but those marked slow (each over about 10 s: trainings, launches, parity),
# on two worker processes (measured on 2 cores: 147 s against 205 s in one process).
test-fast: $(STAMP)
	@$(PY) -m pytest -q -n 2 -m "not slow" tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-fast: no tests were collected" >&2; exit 1; fi; exit $$rc

lint: $(STAMP)
	$(VENV)/bin/ruff check cpr cpr_tools recipes tests benchmarks reports examples
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(PY) benchmarks/match_f1_throughput.py
	$(PY) benchmarks/reward_throughput.py
	$(PY) benchmarks/guard_calibration.py

ablation-demo: $(STAMP)
	$(PY) -m cpr_tools.tiny_models --demo recipes/configs/demo_tabmwp.yaml
	$(PY) recipes/reward_ablation.py --config recipes/configs/ablation_weights_demo.yaml
	$(PY) recipes/reward_ablation.py --config recipes/configs/ablation_strategies_demo.yaml

# The paper's Tables 5 and 6 in miniature (generated task, tiny model, CPU). The two tables run side by side,
# one process (one torch thread) each; Table 6's log goes to outputs/reproduce/weights.log. Resumable: run it
# again after an interruption and it finishes what is missing; the tables are in outputs/reproduce/*/ablation_*.md.
reproduce: $(STAMP)
	$(PY) -m cpr_tools.tiny_models --demo recipes/configs/demo.yaml
	mkdir -p outputs/reproduce
	$(PY) recipes/reward_ablation.py --config recipes/configs/reproduce_weights.yaml --resume \
	  > outputs/reproduce/weights.log 2>&1 & weights=$$!; \
	$(PY) recipes/reward_ablation.py --config recipes/configs/reproduce_strategies.yaml --resume; strategies=$$?; \
	wait $$weights; status=$$?; cat outputs/reproduce/weights/ablation_weights.md; \
	test $$strategies -eq 0 && test $$status -eq 0

clean:
	rm -rf outputs .pytest_cache
