# A stand-in for apache/airflow:3.3.2-python3.11 where no registry is reachable (the tests build
# it on the Debian 12 base of tests/cluster/image.py), with the layout docker/airflow/Dockerfile
# relies on: Airflow in a virtualenv at ~/.local of the user `airflow` (uid 50000, group 0, so an
# arbitrary uid of group 0 may run it too), on PATH with its pip; AIRFLOW_HOME=/opt/airflow;
# AIRFLOW_VERSION set; no entrypoint (the manifests' `command:` runs `airflow ...`).
ARG BASE_IMAGE=localhost/airflow-mpi-base:bookworm
FROM ${BASE_IMAGE}
ARG AIRFLOW_VERSION=3.3.2
# Airflow's constraint files pin every dependency as it stood when the release was cut; they are
# not reachable here, so uv resolves as of this day instead (the compatibility tier's date for
# this release, tests/cluster/test_airflow_releases.py).
ARG EXCLUDE_NEWER=2026-10-01
ENV AIRFLOW_VERSION=${AIRFLOW_VERSION} \
    AIRFLOW_HOME=/opt/airflow \
    AIRFLOW_USER_HOME_DIR=/home/airflow \
    PATH=/home/airflow/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# uv and its package cache are mounted at build time only (tests/cluster/image.py): the packages
# are copied from the cache the virtualenv filled, and uv is not in the image.
RUN test -x /usr/local/bin/uv || { echo "base.Dockerfile: needs uv mounted at /usr/local/bin/uv" >&2; exit 1; } \
 && useradd --uid 50000 --gid 0 --create-home --home-dir /home/airflow --shell /bin/bash airflow \
 && mkdir -p /opt/airflow \
 && python3 -m venv /home/airflow/.local \
 && SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt UV_NO_PROGRESS=1 \
    uv pip install -q --python /home/airflow/.local/bin/python --link-mode copy --exclude-newer "$EXCLUDE_NEWER" \
      "apache-airflow[cncf.kubernetes,postgres]==${AIRFLOW_VERSION}" \
 && chown -R 50000:0 /home/airflow /opt/airflow \
 && chmod -R g=u /home/airflow /opt/airflow \
 && chmod 0775 /home/airflow /opt/airflow
USER 50000
WORKDIR /opt/airflow
