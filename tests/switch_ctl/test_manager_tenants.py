"""Tenants of one job manager working against each other, against a real manager
process and the embedded switch, ranks in namespaces (manager_harness.py): each
tenant has its own secret and quotas, sees and reaches only its own jobs, and no
flood of waiting registrations costs another tenant's job its lease or its
registration. Also the client's refusal to send a secret in plaintext off loopback.

The manager's listener is as small as the one the issue starved (16 connections, 4
per address still sending a request), with 6 waiting registrations per address and
a join timeout of 6 s; the ports are trusted from the fabric map (no port proof), so
the test process itself can play a tenant registering jobs that never fill.
"""

from __future__ import annotations

import json
import secrets
import socket
import ssl
import threading
import time
from collections import Counter

import pytest

from innet_aggregation.switch_ctl.manager import JoinError, join
from innet_aggregation.switch_ctl.manager.client import _Manager, _Unreachable, join_from_env
from innet_aggregation.switch_ctl.manager.wire import encode, job_key

from .manager_harness import (LEASE, ManagerBed, credential_of, launch_rank,
                              skip_unless_runnable, until)
from .test_manager import finished, held, joined

SECRETS = {name: f"the-secret-of-{name}-0123" for name in
           ("alice", "bob", "carol", "mallory", "dave", "ops", "hi")}
TENANTS = {"alice": {"jobs": 1}, "bob": {"slots": 16}, "carol": {}, "mallory": {"pending": 8},
           "dave": {"pending": 1}, "ops": {"operator": True},
           "hi": {"priority": 5, "max_priority": 9}}
PENDING_PER_PEER = 6
JOIN_SECONDS = 6


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    skip_unless_runnable()
    bed = ManagerBed(tmp_path_factory.mktemp("tenants"),
                     listener={"max_connections": 16, "max_connections_per_peer": 4,
                               "max_pending_per_peer": PENDING_PER_PEER,
                               "join_seconds": JOIN_SECONDS, "prove_ports": False},
                     tenants={name: {"secret": SECRETS[name], **quotas}
                              for name, quotas in TENANTS.items()}).start()
    yield bed
    bed.stop()


def listing(bed, tenant: str) -> dict:
    """The tenant's listing, asked from the test's own address (the flood's, during
    it: turned away over its per-address cap, it asks again, as a client does)."""
    manager = _Manager(bed.address, SECRETS[tenant], bed.tls.ca_cert)

    def ask():
        try:
            return manager.request({"op": "jobs"})
        except _Unreachable:
            return None
    answer = until(ask, 10, f"{tenant}'s listing")
    assert answer["status"] == "ok", answer
    return answer


@pytest.fixture(autouse=True)
def nothing_left_running(bed):
    yield
    until(lambda: not (j := listing(bed, "ops"))["running"] and not j["waiting"], 3 * LEASE,
          "the test's jobs left the manager")
    until(lambda: not bed.installed(), 5, "the test's jobs left the switch")


def launch(bed, tenant: str, job: str, hosts: list[int], *args: str, **env):
    return bed.launch(job, hosts, *args, extra_env={"INA_SECRET": SECRETS[tenant], **env})


def registration(bed, tenant: str, job: str, host: int, world: int = 2) -> dict:
    h = bed.topology.hosts[host]
    return {"op": "register", "secret": SECRETS[tenant], "job": job, "rank": 0,
            "world": world, "udp_port": 40000, "credential": credential_of(job),
            "token": secrets.token_hex(16),
            "interfaces": [{"ifname": "eth0", "ip": h.ip, "mac": h.mac}]}


class Waiter:
    """A registration from the test's own address, held open: its answer lines."""

    def __init__(self, bed, message: dict):
        tls = ssl.create_default_context(cafile=str(bed.tls.ca_cert))
        sock = socket.create_connection((bed.topology.mgmt_address, bed.port), timeout=10)
        self.sock = tls.wrap_socket(sock, server_hostname=bed.topology.mgmt_address)
        self.sock.sendall(encode(message))
        self.reader = self.sock.makefile("rb")

    def answer(self) -> dict:
        line = self.reader.readline()
        return json.loads(line) if line else {"status": "closed"}

    def close(self) -> None:
        self.sock.close()


