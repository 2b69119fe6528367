"""The issue 28 probe: a fast and a 1 s endpoint behind the default gateway and a fixed-1000 one."""
