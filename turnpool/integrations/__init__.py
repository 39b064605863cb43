"""Trainers on turnpool: TRL's GRPOTrainer (`turnpool.integrations.trl`) and verl's agent loop
(`turnpool.integrations.verl`), both over `turnpool.integrations.leases` (one pool per process,
envs leased per trajectory, ``step_timeout`` enforced). Each module imports its trainer only
when used, so ``import turnpool.integrations`` needs neither installed.
"""
