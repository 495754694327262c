"""Fixtures for the DAG tests live in the root conftest (the Kubernetes tests use them too)."""
