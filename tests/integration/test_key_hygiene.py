"""Key hygiene on the local backend, for real: a job run by the operator leaks no line of its
private keys (client or host keys) into the task log, the operator's log records, XCom, the
exception of a failed job or `airflow-mpi render`; inside every pod the key files are 0600 under
a 0700 directory; and the user's command, arguments and env reach every rank exactly, whatever
quotes, spaces, `$`, backticks or newlines they hold (no shell ever sees them)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.keyscan import exception_texts, execute, log_texts, recording_keys, render_outputs

pytestmark = pytest.mark.usefixtures("no_leaks")

PY = sys.executable
# Arguments a shell would mangle: each must arrive as exactly this one argv item.
TRICKY_ARGS = [
    "plain", "with space", "'single'", '"double"', "$HOME", "${PATH}", "`id`", "$(id)", "; rm -rf /",
    "line1\nline2", "", "tab\there", "*", "~", "\\back\\slash", "--", "-x", "ünïcødé", "&& false", "| cat", "> /tmp/x",
]  # fmt: skip
TRICKY_ENV = {
    "TRICKY": "$(id) `id` 'q' \"d\" ; rm -rf / \\ * ~",
    "MULTI_LINE": "first\nsecond\n",
    "SPACES": "  leading and trailing  ",
    "EMPTY": "",
}
SSH_DIRS = ("/run/airflow-mpi/ssh", "/etc/airflow-mpi/ssh")
RANK_CODE = """
import json, os, stat, sys
modes = {}
for directory in %r:
    modes[directory] = oct(stat.S_IMODE(os.stat(directory).st_mode))
    for name in sorted(os.listdir(directory)):
        info = os.stat(os.path.join(directory, name))
        modes[os.path.join(directory, name)] = oct(stat.S_IMODE(info.st_mode)) + " uid=" + str(info.st_uid)
report = {"rank": int(os.environ["RANK"]), "host": os.uname().nodename, "argv": sys.argv[1:],
          "env": {k: os.environ.get(k) for k in %r}, "modes": modes}
print("REPORT " + json.dumps(report), flush=True)
if report["rank"] == 0:
    print("AIRFLOW_MPI_RESULT " + json.dumps({"argv": report["argv"], "env": report["env"]}), flush=True)
""" % (SSH_DIRS, sorted(TRICKY_ENV))  # noqa: UP031


def job(name: str, command: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": "registry.example/train:1",  # for render; the local backend runs the host's files
        "command": command,
        "workers": {"replicas": 2},
        "env": TRICKY_ENV,
        "startup_timeout": 60,
    }


def test_a_job_leaks_no_key_has_private_key_files_and_gets_exact_argv(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    spec = job("hygiene", [PY, "-c", RANK_CODE, *TRICKY_ARGS])
    with recording_keys(monkeypatch) as keys:
        result = execute(spec)
        texts = log_texts(capfd, caplog)
        texts += render_outputs(spec, tmp_path, capfd)
    texts.append(("XCom", json.dumps(result)))
    assert len(keys.materials) == 3  # the job's, then render's two: each checked against everything
    assert keys.leaks(texts) == []

    decoder = json.JSONDecoder()  # a task log line may carry the logger's own fields after the JSON
    stdout = texts[0][1]
    reports = [decoder.raw_decode(line.split("REPORT ", 1)[1])[0] for line in stdout.splitlines() if "REPORT " in line]
    assert sorted(r["rank"] for r in reports) == [0, 1, 2] and len({r["host"] for r in reports}) == 3
    for report in reports:  # every rank, on every pod: exact argv and env
        assert report["argv"] == TRICKY_ARGS, report["rank"]
        assert report["env"] == TRICKY_ENV, report["rank"]
        for path, mode in report["modes"].items():
            expected = "0o700" if path in SSH_DIRS else "0o600 uid=0"
            assert mode == expected, (report["host"], path, mode)
        assert len(report["modes"]) == 2 + 2 * 7  # both directories: 6 shared files and the pod's own host key
    assert result["result"] == {"argv": TRICKY_ARGS, "env": TRICKY_ENV}


def test_a_failed_job_leaks_no_key_in_its_exception_or_log(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_mpi.exceptions import JobFailed

    caplog.set_level(logging.DEBUG)
    code = "import os, sys\nprint('rank', os.environ['RANK'], 'failing', flush=True)\nsys.exit(3)"
    with recording_keys(monkeypatch) as keys, pytest.raises(JobFailed) as caught:
        execute(job("hygiene-fail", [PY, "-c", code]))
    texts = log_texts(capfd, caplog) + exception_texts(caught.value)
    assert len(keys.materials) == 1
    assert keys.leaks(texts) == []
    assert caught.value.exit_code == 3 and "failing" in str(caught.value)
