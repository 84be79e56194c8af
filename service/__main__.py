"""`python -m service ...` is the `pagedserve` command, with the same process defaults (service.launch)."""

import sys

from service.launch import main

sys.exit(main())
