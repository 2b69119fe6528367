"""The programmable upstream simulator (``ballast-upstream``); see ``docs/instruments.md``."""
