"""``python benchmarks/pool.py [options]`` is ``turnpool bench pool [options]``; see
``turnpool.bench.pool`` for what is measured and how."""

from turnpool.bench.pool import command

if __name__ == "__main__":
    command()
