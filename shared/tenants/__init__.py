"""Tenants and their API keys (the service side is shared/auth.py)."""
