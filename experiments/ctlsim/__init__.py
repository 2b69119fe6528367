"""Controller evaluation in simulated time (the real pure cores, no sockets)."""
