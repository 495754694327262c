"""tests/airflow_rest.py against Airflow's real api-server (with its scheduler, dag-processor and
triggerer on a fresh home; the simple auth manager with a user who must log in): a token, unpause,
a run triggered with conf, the train task's log followed with continuation tokens while its MPI
job (the local backend: real sshd and Open MPI) prints, in the JSON and the NDJSON form, the XCom,
the "MPI job" link, and an import error. The in-cluster tests drive the deployment with it."""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.airflow_processes import Airflow, airflow_processes, wait_for
from tests.airflow_rest import FINISHED_TASK, JSON, NDJSON, AirflowREST, RESTError

pytestmark = pytest.mark.integration

DAG_ID = "rest_lines"
JOB_URL = "https://dash.example/{namespace}/{job}?dag={dag_id}&task={task_id}&try={try_number}"
EVERY = 0.25  # seconds between two lines of a rank

DAG_FILE = textwrap.dedent(
    f'''
    from datetime import datetime
    from airflow.sdk import DAG, Param
    from airflow_mpi.operators.mpi import MPIJobOperator

    RANK = (
        "import json, os, time\\n"
        "rank, n = os.environ['RANK'], int(os.environ['LINES'])\\n"
        "for i in range(n):\\n"
        "    print(f'rank {{rank}} line {{i:03d}}', flush=True)\\n"
        "    time.sleep({EVERY})\\n"
        "if rank == '0':\\n"
        "    print('AIRFLOW_MPI_RESULT ' + json.dumps({{'lines': n}}), flush=True)\\n"
    )

    with DAG("{DAG_ID}", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
             params={{"lines": Param(10, type="integer", minimum=1)}}):
        MPIJobOperator(
            task_id="train",
            job={{"name": "restlines", "command": ["{sys.executable}", "-c", RANK],
                 "workers": {{"replicas": 1}}, "env": {{"LINES": "{{{{ params.lines }}}}"}}}},
            retries=0,
        )
    '''
)
BROKEN_FILE = "from airflow.sdk import DAG\nraise RuntimeError('this DAG file is broken on purpose')\n"


@pytest.fixture(scope="module")
def airflow() -> Iterator[Airflow]:
    """Not under /tmp: a local pod gets a /tmp of its own."""
    home = Path(tempfile.mkdtemp(prefix="airflow-mpi-rest-", dir="/var/tmp")) / "home"
    home.mkdir(parents=True)
    link = {"conn_type": "mpi", "extra": {"backend": "local", "job_url_template": JOB_URL}}
    dags = {"rest_dag.py": DAG_FILE, "broken_dag.py": BROKEN_FILE}
    env = {"AIRFLOW_CONN_MPI_DEFAULT": json.dumps(link)}
    with airflow_processes(home, dags, env=env, users={"alice": "s3cret-pw"}) as processes:
        wait_for("the api-server up", lambda: AirflowREST(processes.api).get("/api/v2/monitor/health"), 120, processes)
        yield processes
    shutil.rmtree(home.parent, ignore_errors=True)


def test_a_token_only_for_the_right_password(airflow: Airflow) -> None:
    client = airflow.rest()
    assert client.login().count(".") == 2  # a JWT
    with pytest.raises(RESTError) as refused:
        AirflowREST(airflow.api, "alice", "wrong").login()
    assert refused.value.status == 401
    with pytest.raises(RESTError) as anonymous:
        AirflowREST(airflow.api).get("/api/v2/dags")
    assert anonymous.value.status == 401


def test_a_run_with_conf_its_live_log_xcom_and_link(airflow: Airflow) -> None:
    client = airflow.rest()
    wait_for("the DAG parsed", lambda: client.dag(DAG_ID), 120, airflow)
    assert client.unpause(DAG_ID)["is_paused"] is False
    lines = 40  # 10 s of output a rank
    run_id = client.trigger(DAG_ID, {"lines": lines})
    assert client.run(DAG_ID, run_id)["conf"] == {"lines": lines}
    client.wait_task(DAG_ID, run_id, "train", {"running", *FINISHED_TASK}, 120)

    # Both forms followed at once, each by its own reader.
    follows = {form: client.follow_log(DAG_ID, run_id, "train", 1, form=form) for form in (JSON, NDJSON)}
    with ThreadPoolExecutor(2) as pool:
        reads = {form: pool.submit(lambda f=f: list(f.lines(every=1.5, timeout=240))) for form, f in follows.items()}
        shown = {form: read.result() for form, read in reads.items()}
    assert client.wait_run(DAG_ID, run_id, 60) == "success", client.log_text(DAG_ID, run_id, "train", 1)[-3000:]
    for form, follow in follows.items():
        # The ranks' lines arrived over several polls while the job ran, not all at the end.
        live = [len(rank_lines(poll)) for poll in follow.polls[:-1]]
        assert len([n for n in live if n]) >= 2, (form, live, len(rank_lines(follow.polls[-1])))
        for rank in ("0", "1"):
            said = re.findall(rf"rank {rank} line (\d{{3}})", "\n".join(shown[form]))
            assert said == [f"{i:03d}" for i in range(lines)], (form, rank, said)  # each once, in order

    # After the end: the same lines through the NDJSON form, in one read that says it is complete.
    ndjson = client.follow_log(DAG_ID, run_id, "train", 1, form=NDJSON)
    text = "\n".join(ndjson.poll())
    assert ndjson.ended and len(re.findall(r"rank [01] line \d{3}", text)) == 2 * lines
    assert ndjson.poll() == []  # nothing given twice

    result = client.xcom(DAG_ID, run_id, "train")
    assert result["result"] == {"lines": lines} and result["exit_code"] == 0
    links = client.extra_links(DAG_ID, run_id, "train")
    job = result["job_name"]
    assert links["MPI job"] is not None and f"/{job}?dag={DAG_ID}&task=train&try=1" in links["MPI job"], links


def rank_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if re.search(r"rank [01] line \d{3}", line)]


def test_import_errors_name_the_broken_file(airflow: Airflow) -> None:
    client = airflow.rest()
    errors = wait_for("the import error", lambda: client.import_errors(), 120, airflow)
    (name,) = [name for name in errors if name.endswith("broken_dag.py")]
    assert "broken on purpose" in errors[name]
