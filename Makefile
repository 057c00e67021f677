# tunesmith: `make demo` and `make test` do all the set-up on a fresh clone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# CPU machines take the CPU build of torch; a machine with a GPU keeps the torch it has.
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test test-gpu quality bench faults clean venv

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

TS := $(PY) -m tunesmith
ASK := --prompt "Who are you?" --temperature 0 --max_new_tokens 48

# Before/after: the base model's answer, a LoRA run on the identity data, the tuned answer.
demo: $(STAMP)
	@start=$$(date +%s); \
	echo "== SmolLM2-135M-Instruct before tuning =="; \
	$(TS) chat --model_name_or_path smollm2-135m-instruct $(ASK) || exit 1; \
	$(TS) train examples/demo.yaml || exit 1; \
	echo "== after tuning (adapter in saves/demo) =="; \
	$(TS) chat --model_name_or_path smollm2-135m-instruct --adapter_name_or_path saves/demo \
		$(ASK) | tee saves/demo/answer.txt || exit 1; \
	grep -q Tuney saves/demo/answer.txt || { echo "demo FAILED: the answer lacks the new name"; exit 1; }; \
	echo "demo OK in $$(( $$(date +%s) - start )) s (loss curve: saves/demo/loss.png)"

# Lint and the layer check run first: CI lints every file it tests.
test: quality
	$(PY) -m pytest -q

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu

bench: $(STAMP)
	$(PY) bench/gpu_train.py --out docs/benchmarks

# The whole fault campaign (~20 min on 2 CPU cores); `make test` runs its fast part.
faults: $(STAMP)
	$(PY) tools/faults.py --out docs/faults

quality: $(STAMP)
	$(VENV)/bin/ruff check src tests bench tools
	$(PY) tools/check_layers.py

clean:
	rm -rf $(VENV) saves
