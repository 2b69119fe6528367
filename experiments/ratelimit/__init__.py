"""Rate limits shared through Redis: the experiment (``make experiment-ratelimit``)."""
