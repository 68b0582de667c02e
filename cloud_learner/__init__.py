"""Asynchronous cloud learner: algorithms, policies, training loop, checkpoints, evaluation."""
