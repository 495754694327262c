"""Builds the training image from ``docker/Dockerfile`` for real, without a registry or a daemon:
a Debian 12 base made by ``mmdebstrap`` from Debian's packages, then ``buildah bud`` on the
Dockerfile as users build it, with that base as ``PYTHON_IMAGE``. The result is a
``docker-archive`` tarball that every real Node's containerd imports (tests/cluster/nodes.py).

Each image is cached by the hash of its inputs under ``~/.cache/airflow-mpi/images`` (beside the
cluster's binaries), so a warm run rebuilds nothing. buildah runs with a storage root of its own
(``vfs``: no mounts outlive it), removed after each build; no daemon is left running.

Two images come out:
- ``localhost/airflow-mpi-base:bookworm``: Debian 12 with Debian's Python 3.11 and nothing else
  (no sshd, no mpiexec): the base, and the "image that lacks sshd" the failure tests use;
- ``localhost/airflow-mpi-train:dev``: the Dockerfile's image (sshd, Open MPI, torch, DeepSpeed,
  mpi4py, the launch script, the example's training script);
- ``localhost/airflow-mpi-slim:<mpi>``: the Dockerfile with ``STACK=slim`` (sshd, mpi4py, no
  torch) and ``MPI=`` each of ``SLIM_MPIS``: Open MPI 5, MPICH and Intel MPI from PyPI.

And, for Airflow deployed inside the cluster (``--airflow``, ``make airflow-image``):
- ``localhost/airflow-mpi-airflow-base:3.3.2``: ``docker/airflow/base.Dockerfile``, a stand-in for
  ``apache/airflow:3.3.2-python3.11`` (no registry here) with the same layout;
- ``localhost/airflow-mpi-airflow:dev``: ``docker/airflow/Dockerfile`` (the recipe users add to
  their own Airflow image) on that stand-in, with the wheel built from this checkout: a product
  change rebuilds only this thin layer;
- ``localhost/airflow-mpi-postgres:15``: ``docker/postgres/Dockerfile``, Debian's PostgreSQL 15.

The torch stack comes from the package cache the virtualenv filled (``uv``'s cache, mounted at
build time), not downloaded again.

    python tests/cluster/image.py [--force] [--airflow]

Test code: nothing here ships in the wheel.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
# What the base has: Debian's Python (with its venv module, as python:3.11-slim has) and the CA
# certificates pip needs. Everything else is the Dockerfile's to install.
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_IMAGE = f"localhost/airflow-mpi-base:{SUITE}"
TRAIN_IMAGE = "localhost/airflow-mpi-train:dev"
# The files the Dockerfile reads (its build context) and the recipe it runs.
TRAIN_INPUTS = (
    "docker/Dockerfile",
    "docker/install-runtime.sh",
    "docker/requirements-runtime.txt",
    "docker/requirements-slim.txt",
    "airflow_mpi/scripts/launch.sh",
    "dags/scripts/train_digits.py",
)
RECIPE_VERSION = "1"  # bump when this file changes what it builds
# The slim images (the same Dockerfile, ``STACK=slim``: mpi4py, no torch), one per MPI other than
# Debian's Open MPI 4 (the training image's): ``--build-arg MPI`` -> image.
SLIM_MPIS = ("openmpi5", "mpich", "intel")


def slim_image(mpi: str) -> str:
    return f"localhost/airflow-mpi-slim:{mpi}"


AIRFLOW_BASE_IMAGE = "localhost/airflow-mpi-airflow-base:3.3.2"
AIRFLOW_IMAGE = "localhost/airflow-mpi-airflow:dev"
POSTGRES_IMAGE = "localhost/airflow-mpi-postgres:15"
AIRFLOW_BASE_DOCKERFILE = "docker/airflow/base.Dockerfile"
AIRFLOW_DOCKERFILE = "docker/airflow/Dockerfile"
# What the example DAG's own Python tasks import (preprocess: scikit-learn's digits; evaluate:
# numpy): they run in the Airflow workers, so the deployment's image has them, as a user's has
# their DAGs' (the recipe's DAG_PACKAGES).
EXAMPLE_DAG_PACKAGES = "numpy<3 scikit-learn==1.9.1"
POSTGRES_INPUTS = ("docker/postgres/Dockerfile", "docker/postgres/postgres-entrypoint")
# What the wheel is built from (README.md too, but only as its description: it does not rebuild).
WHEEL_INPUTS = ("airflow_mpi", "pyproject.toml", "MANIFEST.in")


@dataclass(frozen=True)
class Built:
    """One image in the cache: its archive, name, and what building it measured."""

    name: str
    archive: Path
    seconds: float
    size_bytes: int
    cached: bool


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "airflow-mpi"
    return Path(os.environ.get("AIRFLOW_MPI_IMAGE_CACHE", default / "images"))


def _digest(parts: list[bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:16]


def base_key() -> str:
    return _digest([RECIPE_VERSION.encode(), SUITE.encode(), " ".join(BASE_PACKAGES).encode(), _host_ca_bytes()])


def train_key() -> str:
    return _digest([base_key().encode(), *((REPO / path).read_bytes() for path in TRAIN_INPUTS)])


def slim_key(mpi: str) -> str:
    return _digest([base_key().encode(), mpi.encode(), *((REPO / path).read_bytes() for path in TRAIN_INPUTS)])


def _host_ca_bytes() -> bytes:
    """The machine's own extra CA certificates (an egress proxy's), which the base trusts too, so
    that pip and apt inside the build reach the package registries as the machine does."""
    folder = Path("/usr/local/share/ca-certificates")
    return b"".join(p.read_bytes() for p in sorted(folder.glob("*.crt"))) if folder.is_dir() else b""


def _run(argv: list[str], log, **kwargs) -> None:
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[:3])} ... failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}"
        )
    log(f"image: {' '.join(argv[:2])} in {time.monotonic() - t0:.0f} s")


class Buildah:
    """buildah with a storage root of its own, removed by ``close``: vfs (no mounts) to build,
    overlay to run images (vfs copies every layer whole: seconds to make, a minute to remove
    under load)."""

    def __init__(self, log, driver: str = "vfs") -> None:
        self.root = Path(tempfile.mkdtemp(prefix="airflow-mpi-buildah-", dir="/var/tmp"))
        self.log = log
        self.driver = driver

    def command(self, *args: str) -> list[str]:
        """The argv of ``buildah ARGS`` on this storage root (to run it oneself)."""
        return ["buildah", "--root", str(self.root / "root"), "--runroot", str(self.root / "run"),
                "--storage-driver", self.driver, *args]  # fmt: skip

    def __call__(self, *args: str, cwd: Path | None = None) -> None:
        t0 = time.monotonic()
        _run(self.command(*args), lambda _: None, cwd=cwd)
        self.log(f"image: buildah {args[0]} in {time.monotonic() - t0:.0f} s")

    def save(self, image: str, archive: Path) -> None:
        """``image`` as a docker-archive (what ``ctr images import`` reads), whole or not at all."""
        partial = archive.with_suffix(".partial")
        self("push", "--quiet", image, f"docker-archive:{partial}:{image}")
        partial.rename(archive)

    def close(self) -> None:
        # vfs with chroot isolation mounts nothing; overlay's mounts are undone by ``buildah rm``,
        # and any a killed run left are undone here before the tree of image layers goes.
        if self.driver != "vfs":
            below = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
                     if line.split()[1].startswith(f"{self.root}/")]  # fmt: skip
            for mount in reversed(below):
                subprocess.run(["umount", "--lazy", mount], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)


def _missing_tools() -> list[str]:
    return [tool for tool in ("mmdebstrap", "buildah") if not shutil.which(tool)]


def _finish(name: str, archive: Path, started: float, log) -> Built:
    seconds = time.monotonic() - started
    size = archive.stat().st_size
    (archive.parent / "build.json").write_text(json.dumps({"name": name, "seconds": seconds, "size_bytes": size}))
    log(f"image: {name} built in {seconds:.0f} s, {size / 2**20:.0f} MiB")
    return Built(name, archive, seconds, size, cached=False)


def _cached(name: str, archive: Path) -> Built | None:
    record = archive.parent / "build.json"
    if not (archive.exists() and record.exists()):
        return None
    meta = json.loads(record.read_text())
    return Built(name, archive, meta["seconds"], meta["size_bytes"], cached=True)


def build_base(log=print, force: bool = False) -> Built:
    """Debian 12's minimal root filesystem with Python, committed as ``BASE_IMAGE``."""
    folder = cache_dir() / f"base-{base_key()}"
    archive = folder / "image.tar"
    if not force and (hit := _cached(BASE_IMAGE, archive)):
        return hit
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    buildah = Buildah(log)
    try:
        rootfs = buildah.root / "rootfs.tar"
        hooks = []
        if _host_ca_bytes():
            hooks = ["--customize-hook=cp /usr/local/share/ca-certificates/*.crt \"$1/usr/local/share/ca-certificates/\"",
                     "--customize-hook=chroot \"$1\" update-ca-certificates >/dev/null"]  # fmt: skip
        _run(["mmdebstrap", "--variant=minbase", "--quiet", f"--include={','.join(BASE_PACKAGES)}",
              # The machine's Debian mirror may serve a snapshot older than its Release file's
              # validity; apt inside the image build needs the same allowance.
              "--aptopt=Acquire::Check-Valid-Until \"false\"", "--aptopt=Acquire::Check-Date \"false\"",
              *hooks, SUITE, str(rootfs)], log)  # fmt: skip
        buildah("from", "--name", "base", "scratch")
        buildah("add", "base", str(rootfs), "/")
        buildah("config", "--cmd", "bash", "--env", "LANG=C.UTF-8", "base")
        buildah("commit", "--quiet", "base", BASE_IMAGE)
        buildah.save(BASE_IMAGE, archive)
    finally:
        buildah.close()
    return _finish(BASE_IMAGE, archive, started, log)


