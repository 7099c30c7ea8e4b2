# make demo  - train a tiny NSA model on the CPU for a few steps (creates .venv when missing)
# make test  - run the test suite (CPU; GPU tests skip cleanly)
# CUDA users: make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench bench-gpu clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_SPEC)
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m nsa.train --data text --layers 2 --dim 128 --heads 4 --kv-heads 2 --head-dim 32 \
		--seq-len 256 --batch 4 --steps 200 --warmup 20 --lr 2e-3 --log-every 20 --out runs/demo-train

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check nsa nsadiag repro tests bench

bench: $(STAMP)
	$(PY) bench/bench_layer.py --model-step

bench-gpu: $(STAMP)
	$(PY) bench/bench_triton.py

clean:
	rm -rf $(VENV) runs .pytest_cache
