"""The operator's surface: the admin port and the access log.

The admin port serves ``/snapshot``, ``/metrics``, reload and the dashboard.
"""
