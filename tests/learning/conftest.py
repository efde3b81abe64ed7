"""Learning checks (marked slow) on real Gymnasium environments with fixed seeds: the examples reach their
thresholds through the real runtime.
"""
