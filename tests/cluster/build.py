"""Builds the real Kubernetes control plane and controllers from their upstream source, through
the Go module proxy, at pinned versions: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, mpi-operator, Kueue, Volcano, JobSet and Kubeflow Trainer.

Each component is built once per version into ``$AIRFLOW_MPI_CLUSTER_CACHE`` (default
``~/.cache/airflow-mpi/k8s``), outside the checkout, so every clone on the machine and CI reuse it.
A component whose upstream go.mod replaces modules with paths inside its own repository (the
Kubernetes staging modules, Volcano's ``volcano.sh/apis``) cannot be ``go install``ed: it is built
from a small wrapper module that requires it and replaces each such module with a published
release, derived from the upstream go.mod, never hard-coded.

    python tests/cluster/build.py [--only NAME ...]

Test code: nothing here ships in the wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

K8S_VERSION = "v1.37.2"
STAGING_VERSION = "v0.37.2"  # the k8s.io/<staging> release of K8S_VERSION


@dataclass(frozen=True)
class Component:
    """One upstream module and the main packages built from it."""

    name: str
    module: str
    version: str
    binaries: dict[str, str]  # binary name -> main package
    # Modules the upstream go.mod points at a path inside its own repository: replaced in the
    # wrapper with the published release named here (module -> version).
    replaces: dict[str, str] = field(default_factory=dict)
    kubernetes_version_flags: bool = False
    # Extra requirements of the wrapper (module -> version), e.g. a nested module the zip omits.
    requires: dict[str, str] = field(default_factory=dict)
    # Files of the module the cluster installs (CRDs, RBAC, webhooks): glob patterns, copied to
    # ``assets/`` beside the binaries so that running the cluster needs no Go.
    assets: tuple[str, ...] = ()
    # Build tags for every binary, and more for one binary (binary name -> tags).
    tags: tuple[str, ...] = ()
    binary_tags: dict[str, tuple[str, ...]] = field(default_factory=dict)


COMPONENTS: dict[str, Component] = {
    c.name: c
    for c in (
        Component("etcd", "go.etcd.io/etcd/server/v3", "v3.6.16", {"etcd": "go.etcd.io/etcd/server/v3"}),
        Component(
            "kubernetes",
            "k8s.io/kubernetes",
            K8S_VERSION,
            {
                "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
                "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
                "kube-scheduler": "k8s.io/kubernetes/cmd/kube-scheduler",
            },
            kubernetes_version_flags=True,
        ),
        Component(
            "mpi-operator",
            "github.com/kubeflow/mpi-operator",
            "v0.8.2",
            {"mpi-operator": "github.com/kubeflow/mpi-operator/cmd/mpi-operator"},
            assets=("manifests/base/kubeflow.org_mpijobs.yaml", "manifests/base/cluster-role.yaml"),
        ),
        Component(
            "kueue",
            "sigs.k8s.io/kueue",
            "v0.17.1",
            {"kueue": "sigs.k8s.io/kueue/cmd/kueue"},
            assets=(
                "config/components/crd/bases/*.yaml",
                "config/components/webhook/manifests.yaml",
                "config/components/rbac/role.yaml",
                "config/components/rbac/manager_secrets_role.yaml",
            ),
        ),
        Component(
            "volcano",
            "volcano.sh/volcano",
            "v1.14.1",
            {
                "vc-scheduler": "volcano.sh/volcano/cmd/scheduler",
                "vc-controller-manager": "volcano.sh/volcano/cmd/controller-manager",
                "vc-webhook-manager": "volcano.sh/volcano/cmd/webhook-manager",
            },
            # Its go.mod points volcano.sh/apis at its own staging directory, which the module zip
            # leaves out; v1.14.0 is the newest release of it the proxy serves.
            replaces={"volcano.sh/apis": "v1.14.0"},
            assets=(
                "installer/helm/chart/volcano/crd/bases/*.yaml",
                "installer/helm/chart/volcano/charts/jobflow/crd/bases/*.yaml",  # the controllers watch them
                "installer/helm/chart/volcano/templates/webhooks.yaml",
                # The ClusterRoles of its three components and the scheduler's default actions.
                "installer/helm/chart/volcano/templates/admission.yaml",
                "installer/helm/chart/volcano/templates/controllers.yaml",
                "installer/helm/chart/volcano/templates/scheduler.yaml",
                "installer/helm/chart/volcano/config/volcano-scheduler.conf",
            ),
        ),
        # Kubeflow Trainer v2 runs a TrainJob as a JobSet: both controllers, from source.
        Component(
            "jobset",
            "sigs.k8s.io/jobset",
            "v0.12.0",
            {"jobset": "sigs.k8s.io/jobset"},
            assets=("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml", "config/components/rbac/role.yaml"),
        ),
        Component(
            "trainer",
            "github.com/kubeflow/trainer/v2",
            "v2.3.0",
            {"trainer-controller-manager": "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager"},
            assets=("manifests/base/crds/*.yaml", "manifests/base/rbac/role.yaml"),
        ),
        # The node side: what a real Node runs (tests/cluster/nodes.py). runc comes from Debian.
        Component(
            "kubernetes-node",
            "k8s.io/kubernetes",
            K8S_VERSION,
            {"kubelet": "k8s.io/kubernetes/cmd/kubelet", "kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy"},
            kubernetes_version_flags=True,
            # The pause container every pod sandbox starts with: no registry, so it is built here.
            assets=("build/pause/linux/pause.c",),
        ),
        Component(
            "containerd",
            "github.com/containerd/containerd/v2",
            "v2.4.2",
            {
                "containerd": "github.com/containerd/containerd/v2/cmd/containerd",
                "ctr": "github.com/containerd/containerd/v2/cmd/ctr",
                "containerd-shim-runc-v2": "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2",
            },
            # Snapshotters that need cgo or kernel modules this machine lacks are left out.
            tags=("no_btrfs", "no_devmapper", "no_zfs", "urfave_cli_no_docs"),
            binary_tags={"containerd-shim-runc-v2": ("no_grpc",)},
        ),
        Component(
            "cni-plugins",
            "github.com/containernetworking/plugins",
            "v1.10.0",
            {
                "bridge": "github.com/containernetworking/plugins/plugins/main/bridge",
                "loopback": "github.com/containernetworking/plugins/plugins/main/loopback",
                "host-local": "github.com/containernetworking/plugins/plugins/ipam/host-local",
                "portmap": "github.com/containernetworking/plugins/plugins/meta/portmap",
            },
        ),
        Component("coredns", "github.com/coredns/coredns", "v1.15.0", {"coredns": "github.com/coredns/coredns"}),
        Component("cri-tools", "sigs.k8s.io/cri-tools", "v1.37.0", {"crictl": "sigs.k8s.io/cri-tools/cmd/crictl"}),
    )
}


def cache_root() -> Path:
    return Path(os.environ.get("AIRFLOW_MPI_CLUSTER_CACHE", Path.home() / ".cache" / "airflow-mpi" / "k8s"))


def bin_dir(component: Component) -> Path:
    return cache_root() / f"{component.name}-{component.version}" / "bin"


def is_built(component: Component) -> bool:
    return (bin_dir(component) / ".complete").exists() and _assets_current(component)


def _assets_current(component: Component) -> bool:
    """The assets copied are the ones this checkout lists (a list that grew copies them again)."""
    if not component.assets:
        return True
    try:
        return json.loads((assets_dir(component) / ".patterns").read_text()) == list(component.assets)
    except (OSError, ValueError):
        return False


def assets_dir(component: Component) -> Path:
    return bin_dir(component).parent / "assets"


def copy_assets(component: Component, work: Path) -> None:
    """The module's CRDs, RBAC and webhook manifests, beside the binaries (same relative paths)."""
    if _assets_current(component):
        return
    upstream = module_dir(component.module, component.version, work)
    staging = assets_dir(component).with_name("assets.partial")
    shutil.rmtree(staging, ignore_errors=True)
    for pattern in component.assets:
        matches = sorted(upstream.glob(pattern))
        if not matches:
            raise RuntimeError(f"{component.module}@{component.version} has no {pattern}")
        for source in matches:
            target = staging / source.relative_to(upstream)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
    (staging / ".patterns").write_text(json.dumps(list(component.assets)))
    shutil.rmtree(assets_dir(component), ignore_errors=True)
    staging.rename(assets_dir(component))


