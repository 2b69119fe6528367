"""Hot-path micro-benchmarks: CPU per request of each stage; the proxy micro-bench."""
