"""Discovery: instances registered in etcd, config versions, gateways that follow them.

Pure cores: ``model`` (values, keys), ``versions`` (when to write version
N+1), ``registration`` (the registration state machine). Async drivers over
etcd: ``etcd`` (the client wrapper), ``registrar``, ``controller``,
``follower``. Entry points: ``cli`` (``ballast register``, ``ballast
controller``). See docs/discovery.md and docs/adr/0004-discovery-on-etcd.md.
"""
