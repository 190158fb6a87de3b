"""Put the repository root on ``sys.path`` so benchmarks can import ``shardsink_dev``
(development-only helpers that are not installed with the package).

Each benchmark does ``import _path  # noqa: F401`` before importing ``shardsink_dev``.
"""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
