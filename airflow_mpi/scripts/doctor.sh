# shellcheck shell=bash
# airflow-mpi doctor: can this image (or this machine) run a job's pods? Not part of a job: it
# runs after launch.sh's functions (airflow_mpi.scripts.doctor_script_text() puts them first with
# AIRFLOW_MPI_LAUNCH_LIBRARY=1), so it starts sshd and probes it exactly as a job does.
#
# One line per check: "airflow-mpi doctor: <check>: ok|FAIL|skip: <detail>", in the order of
# airflow_mpi.doctor.checks.CHECKS (a test compares). airflow-mpi doctor runs this in a pod of the
# image (--image) or here (--local) with the job's sshd_config and ssh_config rendered for a
# scratch $RUNTIME_DIR, and explains every FAIL; each FAIL's detail carries the words a failing
# job would print, so the same diagnosis reads it.
doctor_line() { # check status detail
  printf 'airflow-mpi doctor: %s: %s: %s\n' "$1" "$2" "$3"
  [[ "$2" != FAIL ]] || DOCTOR_FAILED=1
}

# The job's MPI (AIRFLOW_MPI_DOCTOR_MPI: openmpi, mpich or intel; mpi.implementation) and its
# launcher (AIRFLOW_MPI_DOCTOR_MPIEXEC; mpi.mpiexec). DOCTOR_DAEMON: what the launcher starts on
# every host over ssh (Open MPI 4: orted, 5: prted, both found on the session's PATH; Hydra: the
# hydra_pmi_proxy beside the launcher, by that same absolute path on every host).
doctor_daemon() { # implementation major launcher-path -> prints the daemon's name or path
  case "$1" in
    openmpi) if [[ "$2" == 5 ]]; then echo prted; else echo orted; fi ;;
    *) echo "$(dirname "$3")/hydra_pmi_proxy" ;;
  esac
}

