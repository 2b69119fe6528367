"""Canary releases: a weighted, sticky split and a statistical rollback rule.

Pure cores (standard library only, time and randomness as arguments):
``evidence`` (the capped mixture e-process), ``blocks`` (per-period counts and
the stable latency baseline), ``judges`` (sequential, fixed horizon,
threshold), ``rollout`` (ramp and decisions), ``split`` (who goes where).
The adapters that touch ASGI live beside them and import the cores.
"""
