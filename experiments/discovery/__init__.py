"""Discovery experiment: instances that come and go behind two gateways (docs/discovery.md)."""
