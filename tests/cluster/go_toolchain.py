"""Go for `make cluster-build` on a machine without it: the official toolchain from the Go module
proxy (the zip the ``go`` command itself fetches when it switches toolchains), unpacked into
/usr/local/go. Debian 12's golang-go (1.19) is too old for the Kubernetes sources.

The zip is checked as the ``go`` command checks every module: its ``h1:`` hash (the hash of each
file's SHA-256 and name) must be the one pinned here, which is the checksum database's record
(https://sum.golang.org/lookup/golang.org/toolchain@v0.0.1-go<version>.linux-amd64), so a proxy or
mirror that serves other bytes is refused before anything is unpacked.

    python3 tests/cluster/go_toolchain.py 1.26.8 [/usr/local/go]
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

PROXY = os.environ.get("GOPROXY", "https://proxy.golang.org").split(",")[0]
# go<version> -> the checksum database's h1: hash of golang.org/toolchain v0.0.1-go<version>.linux-amd64
PINNED_H1 = {"1.26.8": "h1:ZOmGe1OnfREDMIdb1Qi4G9JSuDPBLGExZMQ4nis1RXM="}


def toolchain_url(version: str, proxy: str = PROXY) -> str:
    """The module zip of ``go<version>`` for linux-amd64 on the proxy."""
    return f"{proxy.rstrip('/')}/golang.org/toolchain/@v/v0.0.1-go{version}.linux-amd64.zip"


def module_hash(archive: zipfile.ZipFile) -> str:
    """The Go module zip's ``h1:`` hash (golang.org/x/mod's ``dirhash.Hash1``): SHA-256 over the
    sorted lines "<file's SHA-256>  <name>"."""
    names = sorted(member.filename for member in archive.infolist() if not member.is_dir())
    summary = "".join(f"{hashlib.sha256(archive.read(name)).hexdigest()}  {name}\n" for name in names)
    return "h1:" + base64.b64encode(hashlib.sha256(summary.encode()).digest()).decode()


def verify(archive: zipfile.ZipFile, version: str) -> None:
    """Refuses a toolchain whose hash is not the pinned one, or a version with no pin."""
    pinned = PINNED_H1.get(version)
    if pinned is None:
        raise ValueError(
            f"go {version}: no pinned checksum; add its h1: hash from "
            f"https://sum.golang.org/lookup/golang.org/toolchain@v0.0.1-go{version}.linux-amd64 "
            f"to PINNED_H1 in {Path(__file__).name}"
        )
    found = module_hash(archive)
    if found != pinned:
        raise ValueError(f"go {version}: the downloaded toolchain's hash is {found}, not the pinned {pinned}")


def install(version: str, goroot: Path) -> Path:
    """Unpack the toolchain into ``goroot`` (replaced whole, never half) once its hash is the
    pinned one: its ``go`` binary."""
    with urllib.request.urlopen(toolchain_url(version), timeout=300) as response:
        archive = zipfile.ZipFile(io.BytesIO(response.read()))
    verify(archive, version)
    prefix = f"golang.org/toolchain@v0.0.1-go{version}.linux-amd64/"
    staging = Path(tempfile.mkdtemp(prefix="go-", dir=goroot.parent))
    try:
        for member in archive.infolist():
            if not member.filename.startswith(prefix) or member.is_dir():
                continue
            relative = member.filename[len(prefix) :]
            target = staging / relative
            if ".." in Path(relative).parts:
                raise ValueError(f"{member.filename}: a path outside the toolchain")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(member))
            # Module zips keep no file modes: the go command marks these executable itself.
            if relative.startswith(("bin/", "pkg/tool/")):
                target.chmod(0o755)
        shutil.rmtree(goroot, ignore_errors=True)
        staging.rename(goroot)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return goroot / "bin" / "go"


if __name__ == "__main__":
    go = install(sys.argv[1], Path(sys.argv[2] if len(sys.argv) > 2 else "/usr/local/go"))
    print(f"go {sys.argv[1]}: {go}")
