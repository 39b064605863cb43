"""``python -m turnpool.cli``: the ``turnpool`` command without the installed script."""

from turnpool.cli import main

if __name__ == "__main__":
    main()
