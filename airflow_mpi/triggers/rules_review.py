"""The triggerer's own permission check, before it follows a deferred job: what its credentials
lack of the triggerer's Role (``kinds.permissions``), asked once per trigger with a
SelfSubjectRulesReview, as the worker asks before it creates anything. A triggerer bound to a
Role without a verb it needs then fails the task at once, naming the verb and who lacks it,
rather than mid-wait with a mark that never moves or a kill that deletes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from airflow_mpi.backends.k8s_errors import RBAC_DOC
from airflow_mpi.kinds.permissions import Permission, missing_permissions, render_missing
from airflow_mpi.triggers.api_client import raise_for_status


async def refused_permissions(
    api_client: Any, namespace: str, needed: Sequence[Permission], request_timeout: Any, connection: str | None = None
) -> str | None:
    """The error naming what the credentials of ``api_client`` (those of Kubernetes connection
    ``connection``) lack of ``needed`` in ``namespace``; None when nothing is missing, or the
    server cannot tell in advance (an incomplete answer, a review not allowed or not served: the
    requests themselves will say)."""
    from kubernetes_asyncio.client import AuthorizationV1Api

    review: Any = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace},
    }
    try:
        response = await AuthorizationV1Api(api_client).create_self_subject_rules_review(
            review, _preload_content=False, _request_timeout=request_timeout
        )
        status = (await _json(response)).get("status") or {}
    except Exception:  # not allowed, not served, or no answer: the wait's own requests will say
        return None
    missing = missing_permissions(status.get("resourceRules") or [], needed)
    if not missing or status.get("incomplete"):
        return None
    user = await _whoami(api_client, request_timeout)
    return render_missing(missing, namespace, RBAC_DOC, user=user, component="triggerer", connection=connection)


async def _whoami(api_client: Any, request_timeout: Any) -> str | None:
    """The user name a SelfSubjectReview gives; None where it is not served or allowed."""
    from kubernetes_asyncio.client import AuthenticationV1Api

    review: Any = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        response = await AuthenticationV1Api(api_client).create_self_subject_review(
            review, _preload_content=False, _request_timeout=request_timeout
        )
        status = (await _json(response)).get("status") or {}
    except Exception:  # an identity only names who lacks a verb: the verb is the error
        return None
    username = (status.get("userInfo") or {}).get("username")
    return str(username) if username else None


async def _json(response: Any) -> dict[str, Any]:
    await raise_for_status(response)
    async with response:
        value: dict[str, Any] = json.loads(await response.read())
    return value
