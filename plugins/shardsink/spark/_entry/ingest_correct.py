"""spark-submit entry point of re-processing's correction step (see shardsink.spark.reprocess).

Alone in this folder for the same reason as ingest_write.py (no stdlib shadowing).
"""

import sys

from shardsink.spark.reprocess import main

sys.exit(main())
