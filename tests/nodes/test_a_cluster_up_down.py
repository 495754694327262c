"""`make cluster-up` and `make cluster-down` with real Nodes (``python -m tests.cluster up|down``,
what the two targets run once the binaries and the image are built): up, three real Nodes Ready
with containerd as their runtime; down, the host as it was: no process, mount, network namespace,
link (veth, bridge), nftables table or cgroup of theirs, and the kernel settings the kubelet
changes restored. Named to run before the tier's own cluster starts (they would share names)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.cluster.cluster import CHECKOUT_STATE, REPO, STOP_TIMEOUT, UP_TIMEOUT
from tests.cluster.kubeapi import KubeApi
from tests.cluster.nodes import host_state
from tests.nodes.conftest import node_images

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def test_cluster_up_starts_real_nodes_and_down_leaves_the_host_as_it_was() -> None:
    from tests.cluster.cluster import built
    from tests.cluster.nodes import node_tools_built

    if not (built() and node_tools_built() and node_images()):
        pytest.skip("needs `make cluster-build` and `make image`")
    if (CHECKOUT_STATE / "supervisor.pid").exists():
        pytest.skip("a cluster of `make cluster-up` is running in this checkout")
    before = host_state()
    assert not before["processes"], f"real Nodes already running here: {before['processes']}"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    up = subprocess.run([sys.executable, "-m", "tests.cluster", "up"], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=UP_TIMEOUT + STOP_TIMEOUT + 60)  # fmt: skip
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "3 real Nodes Ready" in up.stdout, up.stdout
        nodes = KubeApi(CHECKOUT_STATE / "kubeconfig").get("/api/v1/nodes")["items"]
        runtimes = sorted(n["status"]["nodeInfo"]["containerRuntimeVersion"].split("+")[0] for n in nodes)
        assert runtimes == ["containerd://2.4.2"] * 3, runtimes
        assert len(host_state()["processes"]) >= 3 + 3 + 2  # kubelets, containerds, kube-proxy, CoreDNS
    finally:
        down = subprocess.run([sys.executable, "-m", "tests.cluster", "down"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=STOP_TIMEOUT + 60)  # fmt: skip
    assert down.returncode == 0, down.stdout + down.stderr
    after = host_state()
    assert {key: after[key] for key in after if after[key] != before[key]} == {}
