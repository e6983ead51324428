"""``python -m awa`` runs the command line."""

from awa.cli import main

main()
