"""Role processes: coordinator, actor, memory host, learner, and the phases they share."""
