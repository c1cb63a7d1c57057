"""The port proof and host learning under attack (issue 46): a real manager (TLS) and
the embedded switch, ranks in namespaces, and the attackers as sockets this test
opens in other hosts' namespaces: a bystander forging proof datagrams at a rank's
proof port, a secret holder claiming the rank's address and flooding the manager
with claims, and an intruder (host 5, switch port 6) answering for another host's
MAC or a running job's service MAC. Hosts 6 and 7 are not in the fabric map.
"""

from __future__ import annotations

import secrets
import socket
import threading
import time

import pytest
import tomli_w

from innet_aggregation.p4src import protocol
from innet_aggregation.switch_ctl.client import SwitchConnection
from innet_aggregation.switch_ctl.controller import Controller
from innet_aggregation.switch_ctl.controls import L2Forwarding, mac_str
from innet_aggregation.switch_ctl.manager.client import _Manager, _membership
from innet_aggregation.switch_ctl.manager.wire import job_key
from innet_aggregation.testbed.netns import in_netns, open_raw_socket

from .manager_harness import (SECRET, SERVICES, ManagerBed, credential_of,
                              nothing_left, skip_unless_runnable, until)

INTRUDER, THIRD = 5, 4
FRAMES = 20
ETHERTYPE = 0x88B5          # IEEE local experimental: plain L2, never aggregated


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    skip_unless_runnable()
    bed = ManagerBed(tmp_path_factory.mktemp("proof"), unlisted=(6, 7)).start()
    yield bed
    bed.stop()


@pytest.fixture(autouse=True)
def nothing_left_running(bed):
    yield
    nothing_left(bed)


@pytest.fixture
def learning(bed):
    """The manager restarted with learn_hosts = true, and back to the default after."""
    def restart(listener: dict) -> None:
        bed.listener = listener
        bed.config_path.write_text(tomli_w.dumps(bed.manager_config()))
        bed.kill_manager()
        bed.start_manager()
    restart({"learn_hosts": True})
    yield
    restart({})


def finished(ranks, timeout=60, calls=None):
    for r in ranks:
        assert r.wait(timeout) == 0, f"rank {r.rank}: {r.events()}\n{r.stderr[-3000:]}"
        results = [e for e in r.events() if e.get("event") == "call"]
        assert all(e["wrong"] == 0 for e in results)
        if calls is not None:
            assert len(results) == calls


def register(bed, host_mac: str, host_ip: str, udp_port: int, job: str, token: str,
             proof: str | None = None) -> list[dict]:
    """A registration from the root namespace claiming ``host_mac`` / ``host_ip``: every
    answer line, up to the first that is not ``waiting`` or 20 s of them."""
    message = {"op": "register", "job": job, "rank": 0, "world": 1,
               "interfaces": [{"ifname": "eth0", "ip": host_ip, "mac": host_mac}],
               "udp_port": udp_port, "credential": credential_of(job), "token": token,
               **({"proof": proof} if proof else {})}
    manager = _Manager(bed.address, SECRET, bed.tls.ca_cert)
    answers, deadline = [], time.monotonic() + 20
    for answer in manager.lines(message):
        answers.append(answer)
        if answer["status"] != "waiting" or time.monotonic() > deadline:
            break
    return answers


def l2_routes(bed) -> dict[str, int]:
    """The switch's mac_table: MAC -> port, read by a backup controller."""
    with SwitchConnection(bed.switch.grpc_addr, 0, (0, 1)) as conn:
        conn.load_p4info()
        control = Controller(conn).l2_forwarding
        return {mac_str(match["dst_mac"]): params["port"]
                for match, _, params, _ in control.entries(L2Forwarding.TABLE)}


def frames_reaching(bed, dst_mac: str, hosts: list[int]) -> dict[int, int]:
    """Of FRAMES plain frames host THIRD sends to ``dst_mac``, how many each host sees."""
    topo = bed.topology
    marker = secrets.token_bytes(16)
    sniffers = {i: open_raw_socket(topo.hosts[i].netns, "eth0") for i in hosts}
    sender = open_raw_socket(topo.hosts[THIRD].netns, "eth0")
    try:
        for sock in sniffers.values():
            sock.setblocking(False)
        frame = (bytes.fromhex(dst_mac.replace(":", ""))
                 + bytes.fromhex(topo.hosts[THIRD].mac.replace(":", ""))
                 + ETHERTYPE.to_bytes(2, "big") + marker + bytes(30))
        for _ in range(FRAMES):
            sender.send(frame)
            time.sleep(0.005)
        time.sleep(0.5)
        counts = {}
        for i, sock in sniffers.items():
            counts[i] = 0
            while True:
                try:
                    data = sock.recv(2048)
                except BlockingIOError:
                    break
                counts[i] += data[14:30] == marker and data[:6] == frame[:6]
        return counts
    finally:
        sender.close()
        for sock in sniffers.values():
            sock.close()


