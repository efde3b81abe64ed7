"""The runtime's parts in process or against hand-played peers: coordinator, barrier, memory host, learner,
roles, spawner, restarts, values and integrity.
"""
