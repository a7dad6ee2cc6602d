"""Tenants: their API keys (``service.py``: authentication, scopes, key lifecycle), rate limits
per key (``ratelimit.py``) and the rows every tenant names (``repository.py``)."""
