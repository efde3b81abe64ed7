"""Learning from logged data: dataset formats and checks, aiorl collect, the dataset store,
the offline algorithms learning on real datasets, and off-policy evaluation.
"""
