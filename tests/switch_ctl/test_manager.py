"""The job manager (switch_ctl serve) with a real switch (the embedded one, native
backend), real P4Runtime, and ranks in namespaces that find their own interfaces,
join through the management network over TLS, and aggregate exactly.

The pool holds two jobs' slots (32, 16 a job): a third job waits, and goes on when
one ends; a fourth, with a short timeout, is refused. Killed ranks lose their job
within the lease; a restarted manager keeps its jobs; a restarted switch gets them
back.
"""

from __future__ import annotations

import json
import secrets
import socket
import ssl
import subprocess
import sys
import time

import pytest

from innet_aggregation.switch_ctl.manager import JoinError, join

from innet_aggregation.switch_ctl.manager.client import _Manager
from innet_aggregation.switch_ctl.manager.wire import job_key

from .manager_harness import (JOB_SLOTS, LEASE, POOL_SLOTS, SECRET, SWEEP, ManagerBed,
                              credential_of, env, launch_rank, nothing_left, skip_unless_runnable,
                              until)


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    skip_unless_runnable()
    bed = ManagerBed(tmp_path_factory.mktemp("manager"), unlisted=(7,),
                     listener={"learn_hosts": True}).start()
    yield bed
    bed.stop()


@pytest.fixture(autouse=True)
def nothing_left_running(bed):
    """Each test ends with its jobs gone from the manager and the switch."""
    yield
    nothing_left(bed)


def joined(ranks, timeout=60):
    return until(lambda: all(r.event("joined") for r in ranks) and
                 [r.event("joined") for r in ranks], timeout, "every rank joined")


def held(ranks, timeout=60):
    until(lambda: all(r.event("held") or r.process.poll() is not None for r in ranks), timeout,
          "every rank ran its calls")
    for r in ranks:
        assert r.event("held"), f"rank {r.rank}: {r.events()}\n{r.stderr[-3000:]}"


def finished(ranks, timeout=60, calls=None):
    for r in ranks:
        assert r.wait(timeout) == 0, f"rank {r.rank}: {r.events()}\n{r.stderr[-3000:]}"
        results = [e for e in r.events() if e.get("event") == "call"]
        assert all(e["wrong"] == 0 for e in results)
        if calls is not None:
            assert len(results) == calls


def test_two_jobs_share_the_switch_a_third_waits_and_a_fourth_gives_up(bed):
    a = bed.launch("job-a", [0, 1], "--reps", "3", "--hold", str(bed.workdir / "release-a"))
    b = bed.launch("job-b", [2, 3], "--reps", "3", "--seed", "2",
                   "--hold", str(bed.workdir / "release-b"))
    ja, jb = joined(a)[0], joined(b)[0]
    # Disjoint: ids, slots, UDP ports, service addresses; every rank got the same job.
    assert all(r.event("joined") == {**ja, "ip": r.event("joined")["ip"]} for r in a)
    assert {ja["first_slot"], jb["first_slot"]} == {0, JOB_SLOTS}
    assert ja["num_slots"] == jb["num_slots"] == JOB_SLOTS
    for key in ("job_id", "udp_port", "service_ip", "service_mac"):
        assert ja[key] != jb[key], key
    # Each rank's data-plane address, found by the rank itself (mgmt0 is not in the fabric).
    assert [r.event("joined")["ip"] for r in a + b] == [
        bed.topology.hosts[i].ip for i in range(4)]
    installed = bed.installed()
    for j in (ja, jb):
        on_switch = installed[j["job_id"]]
        assert (on_switch.first_slot, on_switch.num_slots, on_switch.udp_port,
                on_switch.service_ip) == (j["first_slot"], JOB_SLOTS, j["udp_port"],
                                          j["service_ip"])
    held(a + b)

    # The pool is full: C waits, saying why; D gives up after its own timeout.
    c = bed.launch("job-c", [4, 5], "--reps", "2", "--seed", "3")
    # Host 7 is not in the fabric map: it names its data-plane interface to be learned.
    d = bed.launch("job-d", [6, 7], extra_env={"INA_JOIN_TIMEOUT": "4", "INA_IFNAME": "eth0"})
    for r in d:
        assert r.wait(30) == 2
        error = r.events()[0]["error"]
        assert error.startswith("JoinError: job job-d did not start within 4 s (waiting for "
                                f"slots: 2 jobs hold {POOL_SLOTS} of the pool's {POOL_SLOTS} "
                                f"slots; this job needs {JOB_SLOTS} in one range)"), error
    assert "waiting for slots: 2 jobs hold" in c[0].stderr
    assert not any(r.event("joined") for r in c)

    (bed.workdir / "release-a").touch()
    finished(a, calls=3)
    jc = joined(c)[0]
    assert jc["first_slot"] == ja["first_slot"]              # A's slots, reset for C
    assert jc["job_id"] not in (ja["job_id"], jb["job_id"])  # ids taken in turn
    finished(c, calls=2)
    (bed.workdir / "release-b").touch()
    finished(b, calls=3)


