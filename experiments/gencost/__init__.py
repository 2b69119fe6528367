"""The load generator alone: its CPU per request and schedule lag, lean vs aiohttp."""
