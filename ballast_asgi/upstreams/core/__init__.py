"""The pool's pure core: instances, balancer, health and outlier policies, pool, limit.

Standard library only.
"""