class Flood:
    """Tenant mallory, from one address, keeps THREADS registrations of jobs that never
    fill (rank 0 of 2, each its own job) open or trying again, and counts how many wait
    at once and how each ends."""

    THREADS = 24

    def __init__(self, bed):
        self.bed = bed
        self.stop = threading.Event()
        self.waiting: set[int] = set()
        self.most = 0
        self.ends: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(n,), daemon=True)
                        for n in range(self.THREADS)]

    def __enter__(self) -> "Flood":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=15)

    def _run(self, n: int) -> None:
        tries = 0
        while not self.stop.is_set():
            tries += 1
            try:
                waiter = Waiter(self.bed, registration(self.bed, "mallory",
                                                       f"flood-{n}-{tries}", 6))
            except OSError as exc:
                self._end(n, f"connect: {type(exc).__name__}")
                self.stop.wait(0.5)
                continue
            try:
                while not self.stop.is_set():       # a waiting line comes every second
                    answer = waiter.answer()
                    if answer["status"] != "waiting":
                        break
                    with self.lock:
                        self.waiting.add(n)
                        self.most = max(self.most, len(self.waiting))
                else:
                    answer = {"status": "stopped"}
            except OSError as exc:
                answer = {"status": type(exc).__name__}
            finally:
                waiter.close()
            self._end(n, answer.get("error", answer["status"]).replace(f"flood-{n}-{tries}",
                                                                       "flood-N"))
            self.stop.wait(0.5)

    def _end(self, n: int, why: str) -> None:
        with self.lock:
            self.waiting.discard(n)
            self.ends[why] += 1


def test_waiting_registrations_of_one_tenant_starve_no_other(bed):
    """Tenant mallory floods the manager from one address with registrations whose jobs
    never fill, for four leases: at most PENDING_PER_PEER of them wait at once, each
    ends after join_seconds, and meanwhile alice's running job renews every lease and
    aggregates, and carol's job registers and runs."""
    work = bed.workdir
    args = ["--reps", "1000000", "--size", "2000", "--pause", "0.05",
            "--until", str(work / "stop-calls"), "--hold", str(work / "release")]
    a = launch(bed, "alice", "job-a", [0, 1], *args)
    joined(a)

    def calls() -> list[int]:
        return [sum(e.get("event") == "call" for e in r.events()) for r in a]

    until(lambda: min(calls()) >= 3, 60, "alice's calls running")
    with Flood(bed) as flood:
        until(lambda: flood.most >= PENDING_PER_PEER, 20, "mallory's registrations wait")
        started, before = time.monotonic(), calls()
        c = launch(bed, "carol", "job-c", [2, 3], "--reps", "3", "--seed", "3")
        finished(c, timeout=60, calls=3)
        carol_done = time.monotonic() - started
        while time.monotonic() - started < 4 * LEASE:
            assert [j["name"] for j in listing(bed, "alice")["running"]] == ["job-a"]
            time.sleep(0.5)
        during = [n - m for n, m in zip(calls(), before)]
        mallory = listing(bed, "mallory")
    (work / "calls").write_text(str(max(calls()) + 5))
    (work / "calls").rename(work / "stop-calls")
    (work / "release").touch()
    finished(a)
    print(f"flood: at most {flood.most} of mallory's registrations waited at once; ends "
          f"{dict(flood.ends)}; alice's calls during it {during}; carol's job done "
          f"{carol_done:.1f} s into it")
    assert flood.most == PENDING_PER_PEER
    assert all(n > 0 for n in during), during
    for r in a:
        assert r.event("closed") and "cannot renew" not in r.stderr, r.stderr[-2000:]
    assert "stopped renewing" not in bed.manager_log()
    over = [why for why in flood.ends if f"(max_pending_per_peer = {PENDING_PER_PEER})" in why]
    expired = [why for why in flood.ends if f"waited {JOIN_SECONDS} s (the manager's "
                                            f"join_seconds)" in why]
    assert over and expired, flood.ends
    # Mallory sees its own waiting jobs, none of alice's or carol's.
    assert {j["tenant"] for j in mallory["waiting"] + mallory["running"]} <= {"mallory"}


def test_a_tenant_at_its_quota_is_refused_and_another_still_trains(bed):
    release = bed.workdir / "release-q"
    a = launch(bed, "alice", "job-q1", [0, 1], "--hold", str(release))
    joined(a)
    more = launch(bed, "alice", "job-q2", [2])
    assert more[0].wait(30) == 2
    assert more[0].events()[-1]["error"] == (
        "JoinError: the manager refused rank 0 of job job-q2: tenant alice is at its quota "
        "jobs = 1 (it holds 1, this asks 1 more): rank 0 of job job-q2 refused")
    wide = launch(bed, "bob", "job-q3", [3], INA_SLOTS="32")
    assert wide[0].wait(30) == 2
    assert "tenant bob is at its quota slots = 16 (it holds 0, this asks 32 more)" in \
        wide[0].events()[-1]["error"]
    # Dave may have one registration waiting: a second is refused, one line.
    first = Waiter(bed, registration(bed, "dave", "job-d1", 4))
    assert first.answer()["status"] == "waiting"
    second = Waiter(bed, registration(bed, "dave", "job-d2", 5))
    assert second.answer() == {"status": "refused", "error": (
        "tenant dave is at its quota pending = 1 (it holds 1, this asks 1 more): rank 0 of "
        "job job-d2 refused")}
    first.close()
    second.close()
    # Bob, within his quota, registers and trains beside alice's job.
    b = launch(bed, "bob", "job-q4", [3], "--reps", "3", "--seed", "4")
    finished(b, calls=3)
    release.touch()
    finished(a)


