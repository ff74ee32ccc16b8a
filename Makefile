# The two commands: `make demo` (the main job on an embedded default) and `make test`.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
TORCH_CPU ?= torch==2.13.0
# Where pip finds the CPU build. Empty = pip's configured sources (this project's machines keep the
# CPU wheel on local disk); elsewhere: make test TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=

.PHONY: install test test-unit test-e2e test-comfy test-browser test-second-pair lint demo bench gpu-check clean

# CPU torch first: a bare `torch` requirement would otherwise pull a multi-GB CUDA build.
install:
	$(PIP) install -q "$(TORCH_CPU)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PIP) install -q -e ".[test,all]"

lint:
	$(PYTHON) -m ruff check .
	lint-imports --config .importlinter  # the layer contracts (docs/architecture.md)

test-unit:
	$(PYTHON) -m pytest -q -m "not e2e and not comfy and not browser"

test-e2e:
	$(PYTHON) -m pytest -q -m "e2e and not comfy and not browser"

# In a real ComfyUI: set COMFYUI_DIR and COMFYUI_PYTHON (.ci/run builds one); skipped when unset.
test-comfy:
	$(PYTHON) -m pytest -q -m "comfy and not browser"

# Headless Chromium (Debian's /usr/bin/chromium) driven by Playwright: the standalone page, and the
# front end in the real ComfyUI when COMFYUI_DIR/COMFYUI_PYTHON are set. Screenshots: $$XPUFLEET_ARTIFACTS.
test-browser:
	$(PYTHON) -m pytest -q -m browser

# The second ComfyUI pair (CI: 0.33.0 + front end 1.58.1; docs/testing.md): COMFYUI2_DIR and COMFYUI2_PYTHON.
# The comfy and browser selections once more in that ComfyUI, less what does not run in a ComfyUI and the
# tests marked one_pair. `make test` runs it when both are set.
COMFYUI2_DIR ?=
COMFYUI2_PYTHON ?=
SECOND_PAIR = COMFYUI_DIR="$(COMFYUI2_DIR)" COMFYUI_PYTHON="$(COMFYUI2_PYTHON)" XPUFLEET_COMFY_PAIR=second

test-second-pair:
	@test -n "$(COMFYUI2_DIR)" -a -n "$(COMFYUI2_PYTHON)" || { echo "set COMFYUI2_DIR and COMFYUI2_PYTHON (docs/testing.md)" >&2; exit 2; }
	$(SECOND_PAIR) $(PYTHON) -m pytest -q -m "comfy and not browser"
	$(SECOND_PAIR) $(PYTHON) -m pytest -q -m browser

# --durations: each selection prints its slowest tests, where CI's time goes (docs/testing.md "The budget")
test: install lint
	$(PYTHON) -m pytest -q -m "not e2e and not comfy and not browser" --durations=10
	$(PYTHON) -m pytest -q -m "e2e and not comfy and not browser" --durations=25
	$(PYTHON) -m pytest -q -m "comfy and not browser" --durations=10
	$(PYTHON) -m pytest -q -m browser --durations=15
	$(if $(and $(COMFYUI2_DIR),$(COMFYUI2_PYTHON)),$(MAKE) --no-print-directory test-second-pair,@echo "no second ComfyUI pair (COMFYUI2_DIR, COMFYUI2_PYTHON): its tests were not run")

demo: install
	$(PYTHON) samples/demo.py

bench: install
	for b in bench/bench_*.py; do echo "== $$b"; $(PYTHON) $$b || exit 1; done

# Every GPU-only path in one command (docs/gpu-check.md): bench/gpu_check.py, then the tests marked gpu,
# which read its report. At most 8 minutes on one GPU; installs nothing (a CUDA build of torch must be
# there). Without a GPU: the list of checks, "no GPU: nothing checked", exit 0.
GPU_REPORT ?= runs/gpu-check.json

gpu-check:
	$(PYTHON) bench/gpu_check.py --json $(GPU_REPORT); status=$$?; \
	XPUFLEET_GPU_REPORT=$(GPU_REPORT) $(PYTHON) -m pytest -q -m gpu tests/gpu || status=1; \
	exit $$status

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache runs
