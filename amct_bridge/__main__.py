"""``python -m amct_bridge`` runs the ``amct-bridge`` CLI."""

import sys

from amct_bridge.cli import main

sys.exit(main())
