"""Each algorithm's pieces without sockets: targets, losses, networks, optimizers, acting in numpy, env wrappers
and exports.
"""
