"""The images of ``make airflow-image`` (tests/cluster/image.py), run for real with buildah on a
storage root of their own, before any cluster imports them:

- the Airflow image (``docker/airflow/Dockerfile`` on the stand-in for apache/airflow): Airflow
  3.3.2 as the user airflow (uid 50000, group 0) with AIRFLOW_HOME=/opt/airflow, the
  cncf-kubernetes provider and airflow-mpi among its providers, the PostgreSQL driver, the
  ``airflow-mpi`` command line;
- the PostgreSQL image: first start on an empty, root-owned volume (initdb as postgres), a
  password login over TCP (a wrong password refused), Airflow's own ``airflow db check`` from the
  Airflow image through its driver, and a fast shutdown on the image's stop signal while a client
  is connected.

The containers share a network namespace of the test's own (nothing listens on the machine's).
Without buildah or the images the module is skipped with one line; under CI it fails instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.cluster import image
from tests.cluster.conftest import _required
from tests.cluster.test_airflow_releases import RELEASES

# Root (buildah, a network namespace) and the built images; no cluster.
pytestmark = [pytest.mark.integration]

HOW_TO_BUILD = "needs buildah and the Airflow and PostgreSQL images: run `make airflow-image`"
PASSWORD = "s3cret-pw"
DB_URL = f"postgresql+psycopg2://airflow:{PASSWORD}@127.0.0.1:5432/airflow"


class Images:
    """The two images pulled into a buildah storage root, and a network namespace to run them in."""

    def __init__(self, buildah: image.Buildah, netns: subprocess.Popen[bytes]) -> None:
        self.buildah = buildah
        self.netns = netns

    def argv(self, container: str, command: list[str], *options: str) -> list[str]:
        enter = ["nsenter", f"--net=/proc/{self.netns.pid}/ns/net"]
        return [*enter, *self.buildah.command("run", "--network", "host", *options, container, "--", *command)]

    def run(self, container: str, command: list[str], *options: str, timeout: float = 120) -> tuple[int, str]:
        done = subprocess.run(
            self.argv(container, command, *options), capture_output=True, text=True, timeout=timeout, check=False
        )
        return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def images() -> Iterator[Images]:
    archives = image.airflow_archives() if all(shutil.which(t) for t in ("buildah", "nsenter", "unshare")) else {}
    if not archives:
        if _required():
            pytest.fail(HOW_TO_BUILD)
        pytest.skip(HOW_TO_BUILD)
    buildah = image.Buildah(log=lambda _: None, driver="overlay")  # layers shared, not copied
    netns = subprocess.Popen(["unshare", "--net", "sleep", "900"])
    try:
        for archive in archives.values():
            buildah("pull", "--quiet", f"docker-archive:{archive}")
        buildah("from", "--name", "airflow", image.AIRFLOW_IMAGE)
        buildah("from", "--name", "postgres", image.POSTGRES_IMAGE)
        ours = os.readlink("/proc/self/ns/net")
        while os.readlink(f"/proc/{netns.pid}/ns/net") == ours:  # until unshare has made it
            time.sleep(0.05)
        subprocess.run(["nsenter", f"--net=/proc/{netns.pid}/ns/net", "ip", "link", "set", "lo", "up"], check=True)
        yield Images(buildah, netns)
    finally:
        netns.kill()
        netns.wait()
        subprocess.run(buildah.command("rm", "--all"), capture_output=True, check=False)
        buildah.close()


def test_the_airflow_image_runs_airflow_3_3_2_with_the_provider_as_uid_50000(images: Images) -> None:
    rc, out = images.run("airflow", ["bash", "-c", 'id -u; id -g; echo "$AIRFLOW_HOME"; airflow version'])
    assert rc == 0, out
    assert out.split()[:4] == ["50000", "0", "/opt/airflow", "3.3.2"], out

    rc, out = images.run("airflow", ["airflow", "providers", "list", "--output", "plain"])
    assert rc == 0, out
    providers = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert {"apache-airflow-providers-cncf-kubernetes", "airflow-mpi"} <= providers, out

    rc, out = images.run("airflow", ["python", "-c", "import psycopg2, airflow_mpi; print(airflow_mpi.__file__)"])
    assert rc == 0, out
    assert "/home/airflow/.local/" in out, out  # the wheel, not a checkout

    rc, out = images.run("airflow", ["airflow-mpi", "--help"])
    assert rc == 0, out
    assert "doctor" in out, out


def test_the_stand_in_resolves_airflow_as_the_compatibility_tier_does() -> None:
    """One date for Airflow 3.3.2's dependencies in both places, so the deployment runs what the
    compatibility tier checked."""
    recipe = (image.REPO / image.AIRFLOW_BASE_DOCKERFILE).read_text()
    (date,) = re.findall(r"^ARG EXCLUDE_NEWER=(\S+)$", recipe, re.M)
    (version,) = re.findall(r"^ARG AIRFLOW_VERSION=(\S+)$", recipe, re.M)
    assert RELEASES[version] == date


def postmaster(images: Images, started: subprocess.Popen[str]) -> psutil.Process:
    """The postgres server among the processes ``buildah run`` started (it runs in a PID
    namespace of its own, so its postmaster.pid does not name it here)."""
    found = [p for p in psutil.Process(started.pid).children(recursive=True) if p.name() == "postgres"]
    servers = [p for p in found if p.parent() is not None and p.parent().name() != "postgres"]
    assert len(servers) == 1, found
    return servers[0]


def test_postgres_starts_on_a_root_owned_volume_and_takes_a_password_over_tcp(images: Images) -> None:
    data = Path(tempfile.mkdtemp(prefix="airflow-mpi-pgdata-", dir="/var/tmp"))  # root-owned, as a fresh volume
    env = ["-e", "POSTGRES_USER=airflow", "-e", f"POSTGRES_PASSWORD={PASSWORD}", "-e", "POSTGRES_DB=airflow"]
    server = subprocess.Popen(
        images.argv("postgres", ["/usr/local/bin/postgres-entrypoint"], "--user", "0:0", *env,
                    "--volume", f"{data}:/var/lib/postgresql/data"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while images.run("postgres", ["pg_isready", "-q", "-h", "127.0.0.1"])[0] != 0:
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            assert time.monotonic() < deadline, "postgres never answered on 127.0.0.1:5432"
            time.sleep(0.5)
        assert data.stat().st_uid == 999 and (data / "PG_VERSION").exists()
        serving = postmaster(images, server)
        assert serving.uids().real == 999

        query = ["psql", "-h", "127.0.0.1", "-U", "airflow", "-d", "airflow", "-Atc"]
        rc, out = images.run(
            "postgres", [*query, "select current_user, current_database()"], "-e", f"PGPASSWORD={PASSWORD}"
        )
        assert (rc, out.strip()) == (0, "airflow|airflow"), out
        rc, out = images.run("postgres", [*query, "select 1"], "-e", "PGPASSWORD=wrong")
        assert rc != 0 and "password authentication failed" in out, out

        # Airflow's own check, through the Airflow image's driver.
        rc, out = images.run(
            "airflow", ["airflow", "db", "check"], "-e", f"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN={DB_URL}"
        )
        assert rc == 0, out

        # The image's stop signal is a fast shutdown: a connected client does not hold it up.
        stop = images.buildah.command("inspect", "--format", "{{.OCIv1.Config.StopSignal}}", image.POSTGRES_IMAGE)
        assert subprocess.run(stop, capture_output=True, text=True, check=True).stdout.strip() == "SIGINT"
        client = subprocess.Popen(
            images.argv("postgres", [*query, "select pg_sleep(120)"], "-e", f"PGPASSWORD={PASSWORD}"),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(2)
            stopping = time.monotonic()
            serving.send_signal(2)
            assert server.wait(timeout=30) == 0
            assert time.monotonic() - stopping < 15
        finally:
            client.kill()
            client.wait()
        # A second start finds the database and keeps it (``-C`` prints a setting instead of serving).
        rc, out = images.run("postgres", ["/usr/local/bin/postgres-entrypoint", "-C", "server_version"],
                             "--user", "0:0", *env, "--volume", f"{data}:/var/lib/postgresql/data")  # fmt: skip
        assert rc == 0 and "initialized" not in out and out.startswith("15."), out
    finally:
        if server.poll() is None:
            for process in psutil.Process(server.pid).children(recursive=True):
                process.kill()
            server.kill()
        server.wait()
        shutil.rmtree(data, ignore_errors=True)


def test_postgres_refuses_to_start_without_a_password(images: Images) -> None:
    rc, out = images.run("postgres", ["/usr/local/bin/postgres-entrypoint"], "--user", "0:0")
    assert rc != 0 and "POSTGRES_PASSWORD" in out, out