def test_killed_ranks_lose_their_job_within_the_lease_and_the_next_job_is_exact(bed):
    e = bed.launch("job-e", [0, 1], "--reps", "100000", "--size", "2000", "--pause", "0.01")
    je = joined(e)[0]
    until(lambda: all(len(r.events()) > 3 for r in e), 60, "job-e's calls ran")
    for r in e:
        r.process.kill()
    killed = time.monotonic()
    for r in e:
        r.process.wait()
    until(lambda: not any(bed.jobs()[k] for k in ("running", "removing")), LEASE + SWEEP + 10,
          "job-e reclaimed and removed")
    reclaimed = time.monotonic() - killed
    # The last renewal came at most a lease before the kill; the sweep looks every SWEEP s;
    # removing the entries and resetting 16 slots takes a fraction of a second.
    assert reclaimed <= LEASE + SWEEP + 1.0, reclaimed
    assert f"job {job_key('job-e', credential_of('job-e'))} (id" in bed.manager_log()
    assert "stopped renewing" in bed.manager_log()
    assert je["job_id"] not in bed.installed()
    # The next job gets the same slots, left mid-call by job-e and reset: exact.
    f = bed.launch("job-f", [0, 1], "--reps", "3", "--seed", "7")
    assert joined(f)[0]["first_slot"] == je["first_slot"]
    finished(f, calls=3)


def test_a_restarted_manager_keeps_its_running_job(bed):
    release = bed.workdir / "release-g"
    g = bed.launch("job-g", [2, 3], "--reps", "40", "--size", "2000", "--pause", "0.1",
                   "--hold", str(release))
    jg = joined(g)[0]
    until(lambda: all(len(r.events()) > 3 for r in g), 60, "job-g's calls ran")
    bed.kill_manager()
    time.sleep(1.0)
    bed.start_manager()
    restarted = time.monotonic()
    assert (f"job {job_key('job-g', credential_of('job-g'))} (id {jg['job_id']}) restored from "
            f"the database") in bed.manager_log()
    held(g)
    # Two leases after the restart the job is still there: its ranks renewed against
    # the new manager (one that did not would have been reclaimed after one lease).
    time.sleep(max(0.0, restarted + 2 * LEASE - time.monotonic()))
    assert [j["name"] for j in bed.jobs()["running"]] == ["job-g"]
    assert jg["job_id"] in bed.installed()
    listed = subprocess.run([sys.executable, "-m", "innet_aggregation.switch_ctl", "jobs",
                             "--config", str(bed.config_path), "--ca-cert", str(bed.tls.ca_cert)],
                            capture_output=True, text=True, timeout=60, env=env())
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith(f"running job-g: id {jg['job_id']}, slots "
                                    f"{jg['first_slot']}..{jg['first_slot'] + JOB_SLOTS - 1}")
    release.touch()
    finished(g, calls=40)


