"""The peers: HAProxy and nginx in front of a backend, configured as their users protect it.

A peer is named like a limiter, ``haproxy-64`` or ``nginx-32``, so that the
experiments can run it wherever they run ``gradient`` or ``fixed-64``
(``parse_peer``). ``start_peer`` writes the configuration (``haproxy_config`` /
``nginx_config``: pure text from a ``Peer``), starts the binary on a free
loopback port pinned to a CPU (``taskset``, through ``Procs``), waits until it
accepts, and returns a ``Target`` whose ``pid`` is the one process doing all the
work (HAProxy ``-db`` with one thread, nginx ``master_process off`` with one
worker), so ``/proc/<pid>`` is the peer's whole CPU and memory. ``Procs`` stops
it by PID.

**HAProxy** (``haproxy-N``): ``maxconn N`` on the one server, so at most N
requests are at the backend and the rest wait in HAProxy's queue; the queue is
ordered by ``http-request set-priority-class`` from ``X-Priority`` (critical
-1, standard 0, bulk 1: HAProxy dequeues the lowest class first, then the
oldest); ``timeout queue`` is the longest tier deadline (no request is refused
while its client still waits for it: HAProxy 2.6 cannot set the queue timeout
per request, ``http-request set-timeout`` covers ``server`` and ``tunnel``
only), and ``option abortonclose`` drops a queued request whose client gave
up (the generator closes the connection at its deadline plus grace). A queue
timeout is answered ``503``.

**nginx** (``nginx-N``): ``max_conns N`` on the upstream server. nginx OSS has
no upstream queue (the ``queue`` directive is NGINX Plus only): a request that
finds N connections busy is answered ``502`` at once. The knobs its users add:
``limit_conn`` (concurrent requests per key) and ``limit_req`` (a token bucket,
``burst`` with ``nodelay``), both keyed on the client address for every
request that is *not* ``X-Priority: critical`` (a ``map`` to an empty key
exempts critical): non-critical requests may hold at most 3/4 of the N
upstream connections, so a quarter stays free for critical ones, and are
limited to the backend's nominal capacity in requests per second. Both answer
``503``. With one generator address, "per client" is "in total".
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

from experiments._harness.procs import HOST, Procs, free_port
from experiments._harness.servers import Target, find_binary

PEER_KINDS = ("haproxy", "nginx")
#: HAProxy's priority class per ``X-Priority`` value (lower is dequeued first; others: 0).
PRIORITY_CLASSES = {"critical": -1, "bulk": 1}


def fd_limit() -> int:
    """The hard limit on open files a child can raise itself to (RLIMIT_NOFILE)."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1 << 20 if hard == resource.RLIM_INFINITY else int(hard)


