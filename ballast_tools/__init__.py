"""The instruments that ship with ballast-asgi (the simulator and the load generator).

- ``ballast_tools.upstream_sim``: the programmable backend (``ballast-upstream``);
- ``ballast_tools.loadgen``: the open-loop load generator (``ballast-load``);
- ``ballast_tools.hist`` and ``ballast_tools.units``: the small common code both use
  (a log-bucketed latency histogram; duration parsing), so neither imports the other.
"""