def build_train(log=print, force: bool = False) -> Built:
    """``docker/Dockerfile`` on the local base, as ``TRAIN_IMAGE``."""
    return _build_dockerfile(TRAIN_IMAGE, f"train-{train_key()}", {}, log, force)


def build_slim(mpi: str, log=print, force: bool = False) -> Built:
    """``docker/Dockerfile`` with ``MPI=mpi`` and ``STACK=slim`` on the local base, as ``slim_image(mpi)``."""
    return _build_dockerfile(slim_image(mpi), f"slim-{mpi}-{slim_key(mpi)}", {"MPI": mpi, "STACK": "slim"}, log, force)


def _build_dockerfile(name: str, folder_name: str, args: dict[str, str], log, force: bool) -> Built:
    """``docker/Dockerfile`` with build ``args`` on the local base, as ``name``, cached in ``folder_name``."""
    folder = cache_dir() / folder_name
    archive = folder / "image.tar"
    if not force and (hit := _cached(name, archive)):
        return hit
    base = build_base(log)
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    buildah = Buildah(log)
    try:
        buildah("pull", "--quiet", f"docker-archive:{base.archive}")
        # The recipe installs with uv when it finds one, so torch is copied, not downloaded.
        build_args = [part for key, value in args.items() for part in ("--build-arg", f"{key}={value}")]
        buildah("bud", "--quiet", "--isolation", "chroot", "--network", "host", "--layers=false",
                "--build-arg", f"PYTHON_IMAGE={BASE_IMAGE}", *build_args, *_uv_mounts(),
                "-f", "docker/Dockerfile", "-t", name, ".", cwd=REPO)  # fmt: skip
        buildah.save(name, archive)
    finally:
        buildah.close()
    return _finish(name, archive, started, log)


