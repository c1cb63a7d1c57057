# In-network gradient aggregation: one entry point for setup, build, tests, demo
# and experiments. `make test` works on a bare Debian machine (it installs what it
# needs); BMv2 tests run only where simple_switch_grpc is installed.

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
P4C      ?= p4c-bm2-ss
P4BUILD  ?= p4src/build
N        ?= 4
PYTEST   ?= $(PY) -m pytest
# gcc + libc6-dev: the softswitch compiles programs to C (its native backend).
APT_PACKAGES := iproute2 ethtool mininet bridge-utils iputils-ping gcc libc6-dev

.PHONY: setup apt-deps test test-bmv2 p4 p4-test-programs bench bench-switch \
        bench-worker bench-allreduce demo testbed loss-experiment fuzz clean

setup: apt-deps $(VENV)/.installed

# Debian packages for namespaces, veth offload control and Mininet.
apt-deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	    dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends $$missing; fi

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test]'
	touch $@

test: setup
	$(PYTEST) -q -rs

# The packet tests on real BMv2 alone.
test-bmv2: setup
	AGG_SWITCH=bmv2 $(PYTEST) -q -rs -m bmv2 tests/dataplane

# Compile the P4 program (needs p4c; see README). The output is committed.
p4: setup
	$(PY) tools/p4build.py p4src/v1model/aggregation.p4 --p4c $(P4C) --out $(P4BUILD) \
	    --sources 'p4src/shared/*.p4' 'p4src/v1model/*.p4' 'p4src/v1model/control/*.p4'

# Compile the softswitch's small per-primitive test programs.
p4-test-programs: setup
	for f in tests/softswitch/programs/*.p4; do \
	    $(PY) tools/p4build.py --p4c $(P4C) --out tests/softswitch/programs/build $$f || exit 1; \
	done

# Hostile frames (10^5 and more) at the native softswitch, alone and while every
# worker aggregates; prints frames, counters and time (tests/worker/fuzz.py).
fuzz: setup
	$(PY) -m tests.worker.fuzz --frames 120000

bench: bench-switch bench-worker bench-allreduce

bench-switch: setup
	$(PY) benchmarks/bench_switch.py

bench-worker: setup
	$(PY) benchmarks/bench_worker.py

bench-allreduce: setup
	$(PY) -m testbed.baseline_experiment

demo: setup
	$(PY) -m testbed.demo --workers $(N)

testbed: setup
	$(PY) -m testbed.topology --workers $(N)

loss-experiment: setup
	$(PY) -m testbed.loss_experiment

clean:
	rm -rf $(VENV) results .pytest_cache
