"""Loaded at start by every Python process whose PYTHONPATH holds this folder (tests only).

Installs the faults named by ``SHARDSINK_TEST_FAULTS`` (see faultpoints.py) through the
library's hook registry. Without the variable it does nothing.
"""

import json
import os

if os.environ.get("SHARDSINK_TEST_FAULTS"):
    import faultpoints

    faultpoints.install(json.loads(os.environ["SHARDSINK_TEST_FAULTS"]))
