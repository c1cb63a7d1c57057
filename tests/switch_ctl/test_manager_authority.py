"""Who may act for a job, without root or a switch: the wire's checks and the jobs'
state machine. A job is its name and its owner's credential; a rank's lease token
is its own; a rank registered twice is refused, never evicted.

The switch here is a record of what was installed (the state machine under test
decides what to install; the manager tests run the same paths against a real
switch)."""

from __future__ import annotations

import dataclasses
import secrets

import pytest

from innet_aggregation.switch_ctl.manager import config as manager_config
from innet_aggregation.switch_ctl.manager.jobs import Jobs
from innet_aggregation.switch_ctl.manager.store import Store
from innet_aggregation.switch_ctl.manager.wire import (BadRequest, Lease, Register, job_key,
                                                       parse, token_hash)

SECRET = "the-managers-secret"
CRED_A = "credential-of-tenant-a"
CRED_B = "credential-of-tenant-b"
MACS = [f"02:00:00:00:00:0{i}" for i in range(1, 5)]
PEER = "198.18.0.1"      # the address a registration came from


def register_message(rank=0, world=2, *, job="train", credential=CRED_A, token=None, host=None):
    host = rank if host is None else host
    return {"op": "register", "secret": SECRET, "job": job, "rank": rank, "world": world,
            "credential": credential, "token": token or secrets.token_hex(16),
            "interfaces": [{"ifname": "eth0", "ip": f"10.0.0.{host + 1}", "mac": MACS[host]}],
            "udp_port": 40000 + host}


def test_a_job_is_its_name_and_its_owner():
    a, b = parse(register_message()), parse(register_message(credential=CRED_B))
    assert isinstance(a, Register) and a.name == b.name == "train"
    assert a.job != b.job and a.job == job_key("train", CRED_A)
    assert CRED_A not in a.job and a.token_hash != register_message()["token"]


@pytest.mark.parametrize("change,said", [
    ({"credential": None}, "credential must be the job's own secret"),
    ({"credential": "short"}, "credential must be the job's own secret"),
    ({"credential": "has spaces in it, sixteen+"}, "credential must be the job's own secret"),
    ({"token": None}, "token must be 32 hex digits the rank drew"),
    ({"token": "g" * 32}, "token must be 32 hex digits the rank drew"),
])
def test_a_registration_without_a_credential_or_token_is_refused(change, said):
    message = {k: v for k, v in {**register_message(), **change}.items() if v is not None}
    with pytest.raises(BadRequest, match=said):
        parse(message)


def test_a_lease_carries_the_job_key_and_token_not_the_secret():
    key, token = job_key("train", CRED_A), secrets.token_hex(16)
    lease = parse({"op": "renew", "job": key, "rank": 1, "token": token})
    assert lease == Lease("renew", key, 1, token_hash(token))
    with pytest.raises(BadRequest, match="unknown fields 'secret' in a renew request"):
        parse({"op": "renew", "job": key, "rank": 1, "token": token, "secret": SECRET})
    with pytest.raises(BadRequest, match="a close's job must be the job's key"):
        parse({"op": "close", "job": "train", "rank": 1, "token": token})


class RecordingSwitch:
    """What the manager installed, by job id: the state machine's output."""

    def __init__(self):
        self.jobs = {}

    def installed(self):
        return []

    def check(self, tree):
        pass

    def install(self, tree):
        self.jobs[tree.job_id] = tree

    def remove(self, tree):
        self.jobs.pop(tree.job_id, None)

    def repair(self, trees):
        pass

    def close(self):
        pass


@pytest.fixture
def jobs(tmp_path):
    config = manager_config.parse({
        "manager": {"listen": "127.0.0.1:7070", "secret": SECRET, "lease_seconds": 30},
        "switch": {"grpc_addr": "127.0.0.1:9559"},
        "pool": {"slots": [0, 63], "job_ids": [1, 4],
                 "services": [{"ip": "10.0.0.250", "mac": "02:00:00:00:00:fa"},
                              {"ip": "10.0.0.251", "mac": "02:00:00:00:00:fb"}]},
        "fabric": {"hosts": [{"mac": mac, "switch_port": i + 1} for i, mac in enumerate(MACS)]},
    }, tmp_path)
    store = Store(tmp_path / "manager.db")
    yield Jobs(config, RecordingSwitch(), store)
    store.close()


