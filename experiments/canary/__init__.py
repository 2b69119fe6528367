"""Canary judge experiment: seeded simulation of the rules, detection speed, and a live run."""
