"""`python -m service ...` is the `pagedserve` command."""

import sys

from service.cli import main

sys.exit(main())
