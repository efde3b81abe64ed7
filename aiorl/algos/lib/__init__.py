"""Pieces several algorithms share: networks, actor-critic heads, losses and replay plumbing."""
