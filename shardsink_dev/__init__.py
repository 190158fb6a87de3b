"""Development-only helpers: NOT part of the shardsink library.

Used by the tests, the benchmarks and the demo (``make run``): a moto S3 server and a
local SparkSession (:mod:`shardsink_dev.testing`), synthetic landing-zone data
(:mod:`shardsink_dev.synthetic`) and the demo itself (:mod:`shardsink_dev.demo`).

It lives outside ``plugins/``: it is not installed with the package, not loaded by
Airflow as a plugin and never zipped to Spark executors (``--py-files`` ships only the
``shardsink`` package). Import it with the repository root on ``sys.path`` (pytest's
``pythonpath``, ``PYTHONPATH=.`` in the Makefile, ``bench/_path.py``).
"""
