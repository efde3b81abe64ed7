"""Learning from logged data: datasets, their formats, and off-policy evaluation."""
