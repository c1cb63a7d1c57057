"""Who may use the manager: tenants, each with a secret of its own and quotas, read
from the manager's TOML and used to attribute every request.

    [manager]
    secret_file = "secret"        # one line for one tenant: the tenant "default"

    [tenants.alice]               # or several, each with its own secret
    secret_file = "alice.secret"  # or secret = "..." (16 characters or more)
    jobs = 4                      # jobs at once (each holds one job id and one UDP port)
    slots = 256                   # slots, over all its jobs
    services = 4                  # service addresses (one per switch a job spans)
    pending = 8                   # registrations waiting for their job to fill or fit
    priority = 0                  # its jobs' priority unless they ask (INA_PRIORITY)
    max_priority = 0              # the most a job of it may ask (default: priority)
    operator = false              # true: ``jobs`` lists every tenant's jobs

A quota left out bounds nothing but the pool does. A tenant is known by its secret alone
(compared in constant time against every tenant's), and its jobs live under keys of
their own (``scoped``): what one tenant sends never names another's job, even with
the other job's credential.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass, field

from .wire import MAX_PRIORITY

DEFAULT = "default"              # the tenant of manager.secret
MIN_SECRET = 16
TENANT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
QUOTAS = ("jobs", "slots", "services", "pending")
TENANT_KEYS = ("secret", "secret_file", "operator", *QUOTAS, "priority", "max_priority")


@dataclass(frozen=True)
class Tenant:
    name: str
    secret: bytes = field(repr=False)     # never in a log line or a traceback
    operator: bool = False
    jobs: int | None = None       # None: no quota but the pool's
    slots: int | None = None
    services: int | None = None
    pending: int | None = None
    priority: int = 0             # its jobs' unless they ask
    max_priority: int = 0         # the most a job may ask

    def quota(self, name: str) -> int | None:
        return getattr(self, name)

    def job_priority(self, asked: int | None) -> int | str:
        """The priority of a job that asked ``asked`` (None: the default), or why not."""
        if asked is None:
            return self.priority
        if asked > self.max_priority:
            return (f"tenant {self.name} may give a job priority {self.max_priority} at most "
                    f"(its max_priority), not {asked}")
        return asked


def identify(tenants: dict[str, Tenant], secret: bytes) -> Tenant | None:
    """The tenant whose secret this is: every tenant's compared, in constant time each,
    so how long it takes says nothing of which one matched or how closely."""
    found = None
    for tenant in tenants.values():
        if hmac.compare_digest(secret, tenant.secret):
            found = tenant
    return found


def scoped(key: str, tenant: str) -> str:
    """A job's key within its tenant's own space (the default tenant's are the keys of
    a manager before tenants, so its database still reads)."""
    return key if tenant == DEFAULT else f"{key}/{tenant}"


def tenant_of(name: str) -> str:
    """The tenant of a scoped key."""
    parts = name.split("/")
    return parts[2] if len(parts) > 2 else DEFAULT


def wire_key(name: str) -> str:
    """The key the job's ranks know it by (wire.job_key), without the tenant."""
    return "/".join(name.split("/")[:2])


def parse_tenants(mg: dict, raw, read_secret, problems: list[str]) -> dict[str, Tenant]:
    """manager.secret as the tenant "default", and each [tenants.NAME]; ``read_secret``
    reads a table's secret or secret_file. A quota may exceed the pool (a pool that
    grows needs no new quotas): the pool bounds every tenant anyway."""
    tenants: dict[str, Tenant] = {}
    if "secret" in mg or "secret_file" in mg:
        tenants[DEFAULT] = Tenant(DEFAULT, read_secret(mg, "manager"))
    if raw is None:
        raw = {}
    if not isinstance(raw, dict) or not all(isinstance(t, dict) for t in raw.values()):
        problems.append("[tenants.NAME] must be tables")
        raw = {}
    if not tenants and not raw:
        problems.append("give manager.secret or manager.secret_file (one tenant), or "
                        "[tenants.NAME] tables: every request must carry a tenant's secret")
    for name, table in raw.items():
        where = f"tenants.{name}"
        if name == DEFAULT and DEFAULT in tenants:
            problems.append(f"{where}: manager.secret is the tenant {DEFAULT!r} already")
            continue
        if not TENANT_NAME.match(name):
            problems.append(f"{where}: a tenant's name is 1-32 of a-z, 0-9, _ and - "
                            f"(starting with a letter or digit)")
        extra = sorted(set(table) - set(TENANT_KEYS))
        if extra:
            problems.append(f"{where} has unknown keys {', '.join(extra)} (known: "
                            f"{', '.join(TENANT_KEYS)})")
        operator = table.get("operator", False)
        if not isinstance(operator, bool):
            problems.append(f"{where}.operator must be true or false, not {operator!r}")
        quotas = {}
        for quota in QUOTAS:
            value = table.get(quota)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                problems.append(f"{where}.{quota} must be an integer, 0 or more, not "
                                f"{value!r}")
                value = None
            quotas[quota] = value
        priority, cap = table.get("priority", 0), table.get("max_priority")
        for key, value in (("priority", priority), ("max_priority", cap)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or not 0 <= value <= MAX_PRIORITY):
                problems.append(f"{where}.{key} must be an integer in 0..{MAX_PRIORITY}, "
                                f"not {value!r}")
                priority, cap = 0, 0
        cap = priority if cap is None else cap
        if priority > cap:
            problems.append(f"{where}.priority {priority} is above its max_priority {cap}")
        tenants[name] = Tenant(name, read_secret(table, where), operator is True, **quotas,
                               priority=priority, max_priority=cap)
    secrets: dict[bytes, str] = {}
    for tenant in tenants.values():
        if tenant.secret and tenant.secret in secrets:
            problems.append(f"tenants {secrets[tenant.secret]} and {tenant.name} have the "
                            f"same secret: each tenant needs its own")
        secrets[tenant.secret] = tenant.name
    return tenants


def over_quota(tenant: Tenant, held: dict[str, int], asks: dict[str, int]) -> str | None:
    """Why ``asks`` on top of what the tenant holds breaks one of its quotas (one line
    naming the tenant, the quota and its value), or None."""
    for quota, more in asks.items():
        limit = tenant.quota(quota)
        if more and limit is not None and held.get(quota, 0) + more > limit:
            return (f"tenant {tenant.name} is at its quota {quota} = {limit} (it holds "
                    f"{held.get(quota, 0)}, this asks {more} more)")
    return None
