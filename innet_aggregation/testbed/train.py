"""The program each testbed host runs: allreduce and DDP training on command.

    python -m innet_aggregation.testbed.train --config job.toml --worker-id 0 --world 4 --master 10.0.0.1:29500

Started once per host by ``testbed.agents``; reads one JSON command per line on
stdin and answers one JSON line on stdout (see testbed/agents.py):

    {"op": "allreduce", "backend": "switch"|"ina"|"gloo", "size": 10000, "reps": 3,
     "seed": 0, "barrier": true, "data": "recorded"|"normal"|"integers", "first_call": 0}
    {"op": "bulk", "bytes": 1048576, "reps": 15, "port": 5201}
    {"op": "train", "backend": "switch"|"ina"|"gloo", "epochs": 5, "batch": 32, "lr": 0.05,
     "hidden": [32], "accuracy": 0.95, "eval_every": 5, "steps": 200, "curve": false,
     "straggler": {"rank": 3, "ms": 2000, "p": 0.2, "seed": 0}}
    {"op": "quit"}

"switch" calls the session (and DDP's switch hook) directly; "ina" goes through
torch.distributed on an ``ina`` process group of the same session, as a user's
script would (``dist.all_reduce``, and DDP with its default allreduce), so the two
measure what the backend adds.

Allreduce inputs (``data``) are recorded DDP gradients (testbed.gradients; call
``first_call + rep`` replays the next step, as a training run's calls would),
normal floats, or integer-valued float32, all drawn from (seed, rep, rank), so
every worker can compute the sum of all workers' inputs and check the result
(``exact``: equal for integers, else within the block floating point bound, which
also covers gloo's float32 sums) and report a digest of it (compared across runs
for bit-identity). ``bulk`` times a TCP transfer from worker 0 to worker 1 over the
same links (experiments.link_model: the capacity they deliver).
With ``barrier``, each timed call starts after a barrier, and the checks after it
wait at a second one, so that no worker's checking runs beside another's call on
the cores they share. Bytes sent and TCP retransmissions are read from this host's
own /proc/net, so both
backends are measured the same way, at the wire. Training with an ``accuracy`` also
measures the time to reach it: every ``eval_every`` steps worker 0 scores the held-out
digits and tells the others, while every worker's clock stops, so evaluation costs
both backends nothing and the time is training's alone. With ``curve``, every rank
instead scores its own model (all ranks hold the same bits) every ``eval_every``
steps to the end, its clock stopped only while it scores, so no rank waits for
another at a check: the accuracy against each rank's training time. ``steps`` ends
the run after that many steps; ``straggler`` makes one rank sleep ``ms`` before its
allreduce (in DDP's first comm hook call of the step) in the steps a generator
seeded with ``seed`` draws with probability ``p``: the same steps in every run of
the same length. A bounded-time aggregation deadline, where there is one, is the
job file's (``[job] deadline_ms``, testbed.layout): the switch's and every session's.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from innet_aggregation.switch_ctl import jobfile
from innet_aggregation.worker.breakdown import since

from .model import accuracy_of, mlp

BENCH_CALL = "bench"  # the name of the benchmark's calls through the session
INPUT_RANGE = 1000  # |input| <= 1000: exact in float32 and in the switch's fixed point
# A result is right when every element is within n * 2**(E - TOLERANCE_BITS) of the
# float64 sum, E its block's largest exponent over the workers: for n <= 32 the
# switch's bound is n * 2**(E - 20) (quantize: S <= E + SLACK, b >= 26), gloo's float32
# sums' n * 2**(E - 19); a lost or doubled contribution is off by about 2**(E - 1).
TOLERANCE_BITS = 18


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def progress(text: str) -> None:
    send({"progress": text})


def interface_counters() -> dict[str, int]:
    """tx bytes/packets of this namespace's non-loopback interfaces and TCP retransmits."""
    tx_bytes = tx_packets = 0
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, data = line.split(":", 1)
            if name.strip() != "lo":
                fields = data.split()
                tx_bytes += int(fields[8])
                tx_packets += int(fields[9])
    with open("/proc/net/snmp") as f:
        tcp = [line.split() for line in f if line.startswith("Tcp:")]
    retrans = int(tcp[1][tcp[0].index("RetransSegs")])
    return {"tx_bytes": tx_bytes, "tx_packets": tx_packets, "tcp_retrans": retrans}


def counter_delta(before: dict[str, int]) -> dict[str, int]:
    after = interface_counters()
    return {k: after[k] - before[k] for k in before}