def enter(jobs: Jobs, message: dict):
    request = parse(message)
    return jobs.register(request, jobs.member(request))


def running(jobs: Jobs, key: str, timeout_sweeps: int = 5):
    for _ in range(timeout_sweeps):
        if key in jobs.running:
            return jobs.running[key]
        jobs.sweep()
    raise AssertionError(f"{key} did not start: {jobs.listing(jobs.config.tenants['default'])}")


def test_another_tenant_with_the_same_name_gathers_a_job_of_its_own(jobs):
    a0 = register_message(0)
    enter(jobs, a0)
    # Tenant B, holding the manager's secret, registers rank 1 of "train" first.
    enter(jobs, register_message(1, credential=CRED_B, host=2))
    assert job_key("train", CRED_A) not in jobs.running
    enter(jobs, register_message(1))
    a = running(jobs, job_key("train", CRED_A))
    assert sorted(a.tokens) == [0, 1]
    members = {w.id: w.mac for w in a.tree.switches["switch"].job.workers}
    assert members == {0: MACS[0], 1: MACS[1]}          # not tenant B's host
    listing = jobs.listing(jobs.config.tenants["default"])
    waiting = listing["waiting"]
    assert [(w["name"], w["registered"]) for w in waiting] == [("train", [1])]
    # The listing names the tenant, nothing derived from a job's credential.
    assert [set(w) for w in waiting] == [{"name", "tenant", "registered", "world", "slots",
                                          "message", "priority"}]
    assert {j["tenant"] for j in listing["running"] + waiting} == {"default"}


def test_a_rank_registered_twice_is_refused_never_evicted(jobs):
    first = register_message(0)
    entered = enter(jobs, first)
    with pytest.raises(BadRequest, match="rank 0 of job train is already registered "
                                         r"\(from 10.0.0.1, 02:00:00:00:00:01\) and waiting"):
        enter(jobs, register_message(0, host=3))
    with jobs.cond:
        assert jobs.status(entered[0], 0, entered[1])[0] == "waiting"
    # The same client again (its connection broke): it takes its own place back.
    again = enter(jobs, first)
    with jobs.cond:
        assert jobs.status(entered[0], 0, entered[1])[0] == "refused"   # the old connection
        assert jobs.status(again[0], 0, again[1])[0] == "waiting"


def test_a_replayed_registration_gets_no_token_and_a_lease_needs_its_own(jobs):
    r0, r1 = register_message(0), register_message(1)
    enter(jobs, r0)
    enter(jobs, r1)
    key = job_key("train", CRED_A)
    a = running(jobs, key)
    # A member that knows rank 1's addresses (the job's config lists them) but not its
    # token: it waits for the running job to end, and gets nothing of it.
    replay = enter(jobs, {**r1, "token": secrets.token_hex(16)})
    with jobs.cond:
        assert jobs.status(replay[0], 1, replay[1])[0] == "waiting"
    assert "ready" not in str(replay[0].outcome)
    stolen = secrets.token_hex(16)
    assert jobs.lease(parse({"op": "renew", "job": key, "rank": 1, "token": stolen})) \
        .startswith("job train has no rank 1 with this lease")
    assert jobs.lease(parse({"op": "close", "job": key, "rank": 1, "token": stolen})) is not None
    assert 1 not in a.closed
    # The rank itself, with its own token.
    assert jobs.lease(parse({"op": "renew", "job": key, "rank": 1, "token": r1["token"]})) is None
    # Its own retried registration gets the same job back.
    again = enter(jobs, r1)
    assert again[0].outcome == ("ready", a)
    # Another tenant's key and the right token: no such job.
    other = job_key("train", CRED_B)
    assert jobs.lease(parse({"op": "renew", "job": other, "rank": 1, "token": r1["token"]})) \
        is not None


