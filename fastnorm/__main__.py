import sys

from fastnorm.cli import main

sys.exit(main())
