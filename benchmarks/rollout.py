"""``python benchmarks/rollout.py [options]`` is ``turnpool bench rollout [options]``; see
``turnpool.bench.rollout`` for what is measured and how."""

from turnpool.bench.rollout import command

if __name__ == "__main__":
    command()