def test_the_database_holds_token_hashes_only(jobs, tmp_path):
    r0, r1 = register_message(0), register_message(1)
    enter(jobs, r0)
    enter(jobs, r1)
    running(jobs, job_key("train", CRED_A))
    text = (tmp_path / "manager.db").read_bytes() + b"".join(
        p.read_bytes() for p in tmp_path.glob("manager.db-*"))
    for message in (r0, r1):
        assert message["token"].encode() not in text
        assert token_hash(message["token"]).encode() in text
    assert CRED_A.encode() not in text


def nonce_of(frames) -> str:
    from scapy.layers.l2 import Ether

    from innet_aggregation.p4src import protocol
    ((_, _, frame),) = frames
    return protocol.proof_payload(bytes(Ether(frame)["UDP"].payload))[0]


def test_a_port_proof_is_the_nonce_sent_to_that_host_once_and_in_time(jobs, monkeypatch):
    from scapy.layers.l2 import Ether

    from innet_aggregation.switch_ctl.manager import proof as proof_mod
    proofs = proof_mod.PortProofs(jobs.config)
    message = register_message(0)
    request = parse(message)
    member = jobs.member(request)
    ((switch, port, raw),) = proofs.challenge(request, member, PEER)
    frame = Ether(raw)
    # Out of the host's port, to the claimed host, from the pool's first service address.
    assert (switch, port) == ("switch", 1)
    assert (frame.dst, frame["IP"].dst, frame["UDP"].dport) == (MACS[0], "10.0.0.1", 40000)
    assert (frame.src, frame["IP"].src) == ("02:00:00:00:00:fa", "10.0.0.250")
    checksum = frame["IP"].chksum
    del frame["IP"].chksum
    assert Ether(bytes(frame))["IP"].chksum == checksum

    def echo(value, **change):
        return parse({**message, "proof": value, **change})

    with pytest.raises(BadRequest, match="echoed a wrong port proof: the nonce went to "
                                         "02:00:00:00:00:01 / 10.0.0.1 UDP 40000 through "
                                         "switch port 1"):
        proofs.check(echo("0" * 32), member)
    nonce = nonce_of(proofs.challenge(request, member, PEER))
    with pytest.raises(BadRequest, match="echoed a port proof the manager did not send"):
        proofs.check(echo(nonce, token=secrets.token_hex(16)), member)   # another client's
    nonce = nonce_of(proofs.challenge(request, member, PEER))
    assert proofs.check(echo(nonce), member) == member
    with pytest.raises(BadRequest, match="did not send"):
        proofs.check(echo(nonce), member)                                   # once only
    monkeypatch.setattr(proof_mod, "PROOF_SECONDS", -1.0)
    late = nonce_of(proofs.challenge(request, member, PEER))
    proofs.sent(request)                     # its time starts when the frames leave
    with pytest.raises(BadRequest, match="expired"):
        proofs.check(echo(late), member)


def test_a_host_the_fabric_does_not_list_is_learned_from_the_port_its_nonce_left(jobs):
    from scapy.layers.l2 import Ether

    from innet_aggregation.p4src import protocol
    from innet_aggregation.switch_ctl.manager import proof as proof_mod
    unlisted = {"ifname": "eth0", "ip": "10.0.0.9", "mac": "02:00:00:00:00:09"}
    message = {**register_message(0), "interfaces": [unlisted]}
    request = parse(message)
    with pytest.raises(BadRequest, match=r"is in the manager's fabric \(fabric.hosts\), and "
                                         r"the manager learns no hosts \(learn_hosts is off\)"):
        jobs.member(request)                            # learning is off by default
    jobs.config = dataclasses.replace(jobs.config, learn_hosts=True)
    proofs = proof_mod.PortProofs(jobs.config)
    member = jobs.member(request)
    assert (member.switch, member.switch_port) == ("", None)
    frames = proofs.challenge(request, member, PEER)
    assert [(s, p) for s, p, _ in frames] == [("switch", p) for p in (1, 2, 3, 4)]
    nonces = {p: protocol.proof_payload(bytes(Ether(f)["UDP"].payload))[0] for _, p, f in frames}
    assert len(set(nonces.values())) == 4              # each port its own
    proven = proofs.check(parse({**message, "proof": nonces[3]}), member)
    assert (proven.switch, proven.switch_port, proven.mac, proven.learned) == (
        "switch", 3, unlisted["mac"], True)
    # Two unlisted interfaces: which one to learn is the rank's to say.
    two = {**message, "interfaces": [unlisted, {**unlisted, "ifname": "eth1",
                                                "mac": "02:00:00:00:00:0a", "ip": "10.0.1.9"}]}
    with pytest.raises(BadRequest, match="name the data-plane interface with INA_IFNAME"):
        jobs.member(parse(two))


