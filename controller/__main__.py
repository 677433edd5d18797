"""`python -m controller` runs the operator (the same as the `trainingjob-operator` command)."""

import sys

from controller.cli import main

sys.exit(main())