def within_bound(result: torch.Tensor, inputs: list[torch.Tensor], values: int) -> bool:
    """Every element of ``result`` within n * 2**(E - TOLERANCE_BITS) of the float64
    sum of ``inputs``, E its block's (``values`` a block) largest exponent over them."""
    from innet_aggregation.worker.quantize import block_exponents
    pad = -result.numel() % values

    def blocks(t: torch.Tensor) -> np.ndarray:
        return np.pad(t.numpy(), (0, pad)).reshape(-1, values)
    top = np.max([block_exponents(blocks(x)) for x in inputs], axis=0)
    tol = len(inputs) * np.exp2(top.astype(np.float64) - TOLERANCE_BITS)
    expected = sum(x.double() for x in inputs)
    return bool((np.abs(blocks(result.double()) - blocks(expected)) <= tol[:, None]).all())


class Host:
    """This host's worker: the switch session and (optionally) the gloo process group."""

    def __init__(self, config_path: str, worker_id: int, world: int, master: str | None):
        self.config = jobfile.load(config_path)
        self.rank = worker_id
        self.world = world
        from innet_aggregation.worker import AggregationSession
        self.session = AggregationSession.from_config(self.config, worker_id)
        self._ina = None
        self._recorded = None
        if master:
            dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=worker_id,
                                    world_size=world, timeout=timedelta(minutes=5))

    def ina_group(self):
        """A torch.distributed ``ina`` group on this host's session, made on first use
        (beside the gloo default group, which the agents' rendezvous needs)."""
        if self._ina is None:
            if not dist.is_initialized():
                raise ValueError("the ina backend needs the gloo process group: start "
                                 "without --no-gloo")
            from innet_aggregation.worker.backend import InaOptions
            self._ina = dist.new_group(backend="ina", pg_options=InaOptions(self.session))
        return self._ina

    def barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def inputs(self, size: int, seed: int, rep: int, rank: int, data: str = "integers",
               call: int = 0) -> torch.Tensor:
        if data == "recorded":
            if self._recorded is None:
                from .gradients import load
                self._recorded = load()
            from .gradients import replay
            return torch.from_numpy(replay(self._recorded, size, call, rank))
        gen = torch.Generator().manual_seed(seed * 1_000_003 + rep * 1009 + rank)
        if data == "normal":
            return torch.randn(size, generator=gen)
        if data == "integers":
            return torch.randint(-INPUT_RANGE, INPUT_RANGE + 1, (size,), generator=gen).float()
        raise ValueError(f"data must be recorded, normal or integers, not {data!r}")

    def correct(self, result: torch.Tensor, inputs: list[torch.Tensor], data: str) -> bool:
        """Equal to the float64 sum for integers; else within the bound (``within_bound``)."""
        if data == "integers":
            return bool(torch.equal(result.double(), sum(x.double() for x in inputs)))
        return within_bound(result, inputs, self.session.fmt.values_per_packet)

    def switch_allreduce(self, tensor: torch.Tensor, ina: bool) -> tuple[torch.Tensor, dict]:
        """Through the session, or through torch.distributed on its ``ina`` group: the
        session's counters of the call either way."""
        if ina:
            dist.all_reduce(tensor, group=self.ina_group())
        else:
            # Named: the benchmark's calls are one bucket's, step after step. Unnamed,
            # a run of equal sizes is taken for a step's buckets, each its own place.
            self.session.allreduce(tensor, name=BENCH_CALL)
        counters = self.session.last_call.counters
        return tensor, {"retransmissions": counters.retransmissions,
                        "packets": counters.packets_sent, "redone": counters.redone,
                        "breakdown": self.session.last_breakdown.as_dict(),
                        **{name: getattr(counters, name) for name in DEADLINE_COUNTERS
                           if hasattr(counters, name)}}

    def allreduce(self, cmd: dict) -> dict:
        size, reps, seed = int(cmd["size"]), int(cmd.get("reps", 1)), int(cmd.get("seed", 0))
        backend, data = cmd["backend"], cmd.get("data", "integers")
        out = {"times": [], "cpu": [], "exact": [], "digests": [], "tx_bytes": [],
               "tcp_retrans": []}
        for rep in range(reps):
            call = int(cmd.get("first_call", 0)) + rep
            inputs = [self.inputs(size, seed, rep, r, data, call) for r in range(self.world)]
            tensor = inputs[self.rank].clone()
            if cmd.get("barrier", True):
                self.barrier()
            before = interface_counters()
            start, cpu = time.perf_counter(), time.process_time()
            if backend in ("switch", "ina"):
                result, stats = self.switch_allreduce(tensor, ina=backend == "ina")
            elif backend == "gloo":
                dist.all_reduce(tensor)
                result = tensor
                stats = {"retransmissions": 0, "packets": 0, "redone": 0}
            else:
                raise ValueError(f"unknown backend {backend!r}")
            out["times"].append(time.perf_counter() - start)
            out["cpu"].append(time.process_time() - cpu)      # all of the process's threads
            delta = counter_delta(before)
            if cmd.get("barrier", True):
                # The checks below and the next inputs wait for every worker's call: on
                # the cores the workers share they would slow the calls still running.
                self.barrier()
            result = torch.as_tensor(result)
            out["exact"].append(self.correct(result, inputs, data))
            out["digests"].append(hashlib.sha256(result.numpy().tobytes()).hexdigest()[:16])
            for name, value in stats.items():      # and the deadline's, where counted
                out.setdefault(name, []).append(value)
            out["tx_bytes"].append(delta["tx_bytes"])
            out["tcp_retrans"].append(delta["tcp_retrans"])
        return out

    def bulk(self, cmd: dict) -> dict:
        """Worker 0 sends ``bytes`` over TCP to worker 1, ``reps`` times, each after a
        barrier (the pause a timed call has): worker 0 reports its frames' bytes on the
        wire, worker 1 the time from its first read to its last and the first read's
        size. The others only join the barriers."""
        import socket
        size, reps, port = int(cmd["bytes"]), int(cmd.get("reps", 1)), int(cmd["port"])
        out = {"tx_bytes": [], "seconds": [], "first_chunk": [], "bytes": size}
        listener = conn = None
        if self.rank == 1:
            listener = socket.create_server(("", port))
        self.barrier()
        try:
            if self.rank == 0:
                conn = socket.create_connection(("10.0.0.2", port), timeout=60)
            elif self.rank == 1:
                listener.settimeout(60)
                conn, _ = listener.accept()
            payload = bytes(size)
            # Reads far smaller than the transfer: on unshaped links all of it can be
            # there before the first read, which must still leave some to time.
            buffer = bytearray(min(1 << 16, max(1, size // 16)))
            for _ in range(reps):
                self.barrier()
                if self.rank == 0:
                    before = interface_counters()
                    conn.sendall(payload)
                    conn.recv(1)                    # every byte arrived
                    out["tx_bytes"].append(counter_delta(before)["tx_bytes"])
                elif self.rank == 1:
                    got = conn.recv_into(buffer)
                    start, first = time.perf_counter(), got
                    while got < size:
                        got += conn.recv_into(buffer, min(len(buffer), size - got))
                    out["seconds"].append(time.perf_counter() - start)
                    out["first_chunk"].append(first)
                    conn.sendall(b"k")
        finally:
            for s in (conn, listener):
                if s is not None:
                    s.close()
        self.barrier()
        return out

    def train(self, cmd: dict) -> dict:
        from sklearn.datasets import load_digits
        from torch.nn.parallel import DistributedDataParallel as DDP

        backend, epochs = cmd["backend"], int(cmd.get("epochs", 5))
        batch, seed = int(cmd.get("batch", 32)), int(cmd.get("seed", 0))
        x, y = load_digits(return_X_y=True)
        order = np.random.default_rng(seed).permutation(len(x))
        x = torch.tensor(x[order] / 16.0, dtype=torch.float32)
        y = torch.tensor(y[order], dtype=torch.long)
        n_test = len(x) // 5
        x_test, y_test, x_train, y_train = x[:n_test], y[:n_test], x[n_test:], y[n_test:]
        x_train, y_train = x_train[self.rank::self.world], y_train[self.rank::self.world]

        torch.manual_seed(seed)
        model = mlp([int(h) for h in cmd.get("hidden", [32])])
        group = self.ina_group() if backend == "ina" else None
        ddp = DDP(model, process_group=group)
        # Every backend goes through a comm hook, timed the same way: gloo's and ina's
        # is the allreduce DDP runs by default, on their process group.
        hook_times: list[float] = []
        delay = _Delay()
        if backend == "switch":
            from innet_aggregation.worker.ddp_hook import SwitchHookState, switch_allreduce_hook
            ddp.register_comm_hook(SwitchHookState(self.session),
                                   _delayed(_timed(switch_allreduce_hook, hook_times), delay))
        elif backend in ("gloo", "ina"):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
            ddp.register_comm_hook(group, _delayed(_timed(allreduce_hook, hook_times), delay))
        else:
            raise ValueError(f"unknown backend {backend!r}")
        optimizer = torch.optim.Adam(ddp.parameters(), lr=float(cmd.get("lr", 0.01)))
        loss_fn = torch.nn.CrossEntropyLoss()
        steps_per_epoch = min(len(x_train) // batch, *self._all_ranks_min(len(x_train) // batch))
        total_steps = min(epochs * steps_per_epoch, int(cmd.get("steps") or epochs * steps_per_epoch))
        sleeps = straggler_sleeps(cmd.get("straggler"), self.rank, total_steps)
        target = cmd.get("accuracy")
        eval_every = int(cmd.get("eval_every", 5))
        curve_mode = bool(cmd.get("curve"))
        reached = {"target_steps": None, "time_to_target_s": None}
        curve: list[tuple[int, float, float]] = []
        stats_before, warmup = self.session.stats, None
        timed_from, profiling = self.session.breakdown_total, None
        self.barrier()
        cpu_before = time.process_time()
        before = interface_counters()
        step_times = []
        started, paused = time.perf_counter(), 0.0
        for epoch in range(epochs):
            if len(step_times) == total_steps:
                break
            perm = torch.randperm(len(x_train), generator=torch.Generator().manual_seed(epoch))
            total, ran = 0.0, min(steps_per_epoch, total_steps - len(step_times))
            for step in range(ran):
                idx = perm[step * batch:(step + 1) * batch]
                delay.seconds = sleeps[len(step_times)]
                start = time.perf_counter()
                loss = loss_fn(ddp(x_train[idx]), y_train[idx])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step_times.append(time.perf_counter() - start)
                if cmd.get("profile"):
                    profiling = _profile(profiling, len(step_times), cmd["profile"],
                                         f"{backend}-rank{self.rank}.json")
                if len(step_times) == WARMUP_STEPS:
                    warmup = self.session.stats - stats_before
                    timed_from = self.session.breakdown_total
                total += loss.item()
                done = len(step_times)
                if curve_mode and (done % eval_every == 0 or done == total_steps):
                    stop = time.perf_counter()
                    score = accuracy_of(model, x_test, y_test)
                    curve.append((done, stop - started - paused, score))
                    if target is not None and reached["target_steps"] is None and score >= target:
                        reached = {"target_steps": done, "time_to_target_s": curve[-1][1]}
                        if self.rank == 0:
                            progress(f"{backend}: test accuracy {score:.3f} after {done} "
                                     f"steps, {curve[-1][1]:.1f} s on rank 0's clock")
                    paused += time.perf_counter() - stop
                elif (target is not None and reached["target_steps"] is None
                        and done % eval_every == 0):
                    stop = time.perf_counter()
                    score = self._rank0_accuracy(model, x_test, y_test)
                    if score >= target:
                        reached = {"target_steps": done,
                                   "time_to_target_s": stop - started - paused}
                        if self.rank == 0:
                            progress(f"{backend}: test accuracy {score:.3f} after "
                                     f"{done} steps, {reached['time_to_target_s']:.1f} s")
                    paused += time.perf_counter() - stop
            if self.rank == 0:
                progress(f"{backend}: epoch {epoch + 1}/{epochs}  loss {total / ran:.3f}"
                         f"  {1000 * np.mean(step_times[-ran:]):.0f} ms/step")
        if profiling is not None:       # a run shorter than the profiled steps
            _profile(profiling, WARMUP_STEPS + PROFILED_STEPS, cmd["profile"],
                     f"{backend}-rank{self.rank}.json")
        cpu = time.process_time() - cpu_before
        delta = counter_delta(before)
        accuracy = accuracy_of(model, x_test, y_test)
        out = {"accuracy": accuracy, "steps": len(step_times), **reached,
               "step_time_ms": 1000 * float(np.median(step_times)),
               "step_min_ms": 1000 * min(step_times), "step_max_ms": 1000 * max(step_times),
               "allreduce_ms": 1000 * float(np.median(hook_times)),
               "cpu_ms_per_step": 1000 * cpu / len(step_times),
               "tx_bytes": delta["tx_bytes"], "tcp_retrans": delta["tcp_retrans"],
               **_aggregation_packets(self.session.stats - stats_before),
               **({"warmup_steps": WARMUP_STEPS, "warmup_redone": warmup.redone,
                   "warmup_packets": warmup.packets_sent} if warmup is not None else {}),
               "parameters": sum(p.numel() for p in model.parameters()),
               # The switch path's mean call after the warm-up: where its time went.
               "breakdown": (since(self.session.breakdown_total, timed_from).as_dict()
                             if backend == "switch" else None)}
        if curve_mode:
            out.update(step_times_ms=[round(1000 * t, 3) for t in step_times],
                       slept_steps=[i for i, s in enumerate(sleeps) if s], curve=curve)
        return out

    def _rank0_accuracy(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
        """Worker 0's test accuracy, on every worker: the models are identical, and
        one score decides for all when to stop measuring."""
        score = torch.tensor([accuracy_of(model, x, y) if self.rank == 0 else 0.0],
                             dtype=torch.float64)
        dist.broadcast(score, src=0)
        return float(score)

    def _all_ranks_min(self, value: int) -> list[int]:
        """Every rank must take the same number of steps, or DDP waits for ever."""
        t = torch.tensor([value])
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return [int(t)]


PROFILED_STEPS = 2


def _profile(profiling, done: int, folder: str, name: str):
    """torch.profiler over the PROFILED_STEPS steps after the warm-up, every thread
    (the session's calls run on its own), written as Chrome JSON to folder/name."""
    from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile

    if done == WARMUP_STEPS:
        profiling = profile(activities=[ProfilerActivity.CPU],
                            experimental_config=_ExperimentalConfig(profile_all_threads=True))
        profiling.__enter__()
    elif profiling is not None and done == WARMUP_STEPS + PROFILED_STEPS:
        profiling.__exit__(None, None, None)
        profiling.export_chrome_trace(str(Path(folder) / name))
        profiling = None
    return profiling


def _timed(hook, times: list[float]):
    """``hook``, recording how long each bucket takes from the call to its result."""
    def timed(state, bucket):
        start = time.perf_counter()

        def done(future):
            times.append(time.perf_counter() - start)
            return future.value()
        return hook(state, bucket).then(done)
    return timed


# The steps whose calls are new to the session, counted apart: the first probes every
# block (no history), and in the second DDP rebuilds its buckets, new calls again.
WARMUP_STEPS = 2

# Bounded-time aggregation's counters (transport.Stats), where the worker has them.
DEADLINE_COUNTERS = ("released", "late", "carried_values")


def _aggregation_packets(stats) -> dict[str, int]:
    """What a training run's switch traffic was made of, and what a deadline released."""
    return {"retransmissions": stats.retransmissions, "redone": stats.redone,
            "aggregation_packets": stats.packets_sent, "results_received": stats.results_received,
            **{name: getattr(stats, name) for name in DEADLINE_COUNTERS if hasattr(stats, name)}}


class _Delay:
    """Seconds the next comm hook call sleeps before its allreduce."""
    seconds = 0.0


def _delayed(hook, delay: _Delay):
    """``hook``, first sleeping ``delay.seconds`` (once: the step's first bucket)."""
    def delayed(state, bucket):
        if delay.seconds:
            seconds, delay.seconds = delay.seconds, 0.0
            time.sleep(seconds)
        return hook(state, bucket)
    return delayed


def straggler_sleeps(straggler: dict | None, rank: int, steps: int) -> list[float]:
    """Seconds this rank sleeps before each step's allreduce: ``straggler["ms"]`` in the
    steps a generator seeded with ``straggler["seed"]`` draws with probability
    ``straggler["p"]`` if this is ``straggler["rank"]``, else none."""
    if not straggler or straggler["rank"] != rank:
        return [0.0] * steps
    draws = np.random.default_rng(int(straggler["seed"])).random(steps) < float(straggler["p"])
    return [float(straggler["ms"]) / 1000 if d else 0.0 for d in draws]


def serve(host: Host, lines) -> None:
    for line in lines:
        cmd = json.loads(line)
        op = cmd.get("op")
        if op == "quit":
            return
        try:
            if op == "ready":
                send({"ready": True, "rank": host.rank})
            elif op == "allreduce":
                send(host.allreduce(cmd))
            elif op == "train":
                send(host.train(cmd))
            elif op == "bulk":
                send(host.bulk(cmd))
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:
            traceback.print_exc()
            send({"error": f"{type(exc).__name__}: {exc}"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the job's TOML configuration")
    parser.add_argument("--worker-id", type=int, required=True, help="also the gloo rank")
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--master", help="host:port of rank 0's gloo store")
    parser.add_argument("--no-gloo", action="store_true", help="no gloo process group")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        host = Host(args.config, args.worker_id, args.world,
                    None if args.no_gloo else args.master)
    except Exception as exc:
        traceback.print_exc()
        send({"error": f"start-up failed: {type(exc).__name__}: {exc}"})
        return 1
    serve(host, sys.stdin)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
