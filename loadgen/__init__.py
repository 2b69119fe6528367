"""Checkout alias: ``python -m loadgen`` runs ``ballast_tools.loadgen``.

Not shipped in the wheel (a generic top-level name must not land in
site-packages); installed, use the console script or ``python -m ballast_tools.loadgen``.
"""
