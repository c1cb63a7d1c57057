"""The job manager's Prometheus metrics (``[manager] metrics``): its jobs by state and
tenant and the pool's use, read from its state at each scrape, and what it counted
(``Tally``): lease renewals and expiries, preemptions, refusals by reason, and how
long requests took. Whoever reaches the port learns every tenant's jobs, so it is a
loopback address unless the manager has a certificate (then served over TLS).
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter

from innet_aggregation.addresses import is_loopback
from innet_aggregation.metrics import listen_address, serve

from .tenants import tenant_of

# A request's time, seconds: a renewal on loopback to a manager stuck behind its lock.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0)
# Why a connection or request was refused: the label's values.
REASONS = ("wrong_secret", "malformed", "registration", "lease", "busy")


class Tally:
    """What the manager counts for its metrics; any thread may count."""

    def __init__(self):
        self.lock = threading.Lock()
        self.renewals: Counter[str] = Counter()       # by tenant
        self.expiries: Counter[str] = Counter()       # jobs reclaimed, by tenant
        self.preemptions: Counter[str] = Counter()    # jobs preempted, by tenant
        self.refusals: Counter[str] = Counter()       # by REASONS
        self.latency: dict[str, list] = {}            # op -> [per bucket counts, sum]

    def count(self, what: Counter, key: str, n: int = 1) -> None:
        with self.lock:
            what[key] += n

    def request(self, op: str, seconds: float) -> None:
        """One request of ``op`` took ``seconds``: into its bucket (the last past every
        bound), and its sum."""
        with self.lock:
            counts, total = self.latency.get(op) or ([0] * (len(LATENCY_BUCKETS) + 1), 0.0)
            counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
            self.latency[op] = [counts, total + seconds]


def pool_use(jobs) -> dict[str, int]:
    """Of the pool, what the jobs held now take (under ``jobs.cond``)."""
    pool, held = jobs.config.pool, jobs._held()
    pool_ips = {s.ip for s in pool.services}
    slots = sum(max(0, min(h.first_slot + h.num_slots, pool.slots.stop)
                    - max(h.first_slot, pool.slots.start))
                for h in held if h.first_slot is not None and h.num_slots is not None)
    return {"job_ids": len({h.job_id for h in held} & set(pool.job_ids)),
            "slots": slots,
            "udp_ports": len({h.udp_port for h in held} & set(pool.udp_ports)),
            "services": len({ip for h in held for ip in (h.service_ip, *h.more_services)}
                            & pool_ips)}


class ManagerCollector:
    """prometheus_client's custom collector over a running manager."""

    def __init__(self, manager):
        self.manager = manager

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)

        jobs, tally = self.manager.jobs, self.manager.tally
        states = GaugeMetricFamily("ina_manager_jobs", "Jobs by state and tenant",
                                   labels=["state", "tenant"])
        with jobs.cond:
            by = Counter()
            for state, held in (("waiting", jobs.pending), ("installing", jobs.installing),
                                ("running", jobs.running), ("removing", jobs.removing)):
                for name in held:
                    by[state, tenant_of(name)] += 1
            used = pool_use(jobs)
        for (state, tenant), n in sorted(by.items()):
            states.add_metric([state, tenant], n)
        yield states
        pool = jobs.config.pool
        size = GaugeMetricFamily("ina_manager_pool_size", "The pool's size, by resource",
                                 labels=["resource"])
        in_use = GaugeMetricFamily("ina_manager_pool_used", "Of the pool, what jobs hold "
                                   "(the manager's and any the switch holds besides), by "
                                   "resource", labels=["resource"])
        for resource, total in (("job_ids", len(pool.job_ids)), ("slots", len(pool.slots)),
                                ("udp_ports", len(pool.udp_ports)),
                                ("services", len(pool.services))):
            size.add_metric([resource], total)
            in_use.add_metric([resource], used[resource])
        yield size
        yield in_use
        with tally.lock:
            renewals, expiries = dict(tally.renewals), dict(tally.expiries)
            preemptions, refusals = dict(tally.preemptions), dict(tally.refusals)
            latency = {op: (list(c), s) for op, (c, s) in tally.latency.items()}
        for name, help_text, counts in (
                ("ina_manager_lease_renewals", "Lease renewals granted, by tenant", renewals),
                ("ina_manager_lease_expiries", "Jobs reclaimed because a rank stopped "
                 "renewing, by tenant", expiries),
                ("ina_manager_preemptions", "Jobs preempted by a job of higher priority, by "
                 "tenant", preemptions)):
            family = CounterMetricFamily(name, help_text, labels=["tenant"])
            for tenant, n in sorted(counts.items()):
                family.add_metric([tenant], n)
            yield family
        family = CounterMetricFamily("ina_manager_refusals", "Connections and requests "
                                     "refused, by reason", labels=["reason"])
        for reason in REASONS:
            family.add_metric([reason], refusals.get(reason, 0))
        yield family
        family = HistogramMetricFamily("ina_manager_request_seconds", "How long a request "
                                       "took, from its line to its answer (a registration's "
                                       "wait for its job left out)", labels=["op"])
        for op, (counts, total) in sorted(latency.items()):
            cumulative, buckets = 0, []
            for bound, n in zip((*map(repr, LATENCY_BUCKETS), "+Inf"), counts):
                cumulative += n
                buckets.append((bound, cumulative))
            family.add_metric([op], buckets, total)
        yield family


def serve_metrics(manager, addr: str):
    """Serve the manager's metrics on ``addr``: plaintext on loopback, else over TLS with
    the manager's certificate (config.parse refuses an address off loopback without one);
    returns the server."""
    from prometheus_client import CollectorRegistry

    config = manager.config
    host, port = listen_address(addr, config.cert is not None, "manager.metrics")
    tls = not is_loopback(host)
    registry = CollectorRegistry()
    registry.register(ManagerCollector(manager))
    return serve(registry, host, port, str(config.cert) if tls else None,
                 str(config.key) if tls else None)
