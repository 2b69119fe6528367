"""`make experiment`: the load sweep, the degrading upstream and the capacity swing (tables 1-3)."""
