"""The wire: framing, codec, authentication, handshakes, connections, Unix sockets and shared-memory rings, over
real loopback sockets.
"""