def test_a_restarted_switch_gets_its_jobs_back(bed):
    between = bed.workdir / "between-h"
    h = bed.launch("job-h", [4, 5], "--sessions", "2", "--reps", "3", "--between", str(between))
    jh = joined(h)[0]
    until(lambda: all(len(r.events()) == 4 for r in h), 60, "job-h's first session")
    bed.restart_switch()
    # The manager notices (its session broke, the new switch has no program), pushes the
    # program and applies the job again, within a few sweeps.
    until(lambda: jh["job_id"] in bed.installed(), 20, "job-h back on the switch")
    assert "re-applying it" in bed.manager_log()
    between.touch()            # a new session on the same job: exact
    finished(h, calls=6)


def test_an_intruder_with_the_secret_cannot_join_renew_or_close_another_job(bed):
    """Tenant B holds the manager's secret and picks job-i's name, and registers rank 1
    before job-i's own rank 1: it gathers a job of its own, and job-i runs exact
    without it. B's renewals and closes of job-i, with any token, are refused."""
    outdir = bed.workdir / "intruder"
    outdir.mkdir()
    b = launch_rank(bed.topology.hosts[4], outdir, 1, 2, bed.address, "job-i",
                    {"INA_CA_CERT": str(bed.tls.ca_cert),
                     "INA_JOB_CREDENTIAL": "not-job-i-s-own-secret"}, ())
    bed.ranks.append(b)
    until(lambda: any(w["name"] == "job-i" for w in bed.jobs()["waiting"]), 30,
          "the intruder waits")
    release = bed.workdir / "release-i"
    a = bed.launch("job-i", [0, 1], "--reps", "3", "--hold", str(release))
    ja = joined(a)
    assert [j["ip"] for j in ja] == [bed.topology.hosts[0].ip, bed.topology.hosts[1].ip]
    held(a)
    assert not b.event("joined")
    manager = _Manager(bed.address, SECRET, bed.tls.ca_cert)
    key = job_key("job-i", credential_of("job-i"))
    for op in ("renew", "close"):
        for rank in (0, 1):
            answer = manager.request({"op": op, "job": key, "rank": rank,
                                      "token": secrets.token_hex(16)})
            assert answer["status"] == "refused", answer
            assert answer["error"].startswith(f"job job-i has no rank {rank} with this lease")
    running = [j for j in bed.jobs()["running"] if j["name"] == "job-i"]
    assert len(running) == 1 and running[0]["closed"] == []
    assert running[0]["tenant"] == "default" and "owner" not in running[0]
    release.touch()
    finished(a, calls=3)
    b.process.kill()
    b.process.wait()


def test_a_registration_cannot_claim_a_host_it_is_not(bed):
    """From the root namespace (not behind the switch), a tenant with the secret claims
    host 0's interface: the nonce goes out of host 0's switch port, so it cannot echo
    it, and its registration is refused. Host 0's own rank proves itself and runs."""
    host = bed.topology.hosts[0]
    claim = {"op": "register", "job": "job-p", "rank": 0, "world": 1,
             "interfaces": [{"ifname": "eth0", "ip": host.ip, "mac": host.mac}],
             "udp_port": 40123, "credential": credential_of("job-p"), "token": "7" * 32}
    manager = _Manager(bed.address, SECRET, bed.tls.ca_cert)
    answer = manager.request(claim)
    assert answer["status"] == "prove", answer
    assert answer["message"].startswith(f"a nonce went to {host.mac} / {host.ip} UDP 40123 "
                                        f"through switch port {host.switch_port}")
    answer = manager.request({**claim, "proof": secrets.token_hex(16)})
    assert answer == {"status": "refused", "error": (
        f"rank 0 of job job-p echoed a wrong port proof: the nonce went to {host.mac} / "
        f"{host.ip} UDP 40123 through switch port {host.switch_port}, and this host did not "
        f"get it (is it behind that port? the fabric map says it is)")}
    assert not bed.jobs()["waiting"] and not bed.installed()
    p = bed.launch("job-p", [0], "--reps", "1")
    finished(p, calls=1)


