"""The shared harness of the experiment tools (nothing here is shipped in the wheel).

Small on purpose; import from the module that owns the name:

- ``procs``: ``HOST``, ``free_port()``, ``wait_port()``, ``terminate()`` / ``kill()``
  (one child by PID), ``Procs`` (start a command,
  optionally pinned with ``taskset``, log to a file, wait for its port; stop every
  child by PID), ``processes(tmp)`` (a ``Procs`` that stops all on exit) and
  ``stop_on_signals()`` / ``cancel_on_signals()`` (sync / async tools: SIGTERM and
  SIGINT unwind the tool so its children are stopped).
- ``servers``: ``Target`` and the things we start: ``start_backend`` (nginx 1 KB or
  a fallback), ``start_nginx_proxy``, ``start_haproxy``, ``start_bare`` (bare
  Python pass-through), ``start_sim`` / ``sim_cmd`` (the simulator),
  ``start_gateway`` (the ``ballast`` CLI with a YAML text), ``start_uvicorn_gateway``
  (``uvicorn ballast_asgi.gateway:app``), ``find_binary`` / ``ensure_package``.
- ``peers``: ``Peer`` / ``parse_peer("haproxy-64")`` / ``is_peer``, ``haproxy_config`` and
  ``nginx_config`` (the configuration texts), ``start_peer(procs, peer, upstream_port, cpu)``:
  HAProxy (``maxconn`` per server, priority-class queue) or nginx (``max_conns``,
  ``limit_conn`` / ``limit_req`` off critical) in front of a backend, as their users set them.
- ``redis``: ``start_redis()`` / ``redis_server()`` (a throwaway ``redis-server`` on a
  free port, ready when it answers PING), ``RedisProcess`` (``url``, ``stop``, ``kill``).
- ``cpu``: ``pin_self``, ``cpu_s(pid)``, ``cpu_ticks()`` / ``busy_share`` / ``busy_all``,
  ``status_kb(pid, "VmHWM")``.
- ``jsonio``: ``wait_ok``, ``get_json``, ``post_json`` (aiohttp, bounded timeouts).
- ``machine``: ``machine()`` and ``versions()`` for the report header.
- ``loop``: ``HiResLoop`` (uvloop with a microsecond ``time()``).
- ``stats``: ``percentile``, ``median``, ``spread`` (median, low, high).
"""
