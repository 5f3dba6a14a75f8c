"""`python -m znni.cli ...`: the same as the installed `znni` command."""

import sys

from znni.cli import main

sys.exit(main())