class Intruder:
    """Host INTRUDER's tenant, holding the manager's secret: it claims ``mac`` (with its
    own IP) from the root namespace, reads every frame that reaches its port (an
    AF_PACKET socket sees them whatever their MAC), echoes the nonce sent to its claim,
    and holds the job it gets."""

    def __init__(self, bed, mac: str, job: str):
        self.bed, self.mac, self.job = bed, mac, job
        self.host = bed.topology.hosts[INTRUDER]
        self.port = 40000 + secrets.randbelow(20000)
        self.token = secrets.token_hex(16)
        self.membership = None

    def claim(self) -> list[dict]:
        """Every answer of the claim and, if asked to prove it, of the echo."""
        sniffer = open_raw_socket(self.host.netns, "eth0")
        try:
            answers = register(self.bed, self.mac, self.host.ip, self.port, self.job,
                               self.token)
            if answers[-1]["status"] != "prove":
                return answers
            nonce = self._nonce(sniffer)
        finally:
            sniffer.close()
        assert nonce is not None, f"no nonce for {self.mac} reached the intruder's port"
        answers += register(self.bed, self.mac, self.host.ip, self.port, self.job,
                            self.token, nonce)
        if answers[-1]["status"] == "ready":
            manager = _Manager(self.bed.address, SECRET, self.bed.tls.ca_cert)
            self.membership = _membership(manager, self.job,
                                          job_key(self.job, credential_of(self.job)), 0,
                                          self.token, answers[-1])
        return answers

    def _nonce(self, sniffer: socket.socket) -> str | None:
        sniffer.settimeout(0.2)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                data = sniffer.recv(2048)
            except TimeoutError:
                continue
            udp = data[34:]
            text = udp[8:]
            if (data[:6] == bytes.fromhex(self.mac.replace(":", ""))
                    and data[12:14] == b"\x08\x00" and int.from_bytes(udp[2:4], "big") == self.port
                    and text.startswith(protocol.PROOF_MAGIC)):
                return text[len(protocol.PROOF_MAGIC):][:2 * protocol.PROOF_NONCE_BYTES].decode()
        return None

    def close(self) -> None:
        if self.membership is not None:
            self.membership.close()


