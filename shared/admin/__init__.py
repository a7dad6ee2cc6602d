"""Operator views and actions over every domain: jobs, dead letters, reconcile runs, stats
(the admin API for one tenant, the operator's CLI for all)."""
