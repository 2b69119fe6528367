"""The field's published overload scenarios (Breakwater, Netflix, Envoy) against ballast."""
