"""``python -m turnpool.cli``: the ``turnpool`` command without the installed script."""

from turnpool.cli import main

main()