def airflow_base_key() -> str:
    # The Dockerfile carries the pins (the Airflow version and the day uv resolves as of).
    return _digest([base_key().encode(), (REPO / AIRFLOW_BASE_DOCKERFILE).read_bytes()])


def _wheel_sources() -> list[str]:
    """The tracked files the wheel is built from, as they are in the checkout now."""
    listed = subprocess.run(["git", "ls-files", "-z", *WHEEL_INPUTS], cwd=REPO, capture_output=True, check=True)
    return sorted(name for name in listed.stdout.decode().split("\0") if name and (REPO / name).is_file())


def airflow_key() -> str:
    sources = [part for name in _wheel_sources() for part in (name.encode(), (REPO / name).read_bytes())]
    return _digest(
        [airflow_base_key().encode(), (REPO / AIRFLOW_DOCKERFILE).read_bytes(), EXAMPLE_DAG_PACKAGES.encode(), *sources]
    )


def postgres_key() -> str:
    return _digest([base_key().encode(), *((REPO / path).read_bytes() for path in POSTGRES_INPUTS)])


def _uv_mounts(python: Path | None = None) -> list[str]:
    """The virtualenv's uv and its package cache, mounted at build time only (not in the image):
    packages are copied from the cache, not downloaded again."""
    uv = shutil.which("uv", path=str((python or Path(sys.executable)).parent))
    uv_cache = Path(os.environ.get("UV_CACHE_DIR", Path.home() / ".cache" / "uv"))
    if not (uv and uv_cache.is_dir()):
        return []
    return ["--volume", f"{uv}:/usr/local/bin/uv:ro", "--volume", f"{uv_cache}:/root/.cache/uv"]