def test_a_tenant_sees_and_reaches_only_its_own_jobs(bed):
    """Bob holds alice's job credential (it travels through torch's store) and registers
    rank 1 of her job before her own rank 1 does: he gathers a job of his own and never
    joins hers. Each tenant lists only its own jobs; the operator lists all, by tenant."""
    outdir = bed.workdir / "cross"
    for tenant in ("alice", "bob"):
        (outdir / tenant).mkdir(parents=True)
    release = bed.workdir / "release-x"

    def rank(tenant: str, rank: int, host: int):
        launched = launch_rank(bed.topology.hosts[host], outdir / tenant, rank, 2, bed.address,
                               "job-x", {"INA_CA_CERT": str(bed.tls.ca_cert),
                                         "INA_SECRET": SECRETS[tenant]},
                               ("--hold", str(release)))
        bed.ranks.append(launched)
        return launched

    a0 = [rank("alice", 0, 0)]
    until(lambda: listing(bed, "alice")["waiting"], 30, "alice's rank 0 waits")
    b = rank("bob", 1, 1)
    until(lambda: listing(bed, "bob")["waiting"], 30, "bob's rank waits")
    a1 = rank("alice", 1, 2)
    ja = joined(a0 + [a1])
    assert [j["ip"] for j in ja] == [bed.topology.hosts[0].ip, bed.topology.hosts[2].ip]
    held(a0 + [a1])
    assert not b.event("joined")
    alice, bob, ops = (listing(bed, t) for t in ("alice", "bob", "ops"))
    assert [(j["name"], j["tenant"]) for j in alice["running"]] == [("job-x", "alice")]
    assert alice["waiting"] == [] and bob["running"] == []
    assert [(j["name"], j["tenant"], j["registered"]) for j in bob["waiting"]] == [
        ("job-x", "bob", [1])]
    assert ({(j["name"], j["tenant"]) for j in ops["running"] + ops["waiting"]}
            == {("job-x", "alice"), ("job-x", "bob")})
    assert listing(bed, "carol") == {"status": "ok", "running": [], "waiting": [],
                                     "removing": []}
    assert all("owner" not in j for j in ops["running"] + ops["waiting"])
    # Nor can bob renew or close her job without her ranks' tokens.
    manager = _Manager(bed.address, SECRETS["bob"], bed.tls.ca_cert)
    for op in ("renew", "close"):
        answer = manager.request({"op": op, "job": job_key("job-x", credential_of("job-x")),
                                  "rank": 1, "token": secrets.token_hex(16)})
        assert answer["status"] == "refused", answer
    b.process.kill()
    b.process.wait()
    release.touch()
    finished(a0 + [a1])


def test_a_job_of_higher_priority_preempts_a_lower_one_and_it_returns_after(bed):
    """Carol's job (priority 0) holds the whole pool; another of hers waits (equal
    priority never preempts); tenant hi's job (priority 5) preempts the first: its
    ranks' leases are revoked naming why, hi's job runs, and carol's registers again
    and runs once hi's closed. A priority above the tenant's cap is refused."""
    release = bed.workdir / "release-p"
    low = launch(bed, "carol", "job-low", [4, 5], "--hold", str(release), INA_SLOTS="32")
    joined(low)
    same = launch(bed, "carol", "job-same", [0, 1], INA_SLOTS="16")
    until(lambda: all("waiting for slots" in r.stderr for r in same), 30,
          "carol's second job waits")
    assert [j["name"] for j in listing(bed, "carol")["running"]] == ["job-low"]
    over = launch(bed, "hi", "job-over", [2], INA_PRIORITY="10")
    assert over[0].wait(30) == 2
    assert ("tenant hi may give a job priority 9 at most (its max_priority), not 10"
            in over[0].events()[-1]["error"])
    for r in same:
        r.process.kill()
        r.process.wait()
    preempted = time.monotonic()
    high = launch(bed, "hi", "job-high", [6, 7], "--reps", "3", INA_SLOTS="16")
    finished(high, calls=3)
    took = time.monotonic() - preempted
    until(lambda: all("ina: job job-low is lost: job job-low was preempted" in r.stderr
                      for r in low), 3 * LEASE, "carol's ranks are told at their renewal")
    release.touch()
    for r in low:
        assert r.wait(30) == 3
        assert r.events()[-1]["error"] == (
            "lost: job job-low was preempted by job job-high of tenant hi (priority 5 over 0)")
    assert "leaving switch: preempted by job job-high" in bed.manager_log()
    back = launch(bed, "carol", "job-low", [4, 5], "--reps", "3", INA_SLOTS="32")
    finished(back, calls=3)
    print(f"preemption: the high-priority job registered and ran 3 calls {took:.1f} s after "
          f"it was launched")


