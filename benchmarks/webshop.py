"""Same as ``turnpool bench webshop``: steps/s of 64 webshop envs on the sequential, thread and
process backends against a shop in its own process, with the shop's CPU share.

    python benchmarks/webshop.py --json webshop.json
"""

from turnpool.bench.webshop import command

if __name__ == "__main__":
    command()
