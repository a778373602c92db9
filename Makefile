# kvc - top-level entry points. `make check` and `make demo` install what they need.
BUILD ?= build
GENERATOR ?= Ninja
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
# The project-local Python environment (scripts/python-env.sh).
VENV ?= $(CURDIR)/.venv

.PHONY: all deps python-env configure build check demo docs clean bench-vllm-ttft

all: build

deps:
	@bash scripts/install-deps.sh

python-env: deps
	@bash scripts/python-env.sh $(VENV)

$(BUILD)/build.ninja:
	@$(MAKE) --no-print-directory deps
	cmake -S . -B $(BUILD) -G $(GENERATOR) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

configure: $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Every test: lit (compiler), ctest (unit tests, runtime, and pytest over the
# Python package, built against the project's environment) and the GPU
# check's script end to end at toy scale on the CPU (its pack built and held
# to 64 MiB); fails on any failure.
check: python-env configure
	cmake -S . -B $(BUILD) -DKVC_PYTHON=ON -DPython_EXECUTABLE=$(VENV)/bin/python
	cmake --build $(BUILD) -j $(JOBS)
	cmake --build $(BUILD) --target check-kvc
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	bash scripts/gpu-check.sh toy $(BUILD)/gpu-toy

# Regenerates the ODS reference in docs/ from the .td files.
docs: configure
	cmake --build $(BUILD) --target kvc-update-docs

# Time to first token inside vLLM's CPU engine: vLLM alone, kvc, vLLM's
# ExampleConnector, two workloads, several bandwidths and concurrencies
# (docs/results.md; about half an hour on 2 cores).
bench-vllm-ttft: python-env configure
	cmake -S . -B $(BUILD) -DKVC_PYTHON=ON -DPython_EXECUTABLE=$(VENV)/bin/python
	cmake --build $(BUILD) -j $(JOBS) --target _kvc kvc-python-sources
	PYTHONPATH=$(BUILD)/python $(VENV)/bin/python bench/vllm-ttft.py --out docs/results/vllm-ttft

demo: build
	@bash scripts/demo.sh $(BUILD)

clean:
	rm -rf $(BUILD)
