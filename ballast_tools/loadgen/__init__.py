"""The open-loop load generator (``ballast-load``); see ``docs/instruments.md``."""
