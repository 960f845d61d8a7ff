"""``python -m fedskew.cli``: the ``fedskew`` command."""

import sys

from fedskew.cli import main

if __name__ == "__main__":
    sys.exit(main())
