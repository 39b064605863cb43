"""Rollouts: a policy plays the envs of a `turnpool.pool.EnvPool` turn by turn.

settings (every settings type, no other turnpool import) · prompts (observation -> chat) ·
projection (text -> actions) · episode (episode state, plan/apply of a turn, the seed
schedule) · collector (lock-step and dynamic sampling) · async_driver (generation overlapping
env steps) · scoring (RAGEN's reward normalization) · trajectory (records and JSONL).
Config files are read one layer up (`turnpool.ragen.config`); this package never imports a
backend.
"""
