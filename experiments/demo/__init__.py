"""`make demo`: simulator + gateway + open-loop load with a live per-tier view."""