def build_airflow_base(log=print, force: bool = False) -> Built:
    """``docker/airflow/base.Dockerfile`` on the Debian base, as ``AIRFLOW_BASE_IMAGE``."""
    folder = cache_dir() / f"airflow-base-{airflow_base_key()}"
    archive = folder / "image.tar"
    if not force and (hit := _cached(AIRFLOW_BASE_IMAGE, archive)):
        return hit
    mounts = _uv_mounts()
    if not mounts:
        raise RuntimeError("building the Airflow base needs uv and its cache beside this Python: make setup")
    base = build_base(log)
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    buildah = Buildah(log)
    try:
        buildah("pull", "--quiet", f"docker-archive:{base.archive}")
        buildah("bud", "--quiet", "--isolation", "chroot", "--network", "host", "--layers=false",
                "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", *mounts,
                "-f", AIRFLOW_BASE_DOCKERFILE, "-t", AIRFLOW_BASE_IMAGE, ".", cwd=REPO)  # fmt: skip
        buildah.save(AIRFLOW_BASE_IMAGE, archive)
    finally:
        buildah.close()
    return _finish(AIRFLOW_BASE_IMAGE, archive, started, log)


def build_wheel(out: Path, log=print) -> Path:
    """The wheel of this checkout's tracked sources (copied aside, so the checkout gets no build
    folders), into ``out``."""
    source = out / "source"
    for name in [*_wheel_sources(), "README.md"]:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
    # The environment's setuptools: no download in the build.
    isolation = ["--no-isolation"] if importlib.util.find_spec("setuptools") else []
    _run([sys.executable, "-m", "build", "--wheel", *isolation, "--outdir", str(out / "dist"), str(source)], log)
    (wheel,) = (out / "dist").glob("airflow_mpi-*.whl")
    return wheel


def build_airflow(log=print, force: bool = False) -> Built:
    """``docker/airflow/Dockerfile`` (what users add to their Airflow image) on the stand-in, with
    this checkout's wheel as its context, as ``AIRFLOW_IMAGE``."""
    folder = cache_dir() / f"airflow-{airflow_key()}"
    archive = folder / "image.tar"
    if not force and (hit := _cached(AIRFLOW_IMAGE, archive)):
        return hit
    base = build_airflow_base(log)
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    buildah = Buildah(log)
    try:
        wheel = build_wheel(buildah.root / "wheel", log)
        buildah("pull", "--quiet", f"docker-archive:{base.archive}")
        buildah("bud", "--quiet", "--isolation", "chroot", "--network", "host", "--layers=false",
                "--build-arg", f"AIRFLOW_IMAGE={AIRFLOW_BASE_IMAGE}",
                "--build-arg", f"DAG_PACKAGES={EXAMPLE_DAG_PACKAGES}",
                "-f", str(REPO / AIRFLOW_DOCKERFILE), "-t", AIRFLOW_IMAGE, str(wheel.parent))  # fmt: skip
        buildah.save(AIRFLOW_IMAGE, archive)
    finally:
        buildah.close()
    return _finish(AIRFLOW_IMAGE, archive, started, log)


def build_postgres(log=print, force: bool = False) -> Built:
    """``docker/postgres/Dockerfile`` on the Debian base, as ``POSTGRES_IMAGE``."""
    folder = cache_dir() / f"postgres-{postgres_key()}"
    archive = folder / "image.tar"
    if not force and (hit := _cached(POSTGRES_IMAGE, archive)):
        return hit
    base = build_base(log)
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    buildah = Buildah(log)
    try:
        buildah("pull", "--quiet", f"docker-archive:{base.archive}")
        buildah("bud", "--quiet", "--isolation", "chroot", "--network", "host", "--layers=false",
                "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
                "-f", "docker/postgres/Dockerfile", "-t", POSTGRES_IMAGE, ".", cwd=REPO)  # fmt: skip
        buildah.save(POSTGRES_IMAGE, archive)
    finally:
        buildah.close()
    return _finish(POSTGRES_IMAGE, archive, started, log)


def airflow_archives() -> dict[str, Path]:
    """The Airflow and PostgreSQL images of this checkout's inputs (role -> docker-archive), where
    both are built (``make airflow-image``); else empty."""
    archives = {
        "airflow": cache_dir() / f"airflow-{airflow_key()}" / "image.tar",
        "postgres": cache_dir() / f"postgres-{postgres_key()}" / "image.tar",
    }
    return archives if all(a.exists() for a in archives.values()) else {}


