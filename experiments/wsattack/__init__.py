"""Websocket attacks on a real gateway: a frame flood, a stalled upstream (issue 27, 3-4)."""
