"""The manager's service: a listener (TLS where the manager has a certificate, one
request per connection), a thread per request that carried a tenant's secret (or a
lease's token), and a sweeper that reclaims lapsed jobs and repairs the switches every
``sweep_seconds``, and does every switch write and read (at once when there is work:
``Jobs.wake``). The manager starts whether its switches answer or not: jobs wait
until the sweeper reaches them.

One thread reads every connection's TLS handshake and request line through a
selector, so an idle or slow client costs a descriptor and a buffer, never a
thread, and a flood cannot starve the renewals that keep jobs alive:

- at most ``max_connections`` are open besides the registrations waiting for their
  job, and ``max_connections_per_peer`` from one address still sending their request;
  a newcomer over either is turned away with one ``busy`` line (plaintext; on TLS it
  is closed: a line would cost a handshake), which clients retry. An address that
  presented a secret (or a live lease's token) in the last TRUSTED_SECONDS is not
  turned away for the total while a connection from an address that has not is still
  sending its request: the oldest of those makes room; else the address with the most
  connections still sending gives up its oldest, while it has more than the
  newcomer's. So neither a flood from addresses without a secret nor one from
  addresses with one costs a rank its renewal;
- a registration waiting for its job holds none of ``max_connections``: waiting
  registrations have caps of their own (jobs.py: in all, per address, per tenant)
  and end after ``join_seconds`` if their job has not filled;
- ``request_seconds`` bounds the handshake and the whole request line together
  (not each read);
- the line is checked by wire.decode_line (length, UTF-8, nesting, numbers) before
  it is parsed, then a registration's or listing's secret is compared (in constant
  time, with every tenant's: tenants.py) before anything else in it is looked at; a
  wrong one is refused, logged with the peer's address, and changes nothing. The
  request is the tenant's from then on: its job keys are scoped to it, a listing
  shows its jobs. A renewal or close carries no secret: its lease token proves it,
  and it reaches only the job (so the tenant) that token registered in (wire.py says
  who may act for a job);
- accept errors never end the listener: out of descriptors (EMFILE, ENFILE) or
  memory it pauses accepting for ACCEPT_BACKOFF at a time, and a thread that cannot
  start turns its request away ``busy``.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import resource
import selectors
import socket
import ssl
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from innet_aggregation.addresses import is_loopback

from ..client import P4RuntimeError
from .config import ManagerConfig
from .installer import Switches
from .jobs import TICK, Jobs
from .records import Member, Pending
from .metrics import serve_metrics
from .proof import PortProofs
from .store import Store
from .tenants import Tenant, identify, scoped
from .wire import (MAX_LINE, BadRequest, Lease, Register, decode_line, encode, needs_secret,
                   parse, secret_of)

log = logging.getLogger("innet_aggregation.manager")
PROGRESS_EVERY = 1.0
TRUSTED_SECONDS = 600.0     # an address that presented the secret (or a live lease's
                            # token) is trusted this long
ACCEPT_BACKOFF = 0.1        # seconds without accepting when descriptors or memory run out
ACCEPTS_PER_WAKE = 64       # then the connections already open get their turn
SPARE_FILES = 64            # descriptors beyond max_connections: the database, gRPC, logs
TALLY_EVERY = 1.0           # refusals are logged as counts at most this often
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


@dataclass(eq=False)
class _Incoming:
    """A connection still sending its request (or its TLS handshake)."""
    sock: socket.socket
    peer: str
    where: str
    deadline: float
    handshaken: bool
    line: bytearray = field(default_factory=bytearray)


class Manager:
    def __init__(self, config: ManagerConfig):
        self.config = config
        self.store = Store(config.database)
        self.installer = Switches(config.switches)
        self.jobs = Jobs(config, self.installer, self.store)
        self.proofs = PortProofs(config)
        self.tls: ssl.SSLContext | None = None
        if config.cert is not None:
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls.minimum_version = ssl.TLSVersion.TLSv1_2
            self.tls.load_cert_chain(config.cert, config.key)
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        # The listener thread's alone: connections sending their request, oldest first
        # (deadlines in the same order), how many per address, the trusted addresses.
        self._incoming: dict[_Incoming, None] = {}
        self._per_peer: Counter[str] = Counter()
        self._trusted: dict[str, float] = {}
        self._refused: Counter[tuple[str, str]] = Counter()    # (kind, address)
        self._tallied = time.monotonic()
        self._starved_since: float | None = None    # accept() out of descriptors or memory
        self._open = 0              # every open connection, the request threads' too
        self._parked = 0            # of them, registrations waiting for their job
        # Connections the descriptors can hold while SPARE_FILES stay free, where
        # RLIMIT_NOFILE holds fewer than max_connections (_descriptors); else None.
        self._room: int | None = None
        self._open_lock = threading.Lock()
        self.tally = self.jobs.tally         # what the metrics count (metrics.py)
        self._metrics = None                 # their server, where manager.metrics is set

    def start(self) -> "Manager":
        self.jobs.restore()          # the database only: the sweeper reaches the switches
        host, port = self.config.listen
        self._descriptors()
        self._sock = socket.create_server((host, port), reuse_port=False, backlog=128)
        self._sock.setblocking(False)
        for target, name in ((self._listen, "manager-listen"), (self._sweep, "manager-sweep")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("job manager listening on %s:%d (%s), switch%s %s, lease %g s, database %s",
                 host, self._sock.getsockname()[1], "TLS" if self.tls else "plaintext",
                 "es" * (self.config.tree is not None),
                 ", ".join(sw.grpc_addr if self.config.tree is None else f"{n} {sw.grpc_addr}"
                           for n, sw in self.config.switches.items()),
                 self.config.lease_seconds, self.config.database)
        if self.tls is None and not is_loopback(host):
            log.warning("the listener on %s takes the secret in plaintext from the network "
                        "(manager.insecure = true): anyone on the path can read it", host)
        if self.config.metrics is not None:
            self._metrics = serve_metrics(self, self.config.metrics)
            log.info("Prometheus metrics on %s%s", self.config.metrics,
                     " (TLS)" if self.tls else "")
        return self

    def _descriptors(self) -> None:
        """RLIMIT_NOFILE raised (to its hard limit at most) to hold max_connections and
        max_pending waiting registrations, and never all of it taken by connections:
        the database, gRPC (which aborts the process when it cannot make an epoll set)
        and the program files keep a share."""
        need = self.config.max_connections + self.config.max_pending + SPARE_FILES
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY or soft >= need:
            return
        soft = need if hard == resource.RLIM_INFINITY else min(need, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if soft < need:
            spare = min(SPARE_FILES, soft // 2)
            self._room = max(1, soft - spare)
            log.warning("RLIMIT_NOFILE's hard limit %d holds fewer than manager.max_connections "
                        "%d connections and max_pending %d waiting registrations (and %d "
                        "other files): the listener holds at most %d and accepts no more "
                        "until some close", hard, self.config.max_connections,
                        self.config.max_pending, SPARE_FILES, self._room)

    @property
    def port(self) -> int:
        return self._sock.getsockname()[1]

    def stop(self) -> None:
        self._stop.set()
        self.jobs.wake.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
        if self._metrics is not None:
            self._metrics.shutdown()
        self.installer.close()
        self.store.close()

    def wait(self) -> None:
        while not self._stop.wait(1.0):
            pass

    # -- the listener --------------------------------------------------------------
    def _listen(self) -> None:
        selector = selectors.DefaultSelector()
        paused_until = 0.0      # accepting paused (out of descriptors or memory) until then
        try:
            while not self._stop.is_set():
                self.jobs.alive()       # leases never run out on the manager's own stalls
                try:
                    now = time.monotonic()
                    listening = self._sock.fileno() in selector.get_map()
                    if not listening and now >= paused_until:
                        selector.register(self._sock, selectors.EVENT_READ)
                        listening = True
                    wakes = [self._tallied + TALLY_EVERY, now + TICK]
                    if not listening:
                        wakes.append(paused_until)
                    if self._incoming:
                        wakes.append(next(iter(self._incoming)).deadline)
                    for key, _ in selector.select(max(0.0, min(wakes) - now)):
                        if key.data is not None:
                            self._readable(selector, key.data)
                            continue
                        if self._accept(selector):
                            selector.unregister(self._sock)
                            paused_until = time.monotonic() + ACCEPT_BACKOFF
                    self._expire(selector, time.monotonic())
                except Exception:
                    log.exception("listener: going on after an unexpected error")
                    time.sleep(ACCEPT_BACKOFF)
        finally:
            for incoming in list(self._incoming):
                self._drop(selector, incoming)
            selector.close()

    def _accept(self, selector) -> bool:
        """Admit what is waiting; True when accept() ran out of descriptors or memory,
        for the listener to pause."""
        for _ in range(ACCEPTS_PER_WAKE):
            if self._room is not None and self._open >= self._room:   # the rest wait in the backlog
                if self._starved_since is None:
                    log.warning("listener: %d connections hold the descriptors RLIMIT_NOFILE "
                                "leaves them; pausing %g s at a time until some close",
                                self._open, ACCEPT_BACKOFF)
                    self._starved_since = time.monotonic()
                return True
            try:
                sock, address = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                if self._starved_since is not None:
                    log.warning("listener: accepting again after %.1f s short of descriptors "
                                "or memory", time.monotonic() - self._starved_since)
                    self._starved_since = None
                return False
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    log.warning("listener: accepting a connection failed: %s", exc)
                    continue
                if self._starved_since is None:
                    log.warning("listener: accepting failed: %s; pausing %g s at a time until "
                                "it passes", exc, ACCEPT_BACKOFF)
                    self._starved_since = time.monotonic()
                return True
            try:
                self._admit(selector, sock, address)
            except Exception:
                log.exception("listener: admitting %s failed", address)
                sock.close()
        return False

    def _admit(self, selector, sock: socket.socket, address) -> None:
        """Take the connection in, or turn it away over a cap."""
        sock.setblocking(False)
        peer = address[0]
        if self._per_peer[peer] >= self.config.max_connections_per_peer:
            self._turn_away(sock, peer, "busy", "max_connections_per_peer",
                            f"{peer} has {self._per_peer[peer]} connections still sending "
                            f"their request (the manager's max_connections_per_peer)")
            return
        if (self._open - self._parked >= self.config.max_connections
                and not self._make_room(selector, peer)):
            self._turn_away(sock, peer, "busy", "max_connections",
                            f"the manager holds its {self.config.max_connections} connections "
                            f"(max_connections)")
            return
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        incoming = _Incoming(sock, peer, f"{peer}:{address[1]}",
                             time.monotonic() + self.config.request_seconds,
                             handshaken=self.tls is None)
        with self._open_lock:
            self._open += 1
        self._incoming[incoming] = None
        self._per_peer[peer] += 1
        try:
            selector.register(sock, selectors.EVENT_READ, incoming)
        except Exception:
            self._drop(selector, incoming)
            raise

    def _make_room(self, selector, peer: str) -> bool:
        """Room for a newcomer from an address that presented a secret: the oldest
        connection still sending its request from one that has not is turned away, else
        the oldest of the address with the most, while it has more than the newcomer's
        (False: there is none)."""
        now = time.monotonic()
        if self._trusted.get(peer, 0.0) < now:
            return False
        victim = next((i for i in self._incoming if self._trusted.get(i.peer, 0.0) < now), None)
        if victim is None:
            crowded = max(self._per_peer, key=self._per_peer.__getitem__, default=None)
            if crowded is None or self._per_peer[crowded] <= self._per_peer[peer] + 1:
                return False
            victim = next(i for i in self._incoming if i.peer == crowded)
        self._refuse(selector, victim, "busy", "made room for an address with a secret",
                     f"the manager holds its {self.config.max_connections} connections "
                     f"(max_connections), and this one, without a request yet, made room")
        return True

    def _readable(self, selector, incoming: _Incoming) -> None:
        """The TLS handshake a step on, or more of the request line."""
        if not incoming.handshaken:
            try:
                incoming.sock.do_handshake()
            except ssl.SSLWantReadError:
                return _want(selector, incoming, selectors.EVENT_READ)
            except ssl.SSLWantWriteError:
                return _want(selector, incoming, selectors.EVENT_WRITE)
            except (ssl.SSLEOFError, ConnectionError):
                self._refused["closed in the TLS handshake", incoming.peer] += 1
                return self._drop(selector, incoming)
            except OSError as exc:
                log.warning("%s: TLS handshake failed: %s", incoming.where, exc)
                return self._drop(selector, incoming)
            incoming.handshaken = True
        _want(selector, incoming, selectors.EVENT_READ)
        line = incoming.line
        while True:
            try:
                chunk = incoming.sock.recv(MAX_LINE + 1 - len(line))
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
                return
            except ssl.SSLWantWriteError:
                return _want(selector, incoming, selectors.EVENT_WRITE)
            except OSError as exc:
                log.info("%s: connection ended: %s", incoming.where, exc)
                return self._drop(selector, incoming)
            if not chunk:
                if line:
                    log.info("%s: closed after %d bytes, before its request line ended",
                             incoming.where, len(line))
                return self._drop(selector, incoming)
            line += chunk
            end = line.find(b"\n", len(line) - len(chunk))
            if end >= 0:
                return self._complete(selector, incoming, bytes(line[:end + 1]))
            if len(line) > MAX_LINE:
                why = f"malformed request: a request is one JSON line of at most {MAX_LINE} bytes"
                log.warning("%s: refused: %s", incoming.where, why)
                self.tally.count(self.tally.refusals, "malformed")
                return self._refuse(selector, incoming, "refused", None, why)

    def _complete(self, selector, incoming: _Incoming, line: bytes) -> None:
        """A whole request line: refused, or handed to a thread of its own."""
        self._forget(selector, incoming)
        sock, where = incoming.sock, incoming.where
        tenant = None
        try:
            message = decode_line(line)
            if needs_secret(message):
                tenant = identify(self.config.tenants, secret_of(message))
                if tenant is None:
                    self.tally.count(self.tally.refusals, "wrong_secret")
                    log.warning("%s: refused a request with a wrong secret", where)
                    return self._end(sock, status="refused",
                                     error="wrong secret: no tenant of this manager has "
                                           "INA_SECRET (or INA_SECRET_FILE's) as its secret")
                self._trusted[incoming.peer] = time.monotonic() + TRUSTED_SECONDS
            request = parse(message)
            if isinstance(request, Register):
                request = dataclasses.replace(request, job=scoped(request.job, tenant.name))
        except BadRequest as exc:
            self.tally.count(self.tally.refusals, "malformed")
            log.warning("%s: refused a malformed request: %s", where, exc)
            return self._end(sock, status="refused", error=f"malformed request: {exc}")
        # Blocking from here, the timeout for sends only: a registration waits unbounded.
        sock.settimeout(self.config.request_seconds)
        try:
            threading.Thread(target=self._serve,
                             args=(sock, incoming.peer, where, request, tenant),
                             daemon=True,
                             name=f"manager-{where}").start()
        except RuntimeError as exc:
            log.error("%s: no thread for its request: %s", where, exc)
            sock.setblocking(False)
            self._end(sock, status="busy", error=f"the manager cannot start a thread for the "
                                                 f"request now: {exc}")

    def _expire(self, selector, now: float) -> None:
        """Cut the connections past their deadline; log the tally of refusals."""
        while self._incoming:
            incoming = next(iter(self._incoming))
            if incoming.deadline > now:
                break
            self._refuse(selector, incoming, "busy", "cut at request_seconds",
                         f"no complete request within {self.config.request_seconds:g} s "
                         f"(the manager's request_seconds)")
        if now - self._tallied < TALLY_EVERY:
            return
        if self._refused:
            peers: dict[str, set[str]] = {}
            for kind, peer in self._refused:
                peers.setdefault(kind, set()).add(peer)
            log.warning("listener, the last %.0f s: %s", now - self._tallied, "; ".join(
                f"{kind}: {sum(n for (k, _), n in self._refused.items() if k == kind)} "
                f"connections from {len(addresses)} addresses ({', '.join(sorted(addresses)[:3])}"
                f"{', ...' * (len(addresses) > 3)})" for kind, addresses in peers.items()))
            self._refused.clear()
        self._tallied = now
        self._trusted = {peer: until for peer, until in self._trusted.items() if until > now}

    def _refuse(self, selector, incoming: _Incoming, status: str, kind: str | None,
                why: str) -> None:
        """One line saying why (once its TLS handshake is done), then closed; ``kind``
        counts it in the tally."""
        self._forget(selector, incoming)
        if kind is not None:
            self._refused[kind, incoming.peer] += 1
            self.tally.count(self.tally.refusals, "busy")
        if incoming.handshaken:
            self._end(incoming.sock, status=status, error=why)
        else:
            incoming.sock.close()
            self._count_closed()

    def _turn_away(self, sock: socket.socket, peer: str, status: str, kind: str,
                   why: str) -> None:
        """A connection not taken in: one line (plaintext), then closed."""
        self._refused[kind, peer] += 1
        self.tally.count(self.tally.refusals, "busy")
        if self.tls is None:
            _say(sock, {"status": status, "error": why})
        sock.close()

    def _end(self, sock: socket.socket, **message) -> None:
        _say(sock, message)
        sock.close()
        self._count_closed()

    def _drop(self, selector, incoming: _Incoming) -> None:
        self._forget(selector, incoming)
        incoming.sock.close()
        self._count_closed()

    def _forget(self, selector, incoming: _Incoming) -> None:
        """Out of the listener's hands (still open, still counted)."""
        if incoming in self._incoming:
            del self._incoming[incoming]
            self._per_peer[incoming.peer] -= 1
            if not self._per_peer[incoming.peer]:
                del self._per_peer[incoming.peer]
        try:
            selector.unregister(incoming.sock)
        except (KeyError, ValueError):
            pass

    def _count_closed(self) -> None:
        with self._open_lock:
            self._open -= 1

    # -- threads -------------------------------------------------------------------
    def _sweep(self) -> None:
        while True:
            self.jobs.wake.wait(self.config.sweep_seconds)
            self.jobs.wake.clear()
            if self._stop.is_set():
                return
            try:
                self.jobs.sweep()
            except Exception:
                log.exception("sweep failed")

    def _serve(self, conn: socket.socket, peer: str, where: str, request,
               tenant: Tenant | None) -> None:
        try:
            with conn:
                self._request(conn, peer, where, request, tenant)
        except OSError as exc:
            log.info("%s: connection ended: %s", where, exc)
        except Exception:
            log.exception("%s: request failed", where)
        finally:
            self._count_closed()

    def _request(self, conn: socket.socket, peer: str, where: str, request,
                 tenant: Tenant | None) -> None:
        def reply(**message) -> None:
            conn.sendall(encode(message))

        started = time.monotonic()
        if request == "jobs":
            reply(status="ok", **self.jobs.listing(tenant))
            self.tally.request("jobs", time.monotonic() - started)
        elif isinstance(request, Lease):
            why = self.jobs.lease(request)
            if why is None:     # a live lease's token: as good as the secret for room
                self._trusted[peer] = time.monotonic() + TRUSTED_SECONDS
            else:
                self.tally.count(self.tally.refusals, "lease")
            reply(**({"status": "ok"} if why is None else {"status": "refused", "error": why}))
            self.tally.request(request.op, time.monotonic() - started)
        else:
            self._register(request, reply, peer, where)

    def _register(self, request: Register, reply, peer: str, where: str) -> None:
        try:
            member = self.jobs.member(request)
            if self.config.prove_ports:
                if request.proof is None:
                    self._challenge(request, member, reply, peer)
                    return
                proven = self.proofs.check(request, member)
                if member.switch_port is None:
                    log.info("%s: learned that %s (%s) is behind %s port %d", where, proven.mac,
                             proven.ip, proven.switch, proven.switch_port)
                member = proven
            pending, generation = self.jobs.register(request, member, peer)
        except BadRequest as exc:
            self.tally.count(self.tally.refusals, "registration")
            log.warning("%s: registration refused: %s", where, exc)
            reply(status="refused", error=str(exc))
            return
        self._park(1)       # the caps on waiting registrations hold it now
        try:
            self._await(pending, member, generation, reply)
        except OSError:
            self.jobs.withdraw(pending, member.rank, generation)
            raise
        finally:
            self._park(-1)

    def _park(self, change: int) -> None:
        with self._open_lock:
            self._parked += change

    def _challenge(self, request: Register, member: Member, reply, peer: str) -> None:
        """Send the port proof's nonce through the switch (one out of every host port
        for a host to learn); the rank registers again with it (proof.py). The answer
        says where it went and where from: the rank takes no datagram but that one."""
        frames = self.proofs.challenge(request, member, peer)
        try:
            for switch, port, frame in frames:
                self.installer.send_frame(switch, port, frame)
        except (P4RuntimeError, ValueError) as exc:
            reply(status="waiting", message=f"waiting for the switch to send the port proof: "
                                            f"{exc}")
            return
        self.proofs.sent(request)
        where = (f"through {member.switch} port {member.switch_port}"
                 if member.switch_port is not None
                 else f"out of each of {len(frames)} host ports, to learn its port")
        reply(status="prove", to=member.ip, source=self.proofs.source_ip,
              message=f"a nonce went to {member.mac} / {member.ip} UDP {member.udp_port} "
                      f"{where}: register again with it")

    def _await(self, pending: Pending, member: Member, generation: int, reply) -> None:
        """Progress lines until the job runs or is refused; a rank that hangs up is
        withdrawn (the write fails)."""
        cond = self.jobs.cond
        last = 0.0
        while True:
            with cond:
                state, value = self.jobs.status(pending, member.rank, generation)
                if state == "waiting" and time.monotonic() - last < PROGRESS_EVERY:
                    cond.wait(PROGRESS_EVERY)
                    state, value = self.jobs.status(pending, member.rank, generation)
            if state == "ready":
                reply(status="ready", config=value.raw, lease_seconds=self.config.lease_seconds)
                return
            if state == "refused":
                reply(status="refused", error=value)
                return
            if time.monotonic() - last >= PROGRESS_EVERY:
                reply(status="waiting", message=value)
                last = time.monotonic()
            if self._stop.is_set():
                return


def _want(selector, incoming: _Incoming, events: int) -> None:
    """Wait for ``events`` on the connection (a TLS step may need to write)."""
    if selector.get_key(incoming.sock).events != events:
        selector.modify(incoming.sock, events, incoming)


def _say(sock: socket.socket, message: dict) -> None:
    """One line, without waiting: what the peer sent and nobody read is taken first, or
    closing would reset the connection and the peer might lose the line."""
    try:
        sock.recv(MAX_LINE)
    except OSError:
        pass
    try:
        sock.send(encode(message))
    except OSError:
        pass
