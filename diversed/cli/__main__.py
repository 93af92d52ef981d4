"""``python -m diversed.cli``: what ``accelerate launch -m diversed.cli`` runs."""

import sys

from diversed.cli import main

sys.exit(main())