def build_airflow_images(log=print, force: bool = False) -> dict[str, Built]:
    """The Airflow image (and its stand-in base) and the PostgreSQL image, each cached by the hash
    of its inputs. ``force`` rebuilds the two images, not the stand-in (minutes of packages)."""
    missing = _missing_tools()
    if missing:
        raise RuntimeError(f"building the images needs {', '.join(missing)}: apt-get install {' '.join(missing)}")
    return {"airflow": build_airflow(log, force), "postgres": build_postgres(log, force)}


PAUSE_IMAGE = "localhost/pause:3.10"


def _pause_source() -> Path:
    """pause.c of the Kubernetes release the Nodes run (copied beside their binaries)."""
    from tests.cluster.build import COMPONENTS, assets_dir

    return assets_dir(COMPONENTS["kubernetes-node"]) / "build" / "pause" / "linux" / "pause.c"


def pause_key() -> str:
    return _digest([RECIPE_VERSION.encode(), _pause_source().read_bytes()])


def build_pause(log=print, force: bool = False) -> Built:
    """The pod sandbox's pause container, from the Kubernetes source (``build/pause/linux/pause.c``,
    copied beside the node binaries by tests/cluster/build.py) compiled statically here: there is
    no registry to pull it from."""
    source = _pause_source()
    folder = cache_dir() / f"pause-{pause_key()}"
    archive = folder / "image.tar"
    if not force and (hit := _cached(PAUSE_IMAGE, archive)):
        return hit
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    buildah = Buildah(log)
    try:
        binary = buildah.root / "pause"
        _run(["gcc", "-Os", "-static", "-DVERSION=v3.10-airflow-mpi", "-o", str(binary), str(source)], log)
        buildah("from", "--name", "pause", "scratch")
        buildah("copy", "pause", str(binary), "/pause")
        buildah("config", "--entrypoint", '["/pause"]', "--user", "65535:65535", "pause")
        buildah("commit", "--quiet", "pause", PAUSE_IMAGE)
        buildah.save(PAUSE_IMAGE, archive)
    finally:
        buildah.close()
    return _finish(PAUSE_IMAGE, archive, started, log)


def cached_archives() -> dict[str, Path]:
    """The pause, base, training and slim images of this checkout's inputs, where all are built
    (``make image``); else empty."""
    if not _pause_source().exists():
        return {}
    folders = {
        "pause": f"pause-{pause_key()}",
        "base": f"base-{base_key()}",
        "train": f"train-{train_key()}",
        **{f"slim-{mpi}": f"slim-{mpi}-{slim_key(mpi)}" for mpi in SLIM_MPIS},
    }
    archives = {role: cache_dir() / folder / "image.tar" for role, folder in folders.items()}
    return archives if all(a.exists() for a in archives.values()) else {}


def _airflow_folders() -> set[Path]:
    """The cache folders of this checkout's Airflow images (built or not), which ``prune`` keeps."""
    names = [f"airflow-base-{airflow_base_key()}", f"airflow-{airflow_key()}", f"postgres-{postgres_key()}"]
    return {cache_dir() / name for name in names}


def prune(keep: tuple[Path, ...]) -> None:
    """Remove the cache's images of older inputs (each is gigabytes); this checkout's Airflow
    images stay whether or not they are among ``keep``."""
    kept = {k.parent for k in keep} | _airflow_folders()
    for folder in cache_dir().glob("*-*"):
        if folder.is_dir() and folder not in kept:
            shutil.rmtree(folder, ignore_errors=True)


def build_all(log=print, force: bool = False) -> dict[str, Built]:
    missing = _missing_tools()
    if missing:
        raise RuntimeError(f"building the image needs {', '.join(missing)}: apt-get install {' '.join(missing)}")
    built = {"pause": build_pause(log, force), "base": build_base(log, force), "train": build_train(log, force)}
    built.update({f"slim-{mpi}": build_slim(mpi, log, force) for mpi in SLIM_MPIS})
    prune(tuple(b.archive for b in built.values()))
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when the cache has the inputs' images")
    parser.add_argument("--airflow", action="store_true", help="the Airflow and PostgreSQL images instead")
    args = parser.parse_args(argv)
    build = build_airflow_images if args.airflow else build_all
    for role, built in build(lambda m: print(m, flush=True), args.force).items():
        state = "cached" if built.cached else "built"
        print(
            f"{role}: {built.name} {state} ({built.seconds:.0f} s to build, {built.size_bytes / 2**20:.0f} MiB): {built.archive}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
