"""``python -m hedgerow.cli``: the ``hedgerow`` console script."""

from hedgerow.cli import main

main()
