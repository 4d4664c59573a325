"""Adapters for the frameworks that call Lyre as a client (optional extras; nothing here is imported by
the server)."""