def test_forged_proofs_at_a_ranks_port_never_break_its_registration(bed):
    """From host 5, forged proof datagrams (its own source, and the manager's spoofed,
    each in the proof's old and new shape) reach host 0's proof port from the moment
    it is bound, and a secret holder claims host 0's address at that port, so the
    manager itself sends nonces there for another registration: the rank ignores them
    all, proves itself and aggregates. Another job runs meanwhile: the switch floods
    frames to a MAC it has no route for once a job gave it its flood group."""
    topo = bed.topology
    release = bed.workdir / "release-b"
    other = bed.launch("job-b", [2, 3], "--reps", "1", "--hold", str(release))
    until(lambda: all(r.event("joined") for r in other), 60, "job-b joined")
    victim, forger = topo.hosts[0], topo.hosts[INTRUDER]
    service_ip, service_mac = SERVICES[0]
    with in_netns(forger.netns):
        plain = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    raw = open_raw_socket(forger.netns, "eth0")
    stop = threading.Event()
    found: dict[int, float] = {}        # the victim's UDP ports, and when forging began
    forged = [0]
    claims = []

    def forge() -> None:
        with in_netns(victim.netns):
            while not stop.is_set():
                with open("/proc/thread-self/net/udp") as table:
                    for line in table.read().splitlines()[1:]:
                        port = int(line.split()[1].split(":")[1], 16)
                        found.setdefault(port, time.monotonic())
                for port in found:
                    for tag in (b"", secrets.token_bytes(protocol.PROOF_TAG_BYTES)):
                        nonce = secrets.token_bytes(protocol.PROOF_NONCE_BYTES)
                        plain.sendto(protocol.PROOF_MAGIC + (nonce + tag).hex().encode(),
                                     (victim.ip, port))
                        raw.send(protocol.proof_frame(victim.mac, victim.ip, port, service_mac,
                                                      service_ip, nonce, tag))
                        forged[0] += 2
                time.sleep(0.003)

    def claim() -> None:
        """The secret holder: the manager's own nonces, for its claim, to that port."""
        until(lambda: found, 30, "the rank's proof port bound", interval=0.01)
        port = min(found)
        while not stop.is_set() and len(claims) < 80:
            claims.append(register(bed, victim.mac, victim.ip, port, "job-claim",
                                   secrets.token_hex(16))[-1]["status"])

    threads = [threading.Thread(target=forge, daemon=True),
               threading.Thread(target=claim, daemon=True)]
    for thread in threads:
        thread.start()
    try:
        ranks = bed.launch("job-f", [0], "--reps", "2")
        until(lambda: ranks[0].event("joined") or ranks[0].process.poll() is not None, 60,
              "the rank joined or gave up")
        joined_at = time.monotonic()
        finished(ranks, calls=2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
        plain.close()
        raw.close()
    release.touch()
    finished(other, calls=1)
    proof_port = min(found)
    assert found[proof_port] < joined_at and forged[0] > 0
    assert f"UDP {proof_port} through switch port {victim.switch_port}" in ranks[0].stderr
    assert claims and set(claims) == {"prove"}, claims


def test_a_wrong_echo_leaves_the_challenge_and_a_flood_of_claims_drops_none_of_it(bed):
    """Host 0's rank (this test, its sockets in host 0's namespace) echoes a wrong
    nonce first, then, after 80 claims from the root namespace (over the manager's
    64 per requester), its own: the job runs."""
    host = bed.topology.hosts[0]
    job, token = "job-w", secrets.token_hex(16)
    with in_netns(host.netns):
        proof = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        proof.bind(("0.0.0.0", 0))
        proof.settimeout(5)
        port = proof.getsockname()[1]

        def here(nonce=None):
            with in_netns(host.netns):        # from host 0's management address
                return register(bed, host.mac, host.ip, port, job, token, nonce)

        try:
            answers = here()
            assert answers[-1]["status"] == "prove", answers
            assert (answers[-1]["to"], answers[-1]["source"]) == (host.ip, SERVICES[0][0])
            nonce, _ = protocol.proof_payload(proof.recv(2048))
        finally:
            proof.close()
    answers = here(secrets.token_hex(protocol.PROOF_NONCE_BYTES))
    assert answers[-1]["status"] == "refused"
    assert "echoed a wrong port proof" in answers[-1]["error"]
    other = bed.topology.hosts[1]
    for n in range(80):
        assert register(bed, other.mac, other.ip, 40000 + n, f"job-flood-{n}",
                        secrets.token_hex(16))[-1]["status"] == "prove"
    answers = here(nonce)
    assert answers[-1]["status"] == "ready", answers
    manager = _Manager(bed.address, SECRET, bed.tls.ca_cert)
    assert manager.request({"op": "close", "job": job_key(job, credential_of(job)), "rank": 0,
                            "token": token}) == {"status": "ok"}


def test_without_learning_no_intruder_is_learned_and_frames_reach_their_owner(bed):
    """learn_hosts is off by default: the intruder's claims of unlisted host 7's MAC
    and of a running job's service MAC are refused before any nonce leaves; host 7
    gets every frame sent to it, and the running job stays exact."""
    topo = bed.topology
    release = bed.workdir / "release-s"
    running = bed.launch("job-s", [0, 1], "--reps", "2", "--hold", str(release))
    until(lambda: all(r.event("joined") for r in running), 60, "job-s joined")
    service_mac = running[0].event("joined")["service_mac"]
    intruders = [Intruder(bed, topo.hosts[7].mac, "job-x7"),
                 Intruder(bed, service_mac, "job-xs")]
    try:
        answers = [i.claim()[-1] for i in intruders]
        assert answers[0] == {"status": "refused", "error": (
            f"none of rank 0's interfaces (eth0 {topo.hosts[7].mac}) is in the manager's "
            f"fabric (fabric.hosts), and the manager learns no hosts (learn_hosts is off): is "
            f"INA_IFNAME the data-plane interface, and is this host behind the switch?")}
        assert answers[1] == {"status": "refused", "error": (
            f"rank 0's address {service_mac} is a service address of the manager's pool")}
        assert frames_reaching(bed, topo.hosts[7].mac, [7, INTRUDER])[7] == FRAMES
        routes = l2_routes(bed)
        assert topo.hosts[7].mac not in routes and service_mac not in routes
    finally:
        for i in intruders:
            i.close()
    release.touch()
    finished(running, calls=2)
    assert "learned that" not in bed.manager_log()


def test_with_learning_a_claim_redirects_no_frame(bed, learning):
    """learn_hosts = true: host 7 runs a learned job; the intruder's claim of idle host
    6's MAC is learned, but its job gets no L2 route: every frame a third host sends to
    host 6 or host 7 reaches it; its claim of host 7's MAC at its own port is refused
    (another port has shown it)."""
    topo = bed.topology
    release = bed.workdir / "release-v"
    victim = bed.launch("job-v", [7], "--reps", "1", "--hold", str(release),
                        extra_env={"INA_IFNAME": "eth0"})
    until(lambda: victim[0].event("joined"), 60, "job-v joined")
    seven, six = Intruder(bed, topo.hosts[7].mac, "job-x7"), Intruder(bed, topo.hosts[6].mac,
                                                                       "job-x6")
    try:
        assert six.claim()[-1]["status"] == "ready"
        assert (f"learned that {topo.hosts[6].mac} ({topo.hosts[INTRUDER].ip}) is behind switch "
                f"port {topo.hosts[INTRUDER].switch_port}") in bed.manager_log()
        for owner in (6, 7):
            assert frames_reaching(bed, topo.hosts[owner].mac, [owner])[owner] == FRAMES
        routes = l2_routes(bed)
        assert topo.hosts[6].mac not in routes and topo.hosts[7].mac not in routes
        answer = seven.claim()[-1]
        assert answer == {"status": "refused", "error": (
            f"rank 0 of job job-x7 was learned behind switch port "
            f"{topo.hosts[INTRUDER].switch_port} with MAC {topo.hosts[7].mac}, which a rank "
            f"the manager holds has behind switch port {topo.hosts[7].switch_port}: a learned "
            f"host may claim only a MAC no other port has shown")}
    finally:
        six.close()
        seven.close()
    release.touch()
    finished(victim, calls=1)
