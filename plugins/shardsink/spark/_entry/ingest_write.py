"""spark-submit entry point of the ingest write step (see shardsink.spark.job).

It lives alone in this folder on purpose: Python puts the script's folder first on
sys.path, and a sibling module named like a stdlib one (``types.py``) would shadow it.
"""

import sys

from shardsink.spark.job import main

sys.exit(main())