def test_a_host_the_fabric_does_not_list_is_learned_and_aggregates(bed):
    """Host 7 is not in fabric.hosts: its rank (naming its data-plane interface) gets a
    nonce out of every host port, echoes the one port 8 carried, and its job runs."""
    host = bed.topology.hosts[7]
    learned = bed.launch("job-l", [7], "--reps", "2", extra_env={"INA_IFNAME": "eth0"})
    finished(learned, calls=2)
    assert (f"learned that {host.mac} ({host.ip}) is behind switch port {host.switch_port}"
            in bed.manager_log())
    assert "to learn its port" in learned[0].stderr


def test_a_deadline_job_is_installed_with_it_and_its_ranks_must_agree(bed):
    release = bed.workdir / "release-dl"
    ranks = bed.launch("job-dl", [0, 1], "--reps", "2", "--hold", str(release),
                       extra_env={"INA_DEADLINE_MS": "500"})
    assert [j["deadline_ms"] for j in joined(ranks)] == [500.0, 500.0]
    held(ranks)                          # the job stays on the switch until released
    assert bed.deadline_jobs() == [ranks[0].event("joined")["job_id"]]
    release.touch()
    finished(ranks, calls=2)
    # Ranks that ask for different deadlines: the second is refused, naming both.
    first = bed.launch("job-dm", [2], "--world", "2", extra_env={"INA_DEADLINE_MS": "50"})
    until(lambda: bed.jobs()["waiting"], 30, "the first rank registered")
    second = launch_rank(bed.topology.hosts[3], bed.workdir / "job-dm", 1, 2, bed.address,
                         "job-dm", {"INA_CA_CERT": str(bed.tls.ca_cert)}, [])
    assert second.wait(30) == 2
    assert "asks for deadline_ms None; its other ranks asked for 50.0" in \
        second.events()[0]["error"], second.events()
    first[0].process.kill()
    first[0].process.wait()


def test_a_wrong_secret_is_refused_and_installs_nothing(bed):
    with pytest.raises(JoinError, match="the manager refused rank 0 of job job-x: wrong secret"):
        join(bed.address, "job-x", 0, 1, "not-the-secret-at-all", ca_cert=bed.tls.ca_cert,
             credential=credential_of("job-x"), timeout=10)
    assert "refused a request with a wrong secret" in bed.manager_log()
    assert not bed.jobs()["waiting"] and not bed.installed()
    # The right secret from a host the fabric does not know (the root namespace).
    with pytest.raises(JoinError, match="none of rank 0's interfaces .* is in the manager's "
                                        "fabric"):
        join(bed.address, "job-x", 0, 1, SECRET, ca_cert=bed.tls.ca_cert,
             credential=credential_of("job-x"), timeout=10)


GOOD = {"op": "register", "secret": SECRET, "job": "job-y", "rank": 0, "world": 1,
        "interfaces": [{"ifname": "eth0", "ip": "10.0.0.1", "mac": "02:00:00:00:00:01"}],
        "udp_port": 40000, "credential": credential_of("job-y"), "token": "5" * 32}
LEASE_ONLY = {"secret": None, "world": None, "interfaces": None, "udp_port": None,
              "credential": None, "job": job_key("job-y", credential_of("job-y"))}


