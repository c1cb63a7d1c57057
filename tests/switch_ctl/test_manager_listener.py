"""The job manager's listener under abuse, against a real manager process
(``switch_ctl serve``) and a real switch: slow clients are cut at the request
deadline, the caps turn away what is over them with one line, running out of file
descriptors does not end the listener, and a flood of idle and slow-loris clients
costs no running job its lease or a call its exact sum.

The loopback tests run a manager on 127.0.0.1 (plaintext: loopback needs no
certificate) in front of an embedded switch without ports, which takes a job's
entries all the same; the flood test runs the namespace testbed of
manager_harness.py (root), ranks doing calls through the switch.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import tomli_w

from innet_aggregation.switch_ctl.manager.wire import encode, job_key
from innet_aggregation.testbed.targets import SwitchProcess, free_tcp_port, unavailable

from .manager_harness import LEASE, REPO, ManagerBed, credential_of, env, until
from .test_manager import finished, joined

SECRET = "s3cret-for-the-listener-tests"
HOSTS = [("10.0.0.1", "02:00:00:00:00:01"), ("10.0.0.2", "02:00:00:00:00:02")]


def register(job: str, rank: int = 0, world: int = 1) -> dict:
    ip, mac = HOSTS[rank]
    return {"op": "register", "job": job, "rank": rank, "world": world, "udp_port": 40000,
            "interfaces": [{"ifname": "eth0", "ip": ip, "mac": mac}],
            "credential": credential_of(job), "token": f"{rank:032x}"}


def close(job: str, rank: int) -> dict:
    return {"op": "close", "job": job_key(job, credential_of(job)), "rank": rank,
            "token": f"{rank:032x}"}


class LoopbackManager:
    """A manager process listening on ``host`` (reached at 127.0.0.1) and its own
    port-less switch; ``nofile`` lowers its RLIMIT_NOFILE (soft and hard). Its hosts
    are names only (no host is behind the switch): no port proof."""

    def __init__(self, workdir: Path, settings: dict, nofile: int | None = None,
                 host: str = "127.0.0.1"):
        self.workdir = workdir
        self.switch = SwitchProcess("softswitch", {}, log_path=workdir / "switch.log").start(60)
        self.port = free_tcp_port()
        config = {"manager": {"listen": f"{host}:{self.port}", "secret": SECRET,
                              "database": str(workdir / "manager.db"), "default_slots": 16,
                              "prove_ports": False, **settings},
                  "switch": {"grpc_addr": self.switch.grpc_addr, "ports": [1, 2]},
                  "pool": {"slots": [0, 31], "services": [{"ip": "10.0.0.250",
                                                          "mac": "02:00:00:00:00:fa"}]},
                  "fabric": {"hosts": [{"mac": mac, "switch_port": n + 1}
                                       for n, (_, mac) in enumerate(HOSTS)]}}
        (workdir / "manager.toml").write_text(tomli_w.dumps(config))
        self.log_path = workdir / "manager.log"

        def limit():
            if nofile is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "innet_aggregation.switch_ctl", "serve", "--config",
                 str(workdir / "manager.toml")], stdout=log, stderr=subprocess.STDOUT,
                env=env(), cwd=REPO, start_new_session=True, preexec_fn=limit)
        until(lambda: "job manager listening" in self.log() or self.process.poll() is not None,
              60, "the manager listens")
        assert self.process.poll() is None, self.log()

    def log(self) -> str:
        return self.log_path.read_text()

    def connect(self, source: str = "127.0.0.1", timeout: float = 10) -> socket.socket:
        sock = socket.socket()
        sock.bind((source, 0))
        sock.settimeout(timeout)
        sock.connect(("127.0.0.1", self.port))
        return sock

    def ask(self, message: dict, source: str = "127.0.0.1") -> dict:
        with self.connect(source) as sock:
            sock.sendall(encode(message if message["op"] in ("renew", "close")
                                else {**message, "secret": SECRET}))
            return json.loads(sock.makefile("rb").readline())

    def settle(self, message: dict, source: str = "127.0.0.1") -> dict:
        """A registration's last answer: past its progress lines (waiting for ranks, or
        for the sweeper to install the job)."""
        with self.connect(source) as sock:
            sock.sendall(encode({**message, "secret": SECRET}))
            reader = sock.makefile("rb")
            while (answer := json.loads(reader.readline()))["status"] == "waiting":
                pass
            return answer

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.switch.stop()


@pytest.fixture
def manager(tmp_path):
    """``manager(nofile=None, host=..., **settings)``: a LoopbackManager, stopped after
    the test."""
    reason = unavailable("softswitch")
    if reason:
        pytest.skip(reason)
    started = []

    def start(nofile: int | None = None, host: str = "127.0.0.1",
              **settings) -> LoopbackManager:
        workdir = tmp_path / f"manager{len(started)}"
        workdir.mkdir()
        started.append(LoopbackManager(workdir, settings, nofile, host))
        return started[-1]

    yield start
    for m in started:
        m.stop()


def answer_of(sock: socket.socket) -> dict:
    return json.loads(sock.makefile("rb").readline())


def test_plaintext_off_loopback_starts_only_when_insecure_and_then_warns(manager):
    m = manager(host="0.0.0.0", insecure=True)
    assert ("WARNING the listener on 0.0.0.0 takes the secret in plaintext from the network "
            "(manager.insecure = true)") in m.log()
    assert m.ask({"op": "jobs"})["status"] == "ok"
    config = m.workdir / "manager.toml"
    config.write_text(config.read_text().replace("insecure = true", "insecure = false"))
    refused = subprocess.run([sys.executable, "-m", "innet_aggregation.switch_ctl", "serve",
                              "--config", str(config)], capture_output=True, text=True,
                             timeout=60, env=env(), cwd=REPO)
    assert refused.returncode != 0
    assert (f"manager.listen 0.0.0.0:{m.port} is not a loopback address and the manager has "
            f"no certificate") in refused.stderr, refused.stderr


def test_slow_clients_are_cut_at_the_request_deadline_not_at_each_read(manager):
    m = manager(request_seconds=2)
    line = encode({"op": "jobs", "secret": SECRET})
    started = time.monotonic()
    silent, trickle = m.connect(), m.connect("127.0.0.3")

    def one_byte_a_second():
        for byte in line:
            try:
                trickle.send(bytes([byte]))
            except OSError:
                return
            time.sleep(1.0)

    threading.Thread(target=one_byte_a_second, daemon=True).start()
    assert m.ask({"op": "jobs"})["status"] == "ok"        # meanwhile, a prompt one is served
    assert time.monotonic() - started < 1.0
    for sock in (silent, trickle):
        answer = answer_of(sock)
        cut = time.monotonic() - started
        assert answer == {"status": "busy", "error": "no complete request within 2 s (the "
                                                     "manager's request_seconds)"}
        assert 2.0 <= cut < 2.9, cut
    until(lambda: "cut at request_seconds: 2 connections from 2 addresses (127.0.0.1, "
                  "127.0.0.3)" in m.log(), 3, "the cuts logged")


def test_a_registration_waits_past_the_request_deadline(manager):
    m = manager(request_seconds=1)
    first = m.connect()
    first.sendall(encode({**register("job-w", 0, 2), "secret": SECRET}))
    reader = first.makefile("rb")
    started = time.monotonic()
    for _ in range(3):                              # a progress line a second
        assert json.loads(reader.readline()) == {
            "status": "waiting", "message": "waiting for ranks: 1 of 2 of job job-w registered"}
    assert time.monotonic() - started >= 2.0 * 1
    second = m.settle(register("job-w", 1, 2))
    assert second["status"] == "ready", second
    answer = json.loads(reader.readline())
    while answer["status"] == "waiting":
        answer = json.loads(reader.readline())
    assert answer["status"] == "ready" and answer["config"] == second["config"]
    for rank in (0, 1):
        assert m.ask(close("job-w", rank)) == {"status": "ok"}


def test_hostile_lines_get_one_line_each_and_no_traceback(manager):
    m = manager()
    for line, said in [(b"[" * 100_000 + b"\n", "at most 65536 bytes"),
                       (b"[" * 60_000 + b"\n", "nest more than 16 deep"),
                       (b'{"secret":"x","rank":' + b"9" * 5000 + b"}\n", "a number of 5000"),
                       (b'{"secret":"x","rank":NaN}\n', "NaN is not a number JSON allows"),
                       (b'{"secret":"\xff"}\n', "not UTF-8")]:
        with m.connect() as sock:
            sock.sendall(line)
            answer = answer_of(sock)
        assert answer["status"] == "refused" and said in answer["error"], answer
    assert m.ask({"op": "jobs"})["status"] == "ok"
    assert "Traceback" not in m.log()


def test_the_per_peer_cap_turns_away_one_address_while_another_gets_in(manager):
    m = manager(max_connections_per_peer=4)
    held = [m.connect("127.0.0.1") for _ in range(4)]
    assert answer_of(m.connect("127.0.0.1")) == {
        "status": "busy", "error": "127.0.0.1 has 4 connections still sending their request "
                                   "(the manager's max_connections_per_peer)"}
    assert m.ask({"op": "jobs"}, source="127.0.0.2")["status"] == "ok"
    held[0].close()                                  # one goes: 127.0.0.1 gets one in again
    until(lambda: m.ask({"op": "jobs"}, source="127.0.0.1")["status"] == "ok", 3,
          "a connection from 127.0.0.1 served")
    until(lambda: "max_connections_per_peer: " in m.log(), 3, "the refusal logged")


def test_the_total_cap_makes_room_for_an_address_that_gave_the_secret(manager):
    m = manager(max_connections=8, max_connections_per_peer=4)
    assert m.ask({"op": "jobs"}, source="127.0.0.1")["status"] == "ok"
    time.sleep(0.5)                 # its connection closed and counted out at the manager
    idle = [m.connect(f"127.0.0.{2 + n % 4}") for n in range(8)]
    time.sleep(0.2)
    assert answer_of(m.connect("127.0.0.9")) == {
        "status": "busy", "error": "the manager holds its 8 connections (max_connections)"}
    # 127.0.0.1 presented the secret: the oldest connection without a request makes room.
    assert m.ask({"op": "jobs"}, source="127.0.0.1")["status"] == "ok"
    assert answer_of(idle[0]) == {
        "status": "busy", "error": "the manager holds its 8 connections (max_connections), "
                                   "and this one, without a request yet, made room"}
    for sock in idle[1:]:
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):       # still open, nothing said
            sock.recv(1)


def test_addresses_with_the_secret_filling_the_cap_make_room_for_another(manager):
    """Two addresses that gave the secret hold every connection without a request: a
    third that gave it gets in, and the address holding the most gives up its oldest;
    waiting registrations hold none of the cap."""
    m = manager(max_connections=4, max_connections_per_peer=3)
    for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
        assert m.ask({"op": "jobs"}, source=source)["status"] == "ok"
    waiting = m.connect("127.0.0.4")        # rank 0 of 2: waits for its job, holds no room
    waiting.sendall(encode({**register("job-w", world=2), "secret": SECRET}))
    assert answer_of(waiting)["status"] == "waiting"
    time.sleep(0.5)
    idle = [m.connect(source) for source in ("127.0.0.2", "127.0.0.2", "127.0.0.2",
                                             "127.0.0.3")]
    time.sleep(0.2)
    assert m.ask({"op": "jobs"}, source="127.0.0.4")["status"] == "ok"
    assert answer_of(idle[0]) == {
        "status": "busy", "error": "the manager holds its 4 connections (max_connections), "
                                   "and this one, without a request yet, made room"}
    for sock in idle[1:]:
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):       # still open, nothing said
            sock.recv(1)
    waiting.close()


def test_the_listener_outlives_running_out_of_file_descriptors(manager):
    """Connections never take the descriptors the database, gRPC and the program files
    need (gRPC aborts the process when it cannot make an epoll set: seen here on a busy
    machine, where the manager pushed the program during the flood)."""
    m = manager(nofile=64, request_seconds=60)      # only closing them frees descriptors
    assert ("RLIMIT_NOFILE's hard limit 64 holds fewer than manager.max_connections 512 "
            "connections and max_pending 512 waiting registrations (and 64 other files): the "
            "listener holds at most 32") in m.log()
    flood = []
    for n in range(200):
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((f"127.0.3.{1 + n % 50}", 0))
        sock.connect_ex(("127.0.0.1", m.port))
        flood.append(sock)
    until(lambda: "32 connections hold the descriptors RLIMIT_NOFILE leaves them; pausing "
                  "0.1 s at a time" in m.log(), 10, "the listener full")
    time.sleep(1.0)                                 # several pauses
    assert m.process.poll() is None
    for sock in flood:
        sock.close()
    # The accept loop lives: a job registers, its rank handed the job, and closes it.
    answer = m.settle(register("job-after"))
    assert answer["status"] == "ready", answer
    assert m.ask(close("job-after", 0)) == {"status": "ok"}
    assert "listener: accepting again after" in m.log()
    assert "Traceback" not in m.log()


# -- the flood ----------------------------------------------------------------------------
IDLE, SLOW, FLOOD_ADDRESSES, OPENS_PER_SECOND = 1500, 30, 60, 1000
FLOOD_CAPS = {"max_connections": 256, "max_connections_per_peer": 16, "request_seconds": 3}


class Flood:
    """IDLE connections that never send a byte, half from one address and half from
    FLOOD_ADDRESSES others (each one the manager closes opened again, at most
    OPENS_PER_SECOND), and SLOW clients each from an address of its own that finish
    their TLS handshake and send a request one byte a second, again whenever ended."""

    def __init__(self, host: str, port: int, ca_cert: Path):
        self.address = (host, port)
        self.tls = ssl.create_default_context(cafile=str(ca_cert))
        self.stopping = threading.Event()
        self.ended: list[tuple[float, bytes]] = []   # a slow client's seconds, and answer
        self.shaken = Counter()                  # slow clients' handshakes done, by client
        self.closed = 0                          # idle connections the manager closed
        self.threads = [threading.Thread(target=self._slow, args=(n,), daemon=True)
                        for n in range(SLOW)]

    def start_slow(self) -> None:
        for thread in self.threads:
            thread.start()

    def start_idle(self) -> None:
        self.threads.append(threading.Thread(target=self._idle, daemon=True))
        self.threads[-1].start()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=10)

    def _idle(self) -> None:
        selector = selectors.DefaultSelector()
        opened = 0
        try:
            while not self.stopping.wait(0.1):
                for _ in range(min(IDLE - len(selector.get_map()), OPENS_PER_SECOND // 10)):
                    sock = socket.socket()
                    sock.setblocking(False)
                    sock.bind((f"127.0.1.{1 + opened % 2 * (1 + opened // 2 % FLOOD_ADDRESSES)}",
                               0))
                    sock.connect_ex(self.address)
                    selector.register(sock, selectors.EVENT_READ)
                    opened += 1
                for key, _ in selector.select(0):
                    selector.unregister(key.fileobj)
                    key.fileobj.close()
                    self.closed += 1
        finally:
            for key in list(selector.get_map().values()):
                key.fileobj.close()
            selector.close()

    def _slow(self, n: int) -> None:
        line = encode({"op": "jobs", "secret": "not-yet"})
        while not self.stopping.is_set():
            began = time.monotonic()
            try:
                raw = socket.socket()
                raw.bind((f"127.0.2.{1 + n}", 0))
                raw.settimeout(5)
                raw.connect(self.address)
                sock = self.tls.wrap_socket(raw, server_hostname=self.address[0])
            except OSError:                  # turned away over a cap: closed in the handshake
                raw.close()
                self.stopping.wait(0.2)
                continue
            self.shaken[n] += 1
            sock.settimeout(1.0)
            with sock:
                for byte in line:
                    try:
                        sock.send(bytes([byte]))
                        answer = sock.recv(1000)
                    except TimeoutError:
                        continue                         # a byte a second
                    except OSError:
                        answer = b""
                    self.ended.append((time.monotonic() - began, answer))
                    break


def threads_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("Threads:")))


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("the flood test needs root to create network namespaces")
    reason = unavailable("softswitch")
    if reason:
        pytest.skip(reason)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < IDLE + 500:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, IDLE + 500), hard))
    bed = ManagerBed(tmp_path_factory.mktemp("flood"), listener=FLOOD_CAPS).start()
    yield bed
    bed.stop()


def test_a_flood_costs_no_lease_and_no_sum_and_a_job_registers_after_it(bed):
    """About 30 s: 1,500 idle connections and 30 slow-loris clients for three leases
    while two jobs renew and aggregate; a third job registers once the flood ends."""
    work = bed.workdir
    args = ["--reps", "1000000", "--size", "2000", "--pause", "0.05",
            "--until", str(work / "stop-calls"), "--hold", str(work / "release")]
    a = bed.launch("job-a", [0, 1], *args)
    b = bed.launch("job-b", [2, 3], *args, "--seed", "2")
    joined(a + b)

    def calls(ranks) -> list[int]:
        return [sum(e.get("event") == "call" for e in r.events()) for r in ranks]

    until(lambda: min(calls(a + b)) >= 3, 60, "both jobs' calls running")
    assert sorted(j["name"] for j in bed.jobs()["running"]) == ["job-a", "job-b"]
    flood = Flood(bed.topology.mgmt_address, bed.port, bed.tls.ca_cert)
    try:
        flood.start_slow()
        until(lambda: len(flood.shaken) == SLOW, 20, "every slow client's handshake")
        flood.start_idle()
        flooded = time.monotonic()
        before = calls(a + b)
        threads = []
        while time.monotonic() - flooded < 3 * LEASE:
            time.sleep(1.0)
            threads.append(threads_of(bed.manager.pid))
            assert sorted(j["name"] for j in bed.jobs()["running"]) == ["job-a", "job-b"]
        during = [n - m for n, m in zip(calls(a + b), before)]
    finally:
        flood.stop()
    ended = time.monotonic()

    # A new job registers at once (both ranks in, waiting for the slots a and b hold),
    # and runs once they close.
    c = bed.launch("job-c", [4, 5], "--reps", "3", "--seed", "3")
    until(lambda: "waiting for slots" in c[1].stderr, 30, "job-c registered")
    registered_after = time.monotonic() - ended
    (work / "calls").write_text(str(max(calls(a + b)) + 5))
    (work / "calls").rename(work / "stop-calls")
    (work / "release").touch()
    finished(a + b)                      # every call exact, the lease held: closed cleanly
    finished(c, calls=3)
    log = bed.manager_log()
    cut = [t for t, answer in flood.ended if b"no complete request within 3 s" in answer]
    evicted = [t for t, answer in flood.ended if b"made room" in answer]
    print(f"flood: calls during it {during}, manager threads {min(threads)}..{max(threads)}, "
          f"idle connections closed by the manager {flood.closed}, slow clients cut "
          f"{len(cut)} times ({min(cut, default=0):.2f}..{max(cut, default=0):.2f} s), "
          f"made room {len(evicted)} times, job-c registered {registered_after:.1f} s "
          f"after the flood")
    assert all(n > 0 for n in during), during
    for r in a + b:
        assert r.event("closed") and "cannot renew" not in r.stderr, r.stderr[-2000:]
    assert "stopped renewing" not in log
    assert max(threads) < 60, threads               # idle and slow clients cost no thread
    # No slow client held its connection past the deadline; each was cut or made room.
    assert len(cut) + len(evicted) >= SLOW and len(cut) + len(evicted) == len(flood.ended)
    assert all(t < 4.5 for t, _ in flood.ended) and all(t >= 3.0 for t in cut), flood.ended
    assert flood.closed > IDLE
    for kind in ("max_connections: ", "max_connections_per_peer: ", "made room for an "
                 "address with a secret: "):
        assert kind in log, kind
    assert registered_after < 10, registered_after
