"""Same as ``turnpool bench envs``: env reset/step cost and Sokoban generation vs gym_sokoban."""
from turnpool.bench.envs import command

if __name__ == "__main__":
    command()