@pytest.mark.parametrize("change,said", [
    ("not json", "malformed request: not JSON"),
    ([1, 2], "malformed request: a request is a JSON object"),
    ({"secret": None}, "malformed request: the request carries no secret"),
    ({"op": "delete"}, "op must be one of register, renew, close, jobs, not 'delete'"),
    ({"job": "../etc/passwd"}, "job must be 1-128 characters"),
    ({"job": "x" * 129}, "job must be 1-128 characters"),
    ({"rank": 2, "world": 2}, "rank 2 is not below the world size 2"),
    ({"world": 33}, "world must be an integer in 1..32, not 33"),
    ({"rank": True}, "rank must be an integer in 0..31, not True"),
    ({"udp_port": 80}, "udp_port must be an integer in 1024..65535, not 80"),
    ({"slots": 0}, "slots must be an integer in 1..32768, not 0"),
    ({"slots": 4096}, "job job-y asks for 4096 slots; the manager's pool has 32"),
    ({"deadline_ms": 0}, "deadline_ms must be a number of milliseconds in (0, 60000], not 0"),
    ({"deadline_ms": "5"}, "deadline_ms must be a number of milliseconds in (0, 60000], "
                           "not '5'"),
    ({"interfaces": []}, "interfaces must list 1..32 interfaces"),
    ({"interfaces": [{"ifname": "eth0", "ip": "10.0.0.1", "mac": "02:00:00:00:01"}]},
     "interfaces[0].mac '02:00:00:00:01' is not a MAC address"),
    ({"interfaces": [{"ifname": "eth0", "ip": "10.0.0.300", "mac": "02:00:00:00:00:01"}]},
     "interfaces[0].ip '10.0.0.300' is not an IPv4 address"),
    ({"interfaces": [{"ifname": "eth0", "ip": "10.0.0.1", "mac": "02:00:00:00:99:01"},
                     {"ifname": "eth1", "ip": "10.0.1.1", "mac": "02:00:00:00:99:02"}]},
     "none of rank 0's interfaces (eth0 02:00:00:00:99:01, eth1 02:00:00:00:99:02) is in the "
     "manager's fabric (fabric.hosts): name the data-plane interface with INA_IFNAME"),
    ({"interfaces": [{"ifname": "eth0", "ip": "10.0.0.250", "mac": "02:00:00:00:00:01"}]},
     "rank 0's address 10.0.0.250 is a service address"),
    ({"extra": 1}, "unknown fields 'extra' in a register request"),
    ({"credential": "too-short"}, "credential must be the job's own secret"),
    ({"token": None}, "token must be 32 hex digits the rank drew"),
    ({"op": "renew", "token": "0" * 32},
     "unknown fields 'credential', 'interfaces', 'secret', 'udp_port', 'world' in a renew "
     "request"),
    ({"op": "renew", "token": "0" * 32, **LEASE_ONLY},
     "job job-y has no rank 0 with this lease"),
    ({"op": "renew", "token": "0" * 32, **LEASE_ONLY, "job": "job-y"},
     "a renew's job must be the job's key"),
    ({"op": "close", "token": "xyz", **LEASE_ONLY},
     "token must be 32 hex digits the rank drew"),
])
def test_malformed_requests_are_refused_clearly(bed, change, said):
    if isinstance(change, dict):
        message = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
        line = json.dumps(message).encode() + b"\n"
    else:
        line = (change if isinstance(change, str) else json.dumps(change)).encode() + b"\n"
    context = ssl.create_default_context(cafile=str(bed.tls.ca_cert))
    host, port = bed.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), 10) as raw, \
            context.wrap_socket(raw, server_hostname=host) as sock:
        sock.sendall(line)
        answer = json.loads(sock.makefile("rb").readline())
    assert answer["status"] == "refused"
    assert said in answer["error"], answer["error"]
    assert not bed.jobs()["waiting"] and not bed.installed()


def test_tls_on_the_listener(bed):
    with pytest.raises(JoinError, match="closed the connection without answering: it may "
                                        "require TLS"):
        join(bed.address, "job-z", 0, 1, SECRET, ca_cert=None, insecure=True,
             credential=credential_of("job-z"), timeout=10)
    with pytest.raises(JoinError, match="certificate .* is not trusted by the CA in "):
        join(bed.address, "job-z", 0, 1, SECRET, ca_cert=bed.other_ca.ca_cert,
             credential=credential_of("job-z"), timeout=10)
    assert "TLS handshake failed" in bed.manager_log()
    # Trusting the manager's CA gets through (and is refused only for its fabric).
    with pytest.raises(JoinError, match="is in the manager's fabric"):
        join(bed.address, "job-z", 0, 1, SECRET, ca_cert=bed.tls.ca_cert,
             credential=credential_of("job-z"), timeout=10)
