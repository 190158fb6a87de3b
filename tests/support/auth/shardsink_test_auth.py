"""A test-only Airflow auth manager: the simple auth manager, except that the users in
:data:`NO_ASSET_USERS` may not access assets, whatever their role (tests only).

The simple auth manager lets every role read assets, so a test needs Airflow's own
extension point (``[core] auth_manager``) to show that the Shards plugin honours the
auth manager's decision: put this folder on ``PYTHONPATH`` and set
``AIRFLOW__CORE__AUTH_MANAGER=shardsink_test_auth.NoAssetsAuthManager``.
"""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

#: Users denied asset access (an admin among them: the denial is by permission, not role).
NO_ASSET_USERS = frozenset({"noassets"})
CLASS = f"{__name__}.NoAssetsAuthManager"


class NoAssetsAuthManager(SimpleAuthManager):
    def is_authorized_asset(self, *, method: Any, user: Any, details: Any = None) -> bool:
        if user.get_name() in NO_ASSET_USERS:
            return False
        return bool(super().is_authorized_asset(method=method, user=user, details=details))
