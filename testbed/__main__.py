"""`python -m testbed`: see testbed/cli.py."""

import sys

from .cli import main

sys.exit(main())
