"""``python -m fastnorm``: the fastnorm command."""

import sys

from fastnorm.cli import main

sys.exit(main())