def _go(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(["go", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"go {' '.join(args)} (in {cwd}) failed:\n{proc.stderr.strip()[-4000:]}")
    return proc.stdout


def module_dir(module: str, version: str, cwd: Path) -> Path:
    """Downloads MODULE@VERSION into the module cache and returns its directory."""
    info = json.loads(_go(["mod", "download", "-json", f"{module}@{version}"], cwd))
    if info.get("Error"):
        raise RuntimeError(f"{module}@{version}: {info['Error']}")
    return Path(info["Dir"])


def served(module: str, version: str, cwd: Path) -> bool:
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"], cwd=cwd, capture_output=True, text=True
    )
    return proc.returncode == 0 and not json.loads(proc.stdout or "{}").get("Error")


def upstream_replaces(upstream: Path) -> tuple[list[str], dict[str, str]]:
    """The upstream go.mod's replace directives, which Go ignores outside the main module: the
    modules it points at paths of its own repository, and the others (module -> version)."""
    edit = json.loads(
        subprocess.run(
            ["go", "mod", "edit", "-json", str(upstream / "go.mod")], capture_output=True, text=True, check=True
        ).stdout
    )
    local, published = [], {}
    for replace in edit.get("Replace") or []:
        old, new = replace["Old"]["Path"], replace["New"]
        if new["Path"].startswith(("./", "../")):
            local.append(old)
        elif not replace["Old"].get("Version"):
            published[old] = f"{new['Path']}@{new['Version']}"
    return local, published


def stub_module(root: Path, module: str) -> Path:
    """A module with a go.mod only: stands in for a module that is in the upstream module graph but
    that no built package imports, when the proxy does not serve it (so nothing of it compiles)."""
    path = root / "stubs" / module.replace("/", "_")
    path.mkdir(parents=True, exist_ok=True)
    (path / "go.mod").write_text(f"module {module}\n\ngo 1.22\n")
    return path


def version_ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion={version}",
            f"-X {package}.gitMajor={major}",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
            f"-X {package}.buildDate=1970-01-01T00:00:00Z",
        ]
    return " ".join(flags)


