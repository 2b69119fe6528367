"""The chain experiment: gateway -> service A -> service B under a capacity trigger (issue 33)."""
