"""Checkout alias: ``python -m upstream_sim`` runs ``ballast_tools.upstream_sim``.

Not shipped in the wheel (a generic top-level name must not land in
site-packages); installed, use the console script or ``python -m ballast_tools.upstream_sim``.
"""
