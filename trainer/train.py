"""The reference trainer's entry script: what the default command runs (`python /etc/trainingjob/train.py`,
under torchrun in an elastic job) when spec.command is not set.

Why a script beside the packages: the default command, the admission policies that compare commands
and users' own torchrun lines name this one file at the top of the mount. It puts its own directory
(the mount, /etc/trainingjob in a pod) first on sys.path, where the reference trainer's package
(reference_trainer/, described in its __init__.py) and the progress helper's (trainingjob_progress/)
are, and runs the trainer. Python 3.9 or later.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from reference_trainer.main import end, main  # noqa: E402

if __name__ == "__main__":
    end(main(os.path.abspath(__file__)))
