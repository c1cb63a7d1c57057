"""The manager's service: a TCP listener (TLS where the manager has a certificate),
one thread per connection and one request per connection, and a sweeper that
reclaims lapsed jobs and repairs the switches every ``sweep_seconds``, and does every
switch write and read (at once when there is work: ``Jobs.wake``). The manager
starts whether its switches answer or not: jobs wait until the sweeper reaches them.

Every request's secret is compared (in constant time) before anything else is
read from it; a wrong one is refused, logged with the peer's address, and changes
nothing.
"""

from __future__ import annotations

import hmac
import logging
import socket
import ssl
import threading
import time

from .config import ManagerConfig
from .installer import Switches
from .jobs import TICK, Jobs, Member, Pending
from .store import Store
from .wire import MAX_LINE, BadRequest, Lease, Register, decode_line, encode, parse, secret_of

log = logging.getLogger("innet_aggregation.manager")
READ_TIMEOUT = 10.0
PROGRESS_EVERY = 1.0


class Manager:
    def __init__(self, config: ManagerConfig):
        self.config = config
        self.store = Store(config.database)
        self.installer = Switches(config.switches)
        self.jobs = Jobs(config, self.installer, self.store)
        self.tls: ssl.SSLContext | None = None
        if config.cert is not None:
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls.minimum_version = ssl.TLSVersion.TLSv1_2
            self.tls.load_cert_chain(config.cert, config.key)
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._threads: list[threading.Thread] = []

    def start(self) -> "Manager":
        self.jobs.restore()          # the database only: the sweeper reaches the switches
        host, port = self.config.listen
        self._sock = socket.create_server((host, port), reuse_port=False, backlog=128)
        self._sock.settimeout(TICK)
        for target, name in ((self._accept, "manager-accept"), (self._sweep, "manager-sweep")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("job manager listening on %s:%d (%s), switch%s %s, lease %g s, database %s",
                 host, self._sock.getsockname()[1], "TLS" if self.tls else "plaintext",
                 "es" * (self.config.tree is not None),
                 ", ".join(sw.grpc_addr if self.config.tree is None else f"{n} {sw.grpc_addr}"
                           for n, sw in self.config.switches.items()),
                 self.config.lease_seconds, self.config.database)
        return self

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
        self.installer.close()
        self.store.close()

    def wait(self) -> None:
        while not self._stop.wait(1.0):
            pass

    # -- threads -------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop.is_set():
            self.jobs.alive()
            try:
                conn, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                raise
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True,
                             name=f"manager-{peer[0]}:{peer[1]}").start()

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

    def _serve(self, conn: socket.socket, peer) -> None:
        where = f"{peer[0]}:{peer[1]}"
        conn.settimeout(READ_TIMEOUT)
        try:
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except (ssl.SSLError, OSError) as exc:
                    log.warning("%s: TLS handshake failed: %s", where, exc)
                    return
            with conn, conn.makefile("rb") as reader:
                self._request(conn, reader.readline(MAX_LINE + 1), where)
        except OSError as exc:
            log.info("%s: connection ended: %s", where, exc)
        except Exception:
            log.exception("%s: request failed", where)

    def _request(self, conn: socket.socket, line: bytes, where: str) -> None:
        def reply(**message) -> None:
            conn.sendall(encode(message))

        try:
            message = decode_line(line)
            if not hmac.compare_digest(secret_of(message), self.config.secret):
                log.warning("%s: refused a request with a wrong secret", where)
                reply(status="refused", error="wrong secret: this manager's secret is not "
                                              "INA_SECRET (or INA_SECRET_FILE's)")
                return
            request = parse(message)
        except BadRequest as exc:
            log.warning("%s: refused a malformed request: %s", where, exc)
            reply(status="refused", error=f"malformed request: {exc}")
            return
        if request == "jobs":
            reply(status="ok", **self.jobs.listing())
        elif isinstance(request, Lease):
            why = self.jobs.lease(request)
            reply(**({"status": "ok"} if why is None else {"status": "refused", "error": why}))
        else:
            self._register(request, reply, where)

    def _register(self, request: Register, reply, where: str) -> None:
        try:
            member = self.jobs.member(request)
            pending, generation = self.jobs.register(request, member)
        except BadRequest as exc:
            log.warning("%s: registration refused: %s", where, exc)
            reply(status="refused", error=str(exc))
            return
        try:
            self._await(pending, member, generation, reply)
        except OSError:
            self.jobs.withdraw(pending, member.rank, generation)
            raise

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
                reply(status="ready", token=value.tokens[member.rank], config=value.raw,
                      lease_seconds=self.config.lease_seconds)
                return
            if state == "refused":
                reply(status="refused", error=value)
                return
            if time.monotonic() - last >= PROGRESS_EVERY:
                reply(status="waiting", message=value)
                last = time.monotonic()
            if self._stop.is_set():
                return
