"""The Go toolchain `make cluster-build` downloads on a machine without Go is checked against a
pinned checksum before anything is unpacked."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import zipfile
from pathlib import Path

import pytest

from tests.cluster.go_toolchain import PINNED_H1, module_hash, verify

ROOT = Path(__file__).resolve().parents[2]


def _zip(files: dict[str, bytes]) -> zipfile.ZipFile:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("m@v1/dir/", b"")  # directories are not hashed
        for name, data in files.items():
            archive.writestr(name, data)
    return zipfile.ZipFile(io.BytesIO(buffer.getvalue()))


def test_the_hash_is_gos_h1_over_sorted_names_and_ignores_the_zips_order() -> None:
    files = {"m@v1/xyz": b"data for xyz", "m@v1/abc": b"data for abc"}
    summary = "".join(f"{hashlib.sha256(files[n]).hexdigest()}  {n}\n" for n in sorted(files))
    expected = "h1:" + base64.b64encode(hashlib.sha256(summary.encode()).digest()).decode()
    assert module_hash(_zip(files)) == expected
    assert module_hash(_zip(dict(reversed(files.items())))) == expected


def test_a_toolchain_with_other_bytes_or_no_pin_is_refused_naming_both_hashes() -> None:
    tampered = _zip({"golang.org/toolchain@v0.0.1-go1.26.8.linux-amd64/bin/go": b"not go"})
    with pytest.raises(ValueError, match=r"go 1\.26\.8: the downloaded toolchain's hash is h1:\S+, not the pinned h1:"):
        verify(tampered, "1.26.8")
    with pytest.raises(ValueError, match=r"go 9\.9\.9: no pinned checksum; add its h1: hash from https://sum"):
        verify(tampered, "9.9.9")


def test_the_go_version_the_makefile_installs_is_pinned() -> None:
    version = re.search(r"^GO_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert version is not None and version.group(1) in PINNED_H1
