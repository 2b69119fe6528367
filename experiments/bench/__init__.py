"""`make bench`: the gateway's CPU per request and latency against nginx, HAProxy, bare proxies."""