doctor_checks_tools() {
  local path version out found name major=4
  local mpi="${AIRFLOW_MPI_DOCTOR_MPI:-openmpi}" launcher="${AIRFLOW_MPI_DOCTOR_MPIEXEC:-mpiexec}"
  DOCTOR_DAEMON=orted
  if path=$(command -v "$launcher"); then
    doctor_line mpiexec ok "$path"
    found=$(launcher_implementation "$launcher")
    name="${found%% *}" version="${found#* }" major="${version%%.*}"
    if [[ "$name" != "$mpi" ]]; then
      doctor_line mpi FAIL "$path is ${found/#\?/not an MPI launcher airflow-mpi knows:} but the job's MPI is $mpi"
    elif [[ "$name" == openmpi && "$major" != 4 && "$major" != 5 ]]; then
      doctor_line mpi FAIL "$path is Open MPI $version: jobs speak Open MPI 4.x and 5.x"
    else
      doctor_line mpi ok "$name $version"
    fi
    DOCTOR_DAEMON=$(doctor_daemon "$mpi" "$major" "$path")
    if [[ "$name" != "$mpi" ]]; then
      doctor_line mpiexec-as-root skip "$launcher is not the job's MPI"
    elif ((EUID != 0)); then
      doctor_line mpiexec-as-root skip "not running as root"
    elif [[ "$mpi" == openmpi ]] && out=$(timeout 60 "$launcher" --allow-run-as-root --oversubscribe -np 1 true 2>&1); then
      doctor_line mpiexec-as-root ok "$launcher --allow-run-as-root -np 1 true"
    elif [[ "$mpi" != openmpi ]] && out=$(timeout 60 "$launcher" -n 1 true 2>&1 </dev/null); then
      doctor_line mpiexec-as-root ok "$launcher -n 1 true"
    else
      doctor_line mpiexec-as-root FAIL "$(printf '%s' "$out" | grep -v '^-*$' | head -n 3 | tr '\n' ' ')"
    fi
  else
    doctor_line mpiexec FAIL "$launcher: not found on PATH=$PATH"
    doctor_line mpi skip "no $launcher"
    doctor_line mpiexec-as-root skip "no $launcher"
    [[ "$mpi" == openmpi ]] || DOCTOR_DAEMON=hydra_pmi_proxy
  fi
  if [[ "$DOCTOR_DAEMON" == /* ]]; then # by its path (Hydra)
    if [[ -x "$DOCTOR_DAEMON" ]]; then
      doctor_line mpi-daemon ok "$DOCTOR_DAEMON"
    else
      doctor_line mpi-daemon FAIL "$DOCTOR_DAEMON: No such file or directory"
    fi
  elif path=$(command -v "$DOCTOR_DAEMON"); then # by name on the PATH (Open MPI)
    doctor_line mpi-daemon ok "$path"
  else
    doctor_line mpi-daemon FAIL "$DOCTOR_DAEMON: not found on PATH=$PATH"
  fi
  if path=$(command -v ssh); then
    doctor_line ssh ok "$path"
  else
    doctor_line ssh FAIL "ssh: not found on PATH=$PATH (the master needs the OpenSSH client)"
  fi
  if [[ -x "$SSHD" ]]; then
    doctor_line sshd ok "$SSHD"
  else
    doctor_line sshd FAIL "$SSHD: No such file or directory"
  fi
  if [[ -d /run/sshd ]]; then
    doctor_line run-sshd ok "/run/sshd exists"
  elif out=$(mkdir -p /run/sshd 2>&1 && chmod 0755 /run/sshd 2>&1); then
    doctor_line run-sshd ok "/run/sshd created (the launch script creates it too)"
  else
    doctor_line run-sshd FAIL "Missing privilege separation directory: /run/sshd cannot be created: $out"
  fi
}

doctor_checks_sshd() { # the job's sshd and ssh, on 127.0.0.1:$port in a scratch directory
  local port="$1" out sshd_pid i
  if ! command -v ssh-keygen >/dev/null || [[ ! -x "$SSHD" ]] || ! command -v ssh >/dev/null; then
    for i in sshd-config ssh-login mpi-daemon-over-ssh; do
      doctor_line "$i" skip "needs sshd, ssh and ssh-keygen"
    done
    return 0
  fi
  umask 077
  mkdir -p "$SSH_DIR"
  chmod 0755 "$RUNTIME_DIR"
  chmod 0700 "$SSH_DIR"
  ssh-keygen -q -t ed25519 -N '' -C airflow-mpi-doctor -f "$SSH_DIR/ssh_host_ed25519_key"
  ssh-keygen -q -t ed25519 -N '' -C airflow-mpi-doctor -f "$SSH_DIR/id_ed25519"
  printf 'restrict %s\n' "$(cat "$SSH_DIR/id_ed25519.pub")" >"$SSH_DIR/authorized_keys"
  printf '[127.0.0.1]:%s %s\n' "$port" "$(cut -d ' ' -f 1,2 "$SSH_DIR/ssh_host_ed25519_key.pub")" \
    >"$SSH_DIR/known_hosts"
  printf '%s\n' "$AIRFLOW_MPI_DOCTOR_SSHD_CONFIG" >"$SSH_DIR/sshd_config"
  printf '%s\n' "$AIRFLOW_MPI_DOCTOR_SSH_CONFIG" >"$SSH_DIR/ssh_config"
  chmod 0600 "$SSH_DIR"/*
  umask 022
  if out=$("$SSHD" -t -f "$SSH_DIR/sshd_config" 2>&1); then
    doctor_line sshd-config ok "sshd -t accepts the job's sshd_config"
  else
    doctor_line sshd-config FAIL "$(printf '%s' "$out" | tail -n 2 | tr '\n' ' ')"
  fi
  sshd_session_env
  "$SSHD" "${SSHD_ENV_ARGS[@]}" -D -e -f "$SSH_DIR/sshd_config" -o ListenAddress=127.0.0.1 \
    2>>"$RUNTIME_DIR/sshd.log" &
  sshd_pid=$!
  for ((i = 0; i < 50; i++)); do
    out=$(probe_host 127.0.0.1) && break
    kill -0 "$sshd_pid" 2>/dev/null || break
    sleep 0.1
  done
  if ((i < 50)) && [[ -z "$out" ]]; then
    doctor_line ssh-login ok "sshd accepts the job key on 127.0.0.1:$port"
    # As the launcher starts it: a non-interactive command, the daemon by name on the session's
    # PATH (Open MPI) or by its absolute path (Hydra).
    if out=$(ssh -F "$SSH_DIR/ssh_config" 127.0.0.1 "$(doctor_daemon_probe "$DOCTOR_DAEMON")" 2>&1 </dev/null) &&
      [[ "$out" == /* ]]; then
      doctor_line mpi-daemon-over-ssh ok "$out"
    else
      doctor_line mpi-daemon-over-ssh FAIL "$(printf '%s' "$out" | tail -n 1)"
    fi
  else
    doctor_line ssh-login FAIL "${out:-sshd ended}: $(tail -n 2 "$RUNTIME_DIR/sshd.log" 2>/dev/null | tr '\n' ' ')"
    doctor_line mpi-daemon-over-ssh skip "no ssh login"
  fi
  kill "$sshd_pid" 2>/dev/null || true
  wait "$sshd_pid" 2>/dev/null || true
}

doctor_daemon_probe() { # daemon -> the remote command that prints its path, or the shell's own words
  local quoted
  printf -v quoted '%q' "$1"
  if [[ "$1" == /* ]]; then
    printf 'if test -x %s; then echo %s; else echo "%s: No such file or directory"; fi' "$quoted" "$quoted" "$quoted"
  else
    # shellcheck disable=SC2016 # $PATH: the remote session's
    printf 'command -v %s || echo "%s: command not found (PATH=$PATH)"' "$quoted" "$quoted"
  fi
}

run_doctor() {
  DOCTOR_FAILED=0
  [[ "$RUNTIME_DIR" != /run/airflow-mpi ]] || die "doctor: set AIRFLOW_MPI_RUNTIME_DIR to a scratch directory"
  [[ -n "${AIRFLOW_MPI_DOCTOR_SSHD_CONFIG:-}" && -n "${AIRFLOW_MPI_DOCTOR_SSH_CONFIG:-}" ]] ||
    die "doctor: AIRFLOW_MPI_DOCTOR_SSHD_CONFIG and AIRFLOW_MPI_DOCTOR_SSH_CONFIG must hold the rendered configs"
  trap 'rm -rf "$SSH_DIR" "$RUNTIME_DIR/sshd.log" "$RUNTIME_DIR/sshd.pid"' EXIT # the directory: its owner's
  doctor_checks_tools
  doctor_checks_sshd "${AIRFLOW_MPI_DOCTOR_PORT:-2222}"
  return "$DOCTOR_FAILED"
}

run_doctor
