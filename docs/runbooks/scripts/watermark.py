"""The landing zone's watermark, when it was last published, and its newest data file.

    py - LANDING < docs/runbooks/scripts/watermark.py

It lists the whole landing zone; on a very large one read just `_watermark.json`.
"""

import datetime
import sys

from shardsink.sources import LandingSource
from shardsink.sources.landing import WATERMARK_KEY
from shardsink.storage.url import open_blob


def utc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="seconds")


if len(sys.argv) != 2:
    sys.exit(__doc__)
src = LandingSource(sys.argv[1])
wm = src.watermark()
print("watermark    ", wm, "" if wm is None else utc(wm / 1000))
objs = {o.key: o for o in open_blob(sys.argv[1]).list("")}
if WATERMARK_KEY in objs:
    print("published at ", utc(objs[WATERMARK_KEY].modified))
files = src.files()
print("data files   ", len(files))
if files:
    newest = max(files, key=lambda f: f.modified)
    print("newest file  ", newest.key, "landed", utc(newest.modified))
