"""``python -m hurray_wire``: the same command as ``hurray-wire``."""

import sys

from hurray_wire.cli_args import main

sys.exit(main())
