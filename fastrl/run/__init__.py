"""A run: the iteration, the trainers (``trainer``; ``actor_learner`` for IMPALA/APPO), the one loop, checkpoints,
run directories, logging and evaluation. ``session.run(cfg)`` wires envs, learn and distributed into one run."""
