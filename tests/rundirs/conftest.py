"""Run directories and the files in them: checkpoints, locking, resume, and run directories written by an earlier
aiorl.
"""
