"""Replay buffers (uniform, prioritized, frames, rounds' aggregate), the trajectory queue and the samples-per-
insert limiter, in process.
"""
