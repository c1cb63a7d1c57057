# In-network gradient aggregation: one entry point for setup, build, tests, demo
# and experiments. `make test` works on a bare Debian machine (it installs what it
# needs); BMv2 tests run only where simple_switch_grpc is installed.

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
P4C      ?= p4c-bm2-ss
# The open-source Tofino compiler (p4c's backends/tofino); see docs/p4/tofino.md.
BF_P4C   ?= bf-p4c
P4BUILD  ?= innet_aggregation/p4src/build
N        ?= 4
# TOPO=tree: a spine and LEAVES leaf switches, N / LEAVES workers on each.
TOPO     ?= star
LEAVES   ?= 2
TOPOLOGY := --topo $(TOPO) --leaves $(LEAVES)
# demo: MODEL=large trains a 1.13 M-parameter MLP and times both backends to 95 % accuracy.
MODEL    ?= small
# demo, bench-allreduce: INA=1 sends the switch's calls through torch.distributed's
# ina backend (dist.all_reduce, DDP with no hook) instead of the session's API.
INA      ?=
# bench-allreduce, bench-scaling: what the calls sum (recorded DDP gradients, normal, integers).
DATA     ?= recorded
# bench-scaling: the worker counts and the links' rate (Mbit/s).
SCALE_N  ?= 2,4,8,12,16
SCALE_BW ?= 50
# demo: CHAOS=1 trains through the job manager while the switch is killed and
# restarted, then the job's lease revoked: per step the path taken (experiments/chaos.py).
CHAOS    ?=
# demo: PROFILE=DIR writes torch.profiler traces of 2 steps per worker and backend, and a
# picture of worker 0's switch calls (docs/observability.md).
PROFILE  ?=
# demo: BUSY=N trains both backends beside N processes spinning a core each (a busy host).
BUSY     ?= 0
# demo: RUNS=R trains both backends R times on the same hosts (every other run gloo first);
# BW=MBIT sets the links' rate (0: unshaped) instead of the model's own.
RUNS     ?= 1
BW       ?=
# loss-experiment: the switches whose ports drop (all, or e.g. spine, leaf0).
LOSS_AT  ?= all
# straggler-experiment: the ina+deadline runs' deadline in ms (empty: a quarter of the
# measured median step; 0: none of those runs).
DEADLINE ?=
# straggler-experiment, sharing-experiment: seeds, each running every scenario and mode, or
# both policies (empty: the default, 3).
SEEDS    ?=
PYTEST   ?= $(PY) -m pytest
# gcc + libc6-dev: the softswitch compiles programs to C (its native backend).
# python3-venv, ca-certificates: a minimal Debian has neither venv nor pip's TLS roots.
# procps: sysctl inside the test namespaces. openssl: the TLS tests and `--tls` make certificates.
# prometheus: the metrics tests scrape the switch and the manager with a real server.
APT_PACKAGES := iproute2 ethtool mininet bridge-utils iputils-ping gcc libc6-dev \
                python3-venv ca-certificates procps openssl prometheus
# The CPU wheel on disk; an unpinned torch pulls a multi-GB CUDA build. Pinned here,
# for this venv only: the package itself asks for torch>=2.1 and only in [torch].
TORCH    ?= torch==2.13.0

.PHONY: setup apt-deps test test-bmv2 test-pythons p4 p4-tofino p4-test-programs bench bench-switch \
        bench-worker bench-backend bench-observe bench-cores bench-allreduce bench-scaling bench-exponents bench-demo record-gradients demo testbed loss-experiment straggler-experiment sharing-experiment fuzz clean \
        p4c-samples docs

setup: apt-deps $(VENV)/.installed

# Debian packages for namespaces, veth offload control and Mininet.
apt-deps:
	@missing=""; for p in $(APT_PACKAGES); do \
	    dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends $$missing; fi

# A venv whose creation or install failed is removed whole, so the next run starts clean.
$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q $(TORCH) \
	    && $(PY) -m pip install -q -e '.[test,docs]' \
	    || { rm -rf $(VENV); echo "make setup: could not build $(VENV) (see above)" >&2; exit 1; }
	touch $@

test: setup
	$(PYTEST) -q -rs