def test_a_nonce_that_arrives_after_the_rank_asked_again_still_proves_it(jobs):
    """A stalled switch delivers its PacketOuts when it resumes, oldest first: the
    rank may echo an earlier nonce of its own registration."""
    from innet_aggregation.switch_ctl.manager import proof as proof_mod
    proofs = proof_mod.PortProofs(jobs.config)
    message = register_message(0)
    request = parse(message)
    member = jobs.member(request)
    first = nonce_of(proofs.challenge(request, member, PEER))
    proofs.sent(request)
    nonce_of(proofs.challenge(request, member, PEER))        # the rank asked again
    proofs.sent(request)
    assert proofs.check(parse({**message, "proof": first}), member) == member


def test_a_wrong_echo_leaves_the_genuine_nonce_and_the_frame_is_tagged_for_its_registration(
        jobs):
    """A rank that echoed a forged nonce still proves itself with its own; the frame's
    tag is the registration's (wire.proof_tag), not another's with the same claim."""
    from scapy.layers.l2 import Ether

    from innet_aggregation.p4src import protocol
    from innet_aggregation.switch_ctl.manager import proof as proof_mod
    from innet_aggregation.switch_ctl.manager import tenants
    from innet_aggregation.switch_ctl.manager.wire import proof_tag
    proofs = proof_mod.PortProofs(jobs.config)
    message = register_message(0)
    request = parse(message)
    member = jobs.member(request)
    ((_, _, frame),) = proofs.challenge(request, member, PEER)
    nonce, tag = protocol.proof_payload(bytes(Ether(frame)["UDP"].payload))
    assert tag == proof_tag(request.token_hash, request.job, 0, nonce)
    other = parse({**message, "token": secrets.token_hex(16)})
    assert tag != proof_tag(other.token_hash, other.job, 0, nonce)
    for forged in ("0" * 32, secrets.token_hex(16)):
        with pytest.raises(BadRequest, match="echoed a wrong port proof"):
            proofs.check(parse({**message, "proof": forged}), member)
    assert proofs.check(parse({**message, "proof": nonce}), member) == member
    # A tenant's registration is keyed apart in the manager (tenants.scoped); its
    # rank computes the tag over the key it sent, and the frame carries that one.
    scoped = dataclasses.replace(request, job=tenants.scoped(request.job, "alice"))
    ((_, _, frame),) = proofs.challenge(scoped, member, PEER)
    nonce, tag = protocol.proof_payload(bytes(Ether(frame)["UDP"].payload))
    assert tag == proof_tag(request.token_hash, request.job, 0, nonce)


def test_a_flood_of_challenges_from_one_requester_drops_none_of_anothers(jobs):
    """5,000 claims from one address (over MAX_OUTSTANDING), then MAX_PER_REQUESTER
    from each of 70 more: the victim's one outstanding registration still proves."""
    from innet_aggregation.switch_ctl.manager import proof as proof_mod
    assert 70 * proof_mod.MAX_PER_REQUESTER > proof_mod.MAX_OUTSTANDING
    proofs = proof_mod.PortProofs(jobs.config)
    message = register_message(0)
    request = parse(message)
    member = jobs.member(request)
    nonce = nonce_of(proofs.challenge(request, member, PEER))
    flood = register_message(1, job="flood")
    flood_member = jobs.member(parse(flood))
    for n in range(5000):
        proofs.challenge(parse({**flood, "rank": n % 2, "job": f"flood-{n}"}), flood_member,
                         "198.18.0.66")
    for peer in range(70):
        for n in range(proof_mod.MAX_PER_REQUESTER):
            proofs.challenge(parse({**flood, "job": f"many-{peer}-{n}"}), flood_member,
                             f"198.18.1.{peer}")
    assert proofs.check(parse({**message, "proof": nonce}), member) == member


