"""The canary's pure core: split, evidence, judges, history, rollout.

Standard library only, time as an argument.
"""
