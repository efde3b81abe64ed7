"""Packages every floor may use: the console flag, the rate-limited log, the buffer pool."""
