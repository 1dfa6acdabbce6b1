"""``python -m estream.cli`` is the ``estream`` console script."""

import sys

from estream.cli.main import main

sys.exit(main())
