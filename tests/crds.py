"""The CRD schemas for tests: skip with the reason when they are not beside the checkout."""

from __future__ import annotations

from typing import Any

import pytest

from tests.doubles.crd_schema import CRDS_ENV, crd_dir, crd_errors


def assert_valid_custom_object(obj: dict[str, Any]) -> None:
    if crd_dir() is None:
        pytest.skip(f"no CRDs: put shared/crds beside the checkout or set {CRDS_ENV}")
    errors = crd_errors(obj)
    assert errors == [], f"{obj['kind']} {obj['metadata'].get('name')} breaks its CRD:\n" + "\n".join(errors)
