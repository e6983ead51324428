"""``python -m awa`` runs the command line."""

from awa.cli import main

if __name__ == "__main__":
    main()
