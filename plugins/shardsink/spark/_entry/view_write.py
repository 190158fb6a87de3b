"""spark-submit entry point of the materialize sink's write step (see shardsink.spark.view_job).

Alone in this folder for the same reason as ingest_write.py (no stdlib shadowing).
"""

import sys

from shardsink.spark.view_job import main

sys.exit(main())
