"""Repeat the conditional-write probe on the bucket of an s3:// shard URL, by hand.

    py - SHARD < docs/runbooks/scripts/probe.py

Three PUTs of the probe object: the first may answer 200 (it created the object), every
later one must answer 412. A 200 after the first line is what UnsafeStoreError reports.
A shard on a local folder has no probe: local files honour the conditions by construction.
"""

import sys

import botocore.exceptions as bexc

from shardsink.storage.probe import PROBE_BODY, PROBE_KEY, STALE_ETAG
from shardsink.storage.s3 import make_client
from shardsink.storage.url import parse_url

if len(sys.argv) != 2:
    sys.exit(__doc__)
url = parse_url(sys.argv[1])
if url.scheme != "s3":
    print(f"{sys.argv[1]} is not on S3: nothing to probe")
    sys.exit(0)
c = make_client()
print("endpoint", c.meta.endpoint_url, "bucket", url.bucket)
for cond in ({"IfNoneMatch": "*"}, {"IfNoneMatch": "*"}, {"IfMatch": STALE_ETAG}):
    try:
        c.put_object(Bucket=url.bucket, Key=PROBE_KEY, Body=PROBE_BODY, **cond)
        print(cond, "200")
    except bexc.ClientError as e:
        print(cond, e.response["ResponseMetadata"]["HTTPStatusCode"], e.response["Error"]["Code"])
