"""The compiled kernels (aiorl/_ext: sum-tree, n-step, GAE, V-trace, sequences, frame store) against their numpy
oracles, and the check that the compiled module is the one loaded.
"""