def build(component: Component, log=print) -> Path:
    """Builds COMPONENT's binaries unless they are already there; returns their directory."""
    out = bin_dir(component)
    if (out / ".complete").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        copy_assets(component, out.parent)
        return out
    work = out.parent / "src"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    started = time.monotonic()
    env = dict(os.environ, GOFLAGS="-mod=mod", CGO_ENABLED="0")
    _go(["mod", "init", f"local/airflow-mpi-build/{component.name}"], work)
    upstream = module_dir(component.module, component.version, work)
    upstream_go = json.loads(_go(["mod", "edit", "-json", str(upstream / "go.mod")], work)).get("Go")
    if upstream_go:
        _go(["mod", "edit", f"-go={upstream_go}"], work)
    _go(["mod", "edit", f"-require={component.module}@{component.version}"], work)
    for module, version in component.requires.items():
        _go(["mod", "edit", f"-require={module}@{version}"], work)
    local, published = upstream_replaces(upstream)
    for module, target in sorted(published.items()):  # as upstream builds it
        _go(["mod", "edit", f"-replace={module}={target}"], work)
    replaced = dict(component.replaces)
    if component.kubernetes_version_flags:
        for module in local:
            replaced.setdefault(module, STAGING_VERSION)
    for module, version in sorted(replaced.items()):
        if served(module, version, work):
            _go(["mod", "edit", f"-replace={module}={module}@{version}"], work)
        else:
            log(f"build {component.name}: {module}@{version} is not served; a go.mod-only stub stands in")
            _go(["mod", "edit", f"-replace={module}={stub_module(work, module)}"], work)
    # A file that imports nothing keeps `go build` in module mode with this go.mod.
    (work / "doc.go").write_text("// Package build only holds the wrapper go.mod.\npackage build\n")
    ldflags = "-s -w"
    if component.kubernetes_version_flags:
        ldflags += " " + version_ldflags(component.version)
    staging = out.with_name("bin.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for binary, package in component.binaries.items():
        t0 = time.monotonic()
        log(f"build {component.name}: {binary} from {package}@{component.version}")
        tags = ",".join((*component.tags, *component.binary_tags.get(binary, ())))
        flags = ["-tags", tags] if tags else []
        _go(["build", "-trimpath", *flags, "-ldflags", ldflags, "-o", str(staging / binary), package], work, env)
        log(f"build {component.name}: {binary} in {time.monotonic() - t0:.0f} s")
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    (out / ".complete").write_text(json.dumps({"version": component.version, "seconds": time.monotonic() - started}))
    copy_assets(component, work)
    return out


# What the real-cluster tier runs: every component.
TIER = tuple(COMPONENTS)
NODE_TIER = ("kubernetes-node", "containerd", "cni-plugins", "coredns", "cri-tools")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(COMPONENTS), help="build these components only")
    args = parser.parse_args(argv)
    if not shutil.which("go"):
        print("build: Go is not installed (https://go.dev/dl/); the real-cluster tier needs it", file=sys.stderr)
        return 2
    for name in args.only or TIER:
        t0 = time.monotonic()
        path = build(COMPONENTS[name], log=lambda m: print(m, flush=True))
        print(f"{name} {COMPONENTS[name].version}: {path} ({time.monotonic() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
