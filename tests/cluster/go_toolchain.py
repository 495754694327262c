"""Go for `make cluster-build` on a machine without it: the official toolchain from the Go module
proxy (the zip the ``go`` command itself fetches when it switches toolchains), unpacked into
/usr/local/go. Debian 12's golang-go (1.19) is too old for the Kubernetes sources.

    python3 tests/cluster/go_toolchain.py 1.26.8 [/usr/local/go]
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
import urllib.request
import zipfile
from pathlib import Path

PROXY = os.environ.get("GOPROXY", "https://proxy.golang.org").split(",")[0]


def toolchain_url(version: str, proxy: str = PROXY) -> str:
    """The module zip of ``go<version>`` for linux-amd64 on the proxy."""
    return f"{proxy.rstrip('/')}/golang.org/toolchain/@v/v0.0.1-go{version}.linux-amd64.zip"


def install(version: str, goroot: Path) -> Path:
    """Unpack the toolchain into ``goroot`` (replaced whole, never half): its ``go`` binary."""
    with urllib.request.urlopen(toolchain_url(version), timeout=300) as response:
        archive = zipfile.ZipFile(io.BytesIO(response.read()))
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