def test_a_preempted_job_waits_again_at_its_place_not_behind_later_jobs(bed):
    """Carol's first job holds the whole pool, her later one waits; hi's job preempts
    the first, whose ranks register again after the later one: once hi's job closes,
    the first (complete before the later one) goes on the switch before it."""
    release, release_high = bed.workdir / "release-first", bed.workdir / "release-high"
    first = launch(bed, "carol", "job-first", [4, 5], "--hold", str(release), INA_SLOTS="32")
    joined(first)
    later = launch(bed, "carol", "job-later", [0, 1], "--reps", "3", INA_SLOTS="32")
    until(lambda: all("waiting for slots" in r.stderr for r in later), 30,
          "carol's later job waits")
    high = launch(bed, "hi", "job-high", [6, 7], "--hold", str(release_high),
                  INA_SLOTS="16")
    joined(high)
    until(lambda: all("ina: job job-first is lost" in r.stderr for r in first), 3 * LEASE,
          "carol's first job is told it was preempted")
    release.touch()
    for r in first:
        assert r.wait(30) == 3
    back = launch(bed, "carol", "job-first", [4, 5], "--reps", "3", INA_SLOTS="32")
    until(lambda: all("waiting for slots" in r.stderr for r in back), 30,
          "carol's first job waits again")
    release_high.touch()
    finished(high)
    finished(back, calls=3)
    finished(later, calls=3)
    installed = [line.split(" installed:")[0].rsplit(" job ", 1)[1].split("/")[0]
                 for line in bed.manager_log().splitlines() if " installed: id " in line]
    assert installed[-4:] == ["job-first", "job-high", "job-first", "job-later"], installed


def test_the_client_sends_no_secret_in_plaintext_off_loopback(bed, monkeypatch):
    """A plaintext listener on the management network (not loopback) hears nothing from
    a client without a CA unless it is told insecure; on loopback it is heard."""
    def listener(host: str) -> tuple[socket.socket, list[bytes]]:
        server = socket.create_server((host, 0))
        heard: list[bytes] = []

        def serve():
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                with conn:
                    conn.settimeout(5)
                    heard.append(conn.recv(65536))
        threading.Thread(target=serve, daemon=True).start()
        return server, heard

    def try_join(address: str, **kwargs) -> str:
        with pytest.raises(JoinError) as err:
            join(address, "job-p", 0, 1, SECRETS["alice"], ca_cert=None,
                 credential=credential_of("job-p"), timeout=3, **kwargs)
        return str(err.value)

    server, heard = listener(bed.topology.mgmt_address)
    address = f"{bed.topology.mgmt_address}:{server.getsockname()[1]}"
    with server:
        said = try_join(address)
        assert said == (f"refusing to send the secret in plaintext to the manager at {address}, "
                        f"which is not a loopback address: set INA_CA_CERT to the CA of its "
                        f"certificate (TLS), or INA_INSECURE=1 to send it in plaintext all "
                        f"the same")
        time.sleep(0.3)
        assert heard == []
        try_join(address, insecure=True)
        until(lambda: heard, 5, "the insecure client's line")
        assert SECRETS["alice"].encode() in heard[0]
    server, heard = listener("127.0.0.1")
    with server:
        try_join(f"127.0.0.1:{server.getsockname()[1]}")
        until(lambda: heard, 5, "the loopback client's line")
    for name, value in {"INA_MANAGER": address, "INA_SECRET": SECRETS["alice"],
                        "INA_JOB": "job-p", "INA_JOB_CREDENTIAL": credential_of("job-p"),
                        "INA_INSECURE": "yes"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(JoinError, match="INA_INSECURE must be 0 or 1, not 'yes'"):
        join_from_env(0, 1)