def test_a_learned_host_claims_no_service_mac_and_no_mac_another_port_has_shown(jobs):
    """With learn_hosts on: a pool service MAC is refused before any nonce leaves; a
    MAC a waiting rank has behind port 2 is refused at port 3; the job file gives a
    learned MAC no L2 route."""
    from innet_aggregation.switch_ctl.manager.placement import worker as _worker
    jobs.config = dataclasses.replace(jobs.config, learn_hosts=True)
    service = {"ifname": "eth0", "ip": "10.0.0.9", "mac": "02:00:00:00:00:fb"}
    with pytest.raises(BadRequest, match="rank 0's address 02:00:00:00:00:fb is a service "
                                         "address of the manager's pool"):
        jobs.member(parse({**register_message(0), "interfaces": [service]}))
    unlisted = [{"ifname": "eth0", "ip": "10.0.0.9", "mac": "02:00:00:00:00:09"}]

    def learned_at(port, **message):
        request = parse({**register_message(0, **message), "interfaces": unlisted})
        return request, dataclasses.replace(jobs.member(request), switch="switch",
                                            switch_port=port, learned=True)

    jobs.register(*learned_at(2, job="owner"))                  # waits for its rank 1
    jobs.register(*learned_at(2, job="owner-again"))            # the same port: fine
    with pytest.raises(BadRequest, match="rank 0 of job intruder was learned behind switch "
                                         "port 3 with MAC 02:00:00:00:00:09, which a rank the "
                                         "manager holds has behind switch port 2: a learned "
                                         "host may claim only a MAC no other port has shown"):
        jobs.register(*learned_at(3, job="intruder"))
    _, learned = learned_at(3)
    assert _worker(learned)["l2_route"] is False
    assert "l2_route" not in _worker(dataclasses.replace(learned, learned=False))


def test_learning_is_off_by_default_and_needs_the_proof(tmp_path):
    from innet_aggregation.switch_ctl import config as config_mod
    base = {"manager": {"listen": "127.0.0.1:7070", "secret": SECRET},
            "switch": {"grpc_addr": "127.0.0.1:9559"},
            "pool": {"services": [{"ip": "10.0.0.250", "mac": "02:00:00:00:00:fa"}]},
            "fabric": {"hosts": [{"mac": MACS[0], "switch_port": 1}]}}
    config = manager_config.parse(base, tmp_path)
    assert (config.prove_ports, config.learn_hosts) == (True, False)

    def problems(**manager):
        with pytest.raises(config_mod.ConfigError) as caught:
            manager_config.parse({**base, "manager": {**base["manager"], **manager}}, tmp_path)
        return caught.value.problems

    assert problems(learn_hosts=True, prove_ports=False) == [
        "manager.learn_hosts = true needs prove_ports = true: a host is learned from the "
        "port its nonce left by"]
    assert problems(learn_hosts="yes") == ["manager.learn_hosts must be true or false, not 'yes'"]
    job = {"switch": {"grpc_addr": "127.0.0.1:9559", "ports": [1]},
           "job": {"id": 1, "udp_port": 48864, "service_ip": "10.0.0.250",
                   "service_mac": "02:00:00:00:00:fa", "num_slots": 4,
                   "workers": [{"id": 0, "mac": MACS[0], "ip": "10.0.0.1", "udp_port": 40000,
                                "switch_port": 1, "l2_route": False}]}}
    assert config_mod.parse(job).job.workers[0].l2_route is False
    job["job"]["workers"][0]["l2_route"] = 0
    with pytest.raises(config_mod.ConfigError, match=r"job.workers\[0\].l2_route must be true "
                                                     r"or false, not 0"):
        config_mod.parse(job)
