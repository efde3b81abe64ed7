"""Acceptance tests of the runtime: real role processes over real TCP (or Unix sockets and rings) on loopback,
launched by `aiorl run`.
"""