def max_client_conns(fds: int) -> int:
    """Client connections a peer holds at once with ``fds`` descriptors: half of them
    (each may need an upstream one too), less a margin; this machine: 20,000 -> 9,950."""
    return max(100, (fds - 100) // 2)


@dataclass(frozen=True)
class Peer:
    """One peer configuration.

    ``limit``: HAProxy's per-server ``maxconn`` / nginx's ``max_conns``;
    ``queue_timeout_s``: HAProxy's ``timeout queue`` (the longest deadline);
    ``rate_rps``: nginx's ``limit_req`` rate for non-critical requests (the
    backend's nominal capacity) with ``burst_s`` of it as burst.
    """

    kind: str
    limit: int
    queue_timeout_s: float = 3.0
    rate_rps: float = 250.0
    burst_s: float = 0.2

    def __post_init__(self) -> None:
        if self.kind not in PEER_KINDS:
            raise ValueError(f"peer kind must be one of {', '.join(PEER_KINDS)}, not {self.kind!r}")
        if not 1 <= self.limit <= 100000:
            raise ValueError(f"peer limit must be in 1..100000, not {self.limit}")
        if self.queue_timeout_s <= 0 or self.rate_rps <= 0 or self.burst_s < 0:
            raise ValueError("queue_timeout_s and rate_rps must be > 0, burst_s >= 0")

    @property
    def name(self) -> str:
        """``haproxy-64``: the row label."""
        return f"{self.kind}-{self.limit}"

    @property
    def non_critical_conns(self) -> int:
        """nginx's ``limit_conn`` for non-critical requests: 3/4 of ``limit`` (at least 1)."""
        return max(1, self.limit * 3 // 4)

    @property
    def burst(self) -> int:
        """nginx's ``limit_req`` burst, in requests."""
        return max(1, round(self.rate_rps * self.burst_s))


def is_peer(name: str) -> bool:
    """True for ``haproxy-N`` / ``nginx-N``."""
    kind, _, limit = name.partition("-")
    return kind in PEER_KINDS and limit.isdigit()


def parse_peer(name: str, **settings: float) -> Peer:
    """``"haproxy-64"`` -> ``Peer("haproxy", 64, ...)`` (``settings``: the other fields)."""
    if not is_peer(name):
        raise ValueError(f"a peer is haproxy-N or nginx-N (N an integer), not {name!r}")
    kind, _, limit = name.partition("-")
    return Peer(kind, int(limit), **settings)


def haproxy_config(
    peer: Peer, port: int, upstream_port: int, host: str = HOST, fds: int = 20000
) -> str:
    """HAProxy 2.6: one thread, a per-server ``maxconn`` with a prioritised queue.

    ``fds``: the open-files limit HAProxy may use (it refuses to start when
    ``maxconn`` needs more); the client side gets ``max_client_conns(fds)``.
    """
    conns = max_client_conns(fds)
    classes = "\n".join(
        f"  http-request set-priority-class int({cls}) if {{ req.hdr(X-Priority) -m str {prio} }}"
        for prio, cls in PRIORITY_CLASSES.items()
    )
    return f"""global
  nbthread 1
  maxconn {conns}
defaults
  mode http
  option http-keep-alive
  option abortonclose
  timeout connect 2s
  timeout client 60s
  timeout server 60s
  timeout http-request 10s
  timeout http-keep-alive 120s
  timeout queue {round(peer.queue_timeout_s * 1000)}ms
frontend f
  bind {host}:{port}
  maxconn {conns}
{classes}
  default_backend b
backend b
  http-reuse always
  server s1 {host}:{upstream_port} maxconn {peer.limit}
"""


def nginx_config(
    peer: Peer, port: int, upstream_port: int, tmp: str, host: str = HOST, fds: int = 20000
) -> str:
    """nginx 1.22: one worker, ``max_conns`` upstream, ``limit_conn``/``limit_req`` off critical.

    ``worker_connections`` counts client and upstream connections alike: ``fds`` less a margin.
    """
    conns = max(200, fds - 100)
    rate = max(1, round(peer.rate_rps))
    return f"""daemon off; master_process off; worker_processes 1;
pid {tmp}/nginx-{port}.pid; error_log {tmp}/nginx-{port}.err crit;
worker_rlimit_nofile {fds};
events {{ worker_connections {conns}; }}
http {{
  access_log off; client_body_temp_path {tmp}; proxy_temp_path {tmp};
  fastcgi_temp_path {tmp}; uwsgi_temp_path {tmp}; scgi_temp_path {tmp};
  keepalive_requests 10000000; keepalive_timeout 120s;
  map $http_x_priority $limited_key {{ critical ""; default $binary_remote_addr; }}
  limit_conn_zone $limited_key zone=conns:1m;
  limit_req_zone $limited_key zone=rate:1m rate={rate}r/s;
  limit_conn_status 503; limit_req_status 503;
  upstream backend {{ server {host}:{upstream_port} max_conns={peer.limit};
    keepalive {peer.limit}; }}
  server {{
    listen {host}:{port} backlog=4096;
    location / {{
      limit_conn conns {peer.non_critical_conns};
      limit_req zone=rate burst={peer.burst} nodelay;
      proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_read_timeout 60s;
    }}
  }}
}}
"""


def start_peer(procs: Procs, peer: Peer, upstream_port: int, cpu: int | None) -> Target:
    """Write ``peer``'s configuration, start it on a free port (pinned to ``cpu``), wait for it."""
    binary = find_binary(peer.kind)
    if binary is None:
        raise FileNotFoundError(f"{peer.kind} not installed (Debian package {peer.kind})")
    port = free_port()
    conf = procs.tmp / f"{peer.name}-{port}.cfg"
    if peer.kind == "haproxy":
        conf.write_text(haproxy_config(peer, port, upstream_port, fds=fd_limit()))
        cmd = [binary, "-db", "-f", str(conf)]
    else:
        conf.write_text(nginx_config(peer, port, upstream_port, str(procs.tmp), fds=fd_limit()))
        cmd = [binary, "-c", str(conf), "-p", str(procs.tmp)]
    proc = procs.start(cmd, cpu, port, f"{peer.name}-{port}")
    return Target(peer.name, port, proc.pid, path="/")
