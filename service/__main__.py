"""`python -m service ...` is the `pagedserve` command, with the same process defaults (service.cli.launch)."""

import sys

from service.cli.launch import main

sys.exit(main())
