"""Discovery's pure core: the etcd key model, registrations and config versions (stdlib only)."""
