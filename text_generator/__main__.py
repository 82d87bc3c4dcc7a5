"""`python -m text_generator ...`: the command line (text_generator/cli.py)."""

import sys

from text_generator.cli import main

if __name__ == "__main__":
    sys.exit(main())
