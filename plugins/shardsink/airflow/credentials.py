"""AWS credentials from an Airflow connection, the way Airflow users expect.

``aws_conn_id`` names a connection of the amazon provider's ``aws`` type; its hook
(:class:`~airflow.providers.amazon.aws.hooks.base_aws.AwsBaseHook`) resolves it: keys,
session token, profiles, role assumption, region and ``endpoint_url`` (or
``service_config.s3.endpoint_url``) from the extra. shardsink never parses the
connection itself and never writes credentials into ``os.environ``; it only reads the
botocore settings it applies itself (``connect_timeout``, ``read_timeout``,
``max_pool_connections`` of the extra's ``config_kwargs``, the provider's own key for
them) into the store's :class:`~shardsink.storage.options.StoreOptions`:

* tasks running in the worker (mint, append, the write operator's committed check) use
  an :class:`~shardsink.storage.s3.S3Access` built from the hook's boto3 session, made
  the default for the task body with :func:`store_access`;
* spark-submit gets the hook's frozen credentials in ITS process environment only
  (:meth:`AwsAccess.spark_env`), never on its command line, in XCom, in a rendered
  template, in state or in a manifest.

Precedence of the store timeouts (most specific first). In a task: explicit
``StoreOptions`` > the connection's ``config_kwargs`` > ``SHARDSINK_S3_*`` in the worker's
environment > the defaults (:mod:`shardsink.storage.options`). In spark-submit: a
``SHARDSINK_S3_*`` set explicitly in the Spark environment (``SparkOptions(env=...)``) >
the connection's ``config_kwargs`` > the worker's environment > the defaults.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from shardsink.storage.options import ENV, StoreOptions
from shardsink.storage.s3 import S3Access, using_s3_access


@dataclass(frozen=True)
class AwsAccess:
    """What one ``aws`` connection resolved to. ``repr`` shows no secret."""

    conn_id: str
    hook: Any = field(repr=False)
    session: Any = field(repr=False)
    endpoint_url: str | None
    region: str | None
    #: Timeouts and pool from the extra's ``config_kwargs`` over the environment's (None: the environment's).
    options: StoreOptions | None = None

    def s3(self) -> S3Access:
        return S3Access(self.session, self.endpoint_url, self.options)

    def spark_env(self, *, explicit: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment variables for the spark-submit process (driver and local executors).

        Frozen credentials: an assumed role's are valid for the session's duration, which
        bounds how long one write job may run. ``explicit``: the environment the operator was
        given for Spark; a ``SHARDSINK_S3_*`` timeout set there wins over the connection's
        (module docstring), so it is left out here.
        """
        creds = self.hook.get_credentials(region_name=self.region)  # the hook masks the secrets in logs
        env = {"AWS_ACCESS_KEY_ID": creds.access_key, "AWS_SECRET_ACCESS_KEY": creds.secret_key}
        if creds.token:
            env["AWS_SESSION_TOKEN"] = creds.token
        if self.region:
            env["AWS_DEFAULT_REGION"] = self.region
        if self.endpoint_url:
            env["AWS_ENDPOINT_URL"] = self.endpoint_url
        if self.options is not None:  # the connection's timeouts reach the executors' stores too,
            given = explicit or {}  # unless the Spark environment sets them itself
            env.update({var: str(getattr(self.options, f)) for f, var in ENV.items() if var not in given})
        return env


def resolve_aws(conn_id: str) -> AwsAccess:
    """Resolve ``conn_id`` with the amazon provider's hook (see the module docstring)."""
    from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

    hook = AwsBaseHook(aws_conn_id=conn_id, client_type="s3")
    wrapper = hook.conn_config
    session = hook.get_session(region_name=wrapper.region_name)
    return AwsAccess(conn_id=conn_id, hook=hook, session=session,
                     endpoint_url=wrapper.get_service_endpoint_url("s3"),
                     region=wrapper.region_name or session.region_name,
                     options=connection_options(wrapper.extra_config))


def connection_options(extra: dict[str, Any]) -> StoreOptions | None:
    """The environment's store options with the timeouts and pool the extra's ``config_kwargs``
    sets; None if it sets none (the environment's then apply, as without a connection)."""
    env = StoreOptions.from_env()
    botocore = extra.get("config_kwargs")
    options = env.override(botocore) if isinstance(botocore, dict) else env
    return None if options == env else options


@contextmanager
def store_access(conn_id: str | None) -> Iterator[AwsAccess | None]:
    """Within the block, S3 stores are opened with ``conn_id``'s credentials (none: the environment's)."""
    if not conn_id:
        yield None
        return
    access = resolve_aws(conn_id)
    with using_s3_access(access.s3()):
        yield access
