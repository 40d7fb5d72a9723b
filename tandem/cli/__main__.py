"""``python -m tandem.cli``: the ``tandem`` command without its installed entry point."""

from . import main

main()