# The library's unit tests (in process: no namespaces, no switch process) on each
# Python it supports, each in a venv of its own without torch (the core needs numpy
# only; tests that need torch skip). An interpreter not on PATH is reported, not run.
PYTHONS    ?= python3.11 python3.12 python3.13
UNIT_TESTS := tests/test_protocol.py tests/switch_ctl/test_config.py tests/switch_ctl/test_tree_config.py \
              tests/worker/test_quantize.py tests/worker/test_session.py \
              tests/softswitch/test_primitives.py tests/softswitch/test_backends_agree.py \
              tests/softswitch/test_p4runtime.py tests/softswitch/test_p4c_constructs.py
test-pythons:
	@for py in $(PYTHONS); do \
	    if ! $$py --version >/dev/null 2>&1; then echo "== $$py: not installed, skipped"; continue; fi; \
	    venv=.venv-$$(basename $$py); echo "== $$py ($$($$py --version))"; \
	    { [ -x $$venv/bin/python ] || $$py -m venv $$venv; } \
	    && $$venv/bin/python -m pip install -q -e '.[controller,softswitch]' scapy tomli-w pytest pytest-timeout \
	    && $$venv/bin/python -m pytest -q -p no:cacheprovider $(UNIT_TESTS) -k "not bmv2" \
	    || exit 1; \
	done

# The documentation site into site/, every link and anchor checked (--strict); the
# tables, plots and the README's figure come from docs/results/ (tools/render_results.py).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d site

# The packet tests on real BMv2 alone.
test-bmv2: setup
	AGG_SWITCH=bmv2 $(PYTEST) -q -rs -m bmv2 tests/dataplane

# Compile the P4 program (needs p4c; see docs/p4/index.md). The output is committed: the software
# targets' program, 256 values (1 KiB) per packet, in $(P4BUILD), the 64-value one
# (Tofino's size) in $(P4BUILD)/k64, and the 1024-value one (4 KiB, a jumbo MTU) in
# $(P4BUILD)/k1024. docs/p4/index.md, "Packet size", says why.
V1MODEL_SOURCES := 'innet_aggregation/p4src/shared/*.p4' 'innet_aggregation/p4src/v1model/*.p4' 'innet_aggregation/p4src/v1model/control/*.p4'
p4: setup
	$(PY) tools/p4build.py innet_aggregation/p4src/v1model/aggregation.p4 --p4c $(P4C) --out $(P4BUILD) \
	    -D VALUES_PER_PACKET=256 --sources $(V1MODEL_SOURCES)
	$(PY) tools/p4build.py innet_aggregation/p4src/v1model/aggregation.p4 --p4c $(P4C) --out $(P4BUILD)/k64 \
	    -D VALUES_PER_PACKET=64 --sources $(V1MODEL_SOURCES)
	$(PY) tools/p4build.py innet_aggregation/p4src/v1model/aggregation.p4 --p4c $(P4C) --out $(P4BUILD)/k1024 \
	    -D VALUES_PER_PACKET=1024 --sources $(V1MODEL_SOURCES)

# Compile the TNA program for Tofino 1 with bf-p4c. Committed: the P4Info, our resource
# summary and the manifest; the compiler's output stays in innet_aggregation/p4src/tna/build/bf-p4c.
p4-tofino: setup
	$(PY) tools/p4build.py innet_aggregation/p4src/tna/aggregation.p4 --target tofino --p4c $(BF_P4C) \
	    --out innet_aggregation/p4src/tna/build \
	    --sources 'innet_aggregation/p4src/shared/*.p4' 'innet_aggregation/p4src/tna/*.p4' 'innet_aggregation/p4src/tna/control/*.p4'

# Compile the softswitch's small per-primitive test programs.
p4-test-programs: setup
	for f in tests/softswitch/programs/*.p4; do \
	    $(PY) tools/p4build.py --p4c $(P4C) --out tests/softswitch/programs/build $$f || exit 1; \
	done

# p4c's own v1model samples (their .stf files) on BMv2 and both softswitch backends, over
# P4Runtime and veth (root; not part of `make test`): P4C_SAMPLES is p4c's
# testdata/p4_16_samples, read in place. CSV in results/stf.csv, summary on stdout.
# No default: where p4c's sources are is the machine's business.
p4c-samples: setup
	@test -n "$(P4C_SAMPLES)" || { echo "make p4c-samples: set P4C_SAMPLES to p4c's testdata/p4_16_samples" >&2; exit 2; }
	$(PY) tools/stf_samples.py --samples $(P4C_SAMPLES) --out results/stf.csv

# Hostile frames (10^5 and more) at the native softswitch, alone and while every
# worker aggregates; prints frames, counters and time (tests/worker/fuzz.py).
fuzz: setup
	$(PY) -m tests.worker.fuzz --frames 120000

bench: bench-switch bench-worker bench-backend bench-allreduce bench-scaling bench-exponents bench-demo

# bench-switch: LANES=1,2,4 times the native backend on each lane count (one a port at
# most: N=8 gives 8 workers, a port each).
LANES    ?=
bench-switch: setup
	$(PY) benchmarks/bench_switch.py --workers $(N) $(if $(LANES),--lanes $(LANES))

# On a many-core host (under 7 minutes on 16 CPUs): the switch's lanes against the
# ceiling, then the switch path and gloo's ring on unshaped links with 4 lanes
# (docs/experiments.md, "More cores").
bench-cores: setup
	$(PY) benchmarks/bench_switch.py --sizes 1024 --targets ceiling ceiling-linear --lanes 1,2,4,8 --workers 8 --repeats 5
	$(PY) -m innet_aggregation.experiments.baseline --workers 4,8 --bw 0 --values 1024 \
	    --io-threads 4 --min-timed-s 3 --out results/cores

bench-worker: setup
	$(PY) benchmarks/bench_worker.py

bench-backend: setup
	$(PY) benchmarks/bench_backend.py

# What INA_DEBUG=INFO and a rank's metrics cost a 1 MiB call (goal: within 3 %); BEFORE=DIR
# adds a checkout without the breakdown as a third condition.
BEFORE   ?=
bench-observe: setup
	$(PY) benchmarks/bench_observe.py $(if $(BEFORE),--before $(BEFORE))

bench-exponents: setup
	$(PY) -m benchmarks.bench_exponents

bench-allreduce: setup
	$(PY) -m innet_aggregation.experiments.baseline $(TOPOLOGY) --data $(DATA) $(if $(INA),--ina)

bench-scaling: setup
	$(PY) -m innet_aggregation.experiments.scaling --workers $(SCALE_N) --bw $(SCALE_BW) --data $(DATA)

# DDP gradients of the demo's large MLP and a small CNN (digits, 4 ranks, 300 steps),
# a sample of them in a committed file of about 2.5 MB that bench-allreduce replays.
record-gradients: setup
	$(PY) -m innet_aggregation.testbed.gradients

demo: setup
	$(PY) -m innet_aggregation.experiments.demo --workers $(N) --model $(MODEL) $(TOPOLOGY) $(if $(INA),--ina) $(if $(CHAOS),--chaos) --busy $(BUSY) --runs $(RUNS) $(if $(BW),--bw $(BW)) $(if $(PROFILE),--profile $(PROFILE))

# The demo judged over runs: 5 on the model's links, 5 beside one busy core, 5 unshaped.
bench-demo: setup
	$(PY) -m innet_aggregation.experiments.demo --workers $(N) --model $(MODEL) $(TOPOLOGY) --runs 5
	$(PY) -m innet_aggregation.experiments.demo --workers $(N) --model $(MODEL) $(TOPOLOGY) --runs 5 --busy 1
	$(PY) -m innet_aggregation.experiments.demo --workers $(N) --model $(MODEL) $(TOPOLOGY) --runs 5 --bw 0

testbed: setup
	$(PY) -m innet_aggregation.testbed.topology --workers $(N) $(TOPOLOGY)

loss-experiment: setup
	$(PY) -m innet_aggregation.experiments.loss $(TOPOLOGY) --loss-at $(LOSS_AT)

# The large demo model on N workers at 100 Mbit/s: one rank sleeping 5 median steps in a
# fifth of its steps, then 1 % loss on its link; time to 95 % accuracy and step time
# percentiles through the switch without and with a deadline and through gloo.
straggler-experiment: setup
	$(PY) -m innet_aggregation.experiments.straggler --workers $(N) $(if $(DEADLINE),--deadline-ms $(DEADLINE)) \
	    $(if $(SEEDS),--seeds $(SEEDS))

# 6 jobs of 4 ranks (2 high priority) on a pool that fits 2, arrivals spread over time:
# job completion times with priorities and preemption against first come first served.
sharing-experiment: setup
	$(PY) -m innet_aggregation.experiments.sharing $(if $(SEEDS),--seeds $(SEEDS))

clean:
	rm -rf $(VENV) .venv-python3.* results .pytest_cache site
