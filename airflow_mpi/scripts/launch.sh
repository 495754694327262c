#!/usr/bin/env bash
# airflow-mpi launch script: the same file runs in every pod of an MPI job. What it reads, writes
# and runs is the pod contract, docs/contract.md (anchors below name its sections).
#
#   launch.sh               by GJ_TRAINING_ROLE:
#                             worker  prepare /run/sshd, exec sshd (nothing else)
#                             master  compute MPI_HOSTS and MPI_NP (the four host/NP cases, or
#                                     /etc/mpi/hostfile in hostfile mode), check the launcher is
#                                     the job's MPI, start sshd, wait until every host accepts the
#                                     job key, print hosts/NP, exec mpiexec
#   launch.sh rank CMD...   what mpiexec starts on every slot: sets RANK, WORLD_SIZE, LOCAL_RANK,
#                           LOCAL_WORLD_SIZE, NODE_RANK from OMPI_COMM_WORLD_* (Open MPI) or PMI_*
#                           (Hydra: MPICH, Intel MPI), then execs CMD
#   launch.sh check-hosts   one ssh login to every rank host, with a reason per failing host
#   launch.sh stacks [SEC]  every Python rank process of this pod dumps its threads' stacks; waits
#                           up to SEC seconds (default 5) and prints them, or why one did not answer
#   launch.sh notice        every rank process of this pod gets SIGTERM: the pod is about to go,
#                           and its ranks have the job's termination_grace to save
#
# With AIRFLOW_MPI_LAUNCH_LIBRARY=1 it only defines its functions: doctor.sh (airflow-mpi doctor,
# which is not part of a job) runs after it and checks an image with the same sshd and probe.
# AIRFLOW_MPI_DRY_RUN=1 prints what would be exec'd and exits 0 (no sshd, no waiting).
# The Python renderer (airflow_mpi.job.topology / mpirun) computes the same hosts and command line;
# tests run both and compare them.
set -euo pipefail

CONFIG_DIR="${AIRFLOW_MPI_CONFIG_DIR:-/etc/mpi}"
SECRET_DIR="${AIRFLOW_MPI_SSH_SECRET_DIR:-/etc/airflow-mpi/ssh}"
RUNTIME_DIR="${AIRFLOW_MPI_RUNTIME_DIR:-/run/airflow-mpi}"
SSH_DIR="${RUNTIME_DIR}/ssh"
SSHD="${AIRFLOW_MPI_SSHD:-/usr/sbin/sshd}"
# contract.SSH_SHARED_FILES plus this pod's own host key (docs/contract.md#pod-paths)
SSH_FILES=(id_ed25519 id_ed25519.pub authorized_keys known_hosts ssh_config sshd_config ssh_host_ed25519_key)
PROBE_CONCURRENCY=32

log() { printf '[airflow-mpi] %s\n' "$*"; }
die() {
  printf '[airflow-mpi] ERROR: %s\n' "$1" >&2
  exit "${2:-1}"
}

require_env() {
  local name missing=()
  for name in "$@"; do
    [[ -n "${!name+x}" ]] || missing+=("$name")
  done
  ((${#missing[@]} == 0)) || die "missing platform variable(s): ${missing[*]} (is this pod part of an airflow-mpi job?)"
}

require_count() { # name value: a whole number >= 0
  [[ "$2" =~ ^[0-9]+$ ]] || die "$1=$2 is not a whole number"
}

# --- worker ----------------------------------------------------------------------------------

run_worker() {
  sshd_session_env
  if [[ "${AIRFLOW_MPI_DRY_RUN:-0}" == 1 ]]; then
    printf 'exec'
    printf ' %q' "$SSHD" "${SSHD_ENV_ARGS[@]}" -D -e -f "$SSH_DIR/sshd_config"
    printf '\n'
    return 0
  fi
  local who=""
  ((EUID == 0)) || who=" as $(id -un 2>/dev/null || echo "uid $EUID") (uid $EUID)"
  log "Starting MPI worker ${GJ_TRAINING_POD_NAME}: sshd on port ${AIRFLOW_MPI_SSH_PORT:-22}${who}"
  install_ssh
  exec "$SSHD" "${SSHD_ENV_ARGS[@]}" -D -e -f "$SSH_DIR/sshd_config"
}

# sshd gives the sessions it starts a fixed PATH, not the pod's; mpiexec starts orted on every
# worker through such a session, so an image with Open MPI elsewhere on its PATH would fail with
# "orted: command not found" (docs/contract.md#orted-command-not-found). Sessions get the pod's
# PATH and LD_LIBRARY_PATH instead (when they are plain paths sshd_config can carry).
sshd_session_env() { # sets SSHD_ENV_ARGS
  local name value
  local -a pairs=()
  SSHD_ENV_ARGS=()
  for name in PATH LD_LIBRARY_PATH; do
    value="${!name:-}"
    if [[ -n "$value" && "$value" =~ ^[A-Za-z0-9_./:+@%,=-]+$ ]]; then
      pairs+=("$name=$value")
    fi
  done
  if ((${#pairs[@]})); then
    SSHD_ENV_ARGS=(-o "SetEnv ${pairs[*]}")
  fi
}

install_ssh() {
  # Copy the job's ssh material into a private directory: sshd refuses keys that others can
  # read, and Secret volumes hold symlinks whose modes follow the volume's defaultMode.
  local file
  umask 077
  if ((EUID == 0)); then
    mkdir -p "$RUNTIME_DIR"
    chmod 0755 "$RUNTIME_DIR"
  else
    require_non_root_setup
  fi
  mkdir -p "$SSH_DIR"
  chmod 0700 "$SSH_DIR"
  local -a sources=() copies=()
  for file in "${SSH_FILES[@]}"; do
    [[ -r "$SECRET_DIR/$file" ]] || die "missing $SECRET_DIR/$file: the job's ssh Secret is not mounted"
    sources+=("$SECRET_DIR/$file")
    copies+=("$SSH_DIR/$file")
  done
  # One cp and one chmod for all of them, not two processes a file: a pod starts faster.
  # cp follows the Secret's symlinks; the copies are regular files.
  cp -- "${sources[@]}" "$SSH_DIR/"
  chmod 0600 -- "${copies[@]}"
  if ((EUID == 0)); then
    # sshd exits with "Missing privilege separation directory: /run/sshd" without it
    # (docs/contract.md#sshd-missing-privilege-separation-directory). Only a root sshd needs it:
    # it chroots its pre-auth child there; a non-root sshd has no privileges to separate.
    mkdir -p /run/sshd
    chmod 0755 /run/sshd
  fi
  umask 022
}

require_non_root_setup() { # what sshd and ssh need from the image to run as this uid
  local uid="$EUID" shell fix
  fix="docs/contract.md#jobs-without-root; docker/Dockerfile builds such an image"
  id -un >/dev/null 2>&1 ||
    die "uid $uid has no entry in the image's /etc/passwd; ssh and sshd need a user name, home and shell for it: add the user to the image, e.g. 'useradd --uid $uid --create-home --shell /bin/bash mpiuser' ($fix)"
  shell=$(getent passwd "$uid" | cut -d: -f7)
  case "$shell" in
    */nologin | */false)
      die "the user of uid $uid has the shell $shell, so every command mpiexec starts over ssh would be refused: give it /bin/bash in the image ($fix)" ;;
  esac
  # sshd (StrictModes) takes authorized_keys only under directories that no one but the user (or
  # root) can write; a world-writable volume such as an emptyDir fails that.
  if [[ ! -d "$RUNTIME_DIR" ]] && ! mkdir -p "$RUNTIME_DIR" 2>/dev/null; then
    die "$RUNTIME_DIR is missing and uid $uid cannot create it: the image must provide it owned by that user, e.g. 'install -d -o $uid -g $(id -g) -m 0755 $RUNTIME_DIR' ($fix)"
  fi
  [[ -O "$RUNTIME_DIR" ]] ||
    die "$RUNTIME_DIR belongs to uid:gid $(stat -c '%u:%g' "$RUNTIME_DIR") (mode $(stat -c '%a' "$RUNTIME_DIR")), not to uid $uid, so sshd would refuse the job key (StrictModes): the image must provide it owned by that user, e.g. 'install -d -o $uid -g $(id -g) -m 0755 $RUNTIME_DIR' ($fix)"
  chmod 0755 "$RUNTIME_DIR"
}

# --- master: hosts and NP (docs/contract.md#host-and-np) -------------------------------------

build_worker_hosts() { # slots -> "host:slots,..." from MPI_HOST, empty items dropped
  local slots="$1" item sep="" out=""
  local -a items
  [[ -n "${MPI_HOST:-}" ]] || return 0
  IFS=',' read -r -a items <<<"${MPI_HOST}"
  for item in "${items[@]}"; do
    if [[ -n "$item" ]]; then
      out+="${sep}${item}:${slots}"
      sep=","
    fi
  done
  printf '%s' "$out"
}

compute_hosts() { # sets MPI_HOSTS, MPI_NP, HOST_ARGS, RANK_HOSTS, SELF_HOSTS
  local master_host="${GJ_TRAINING_POD_NAME}.${GJ_TRAINING_VC_JOB_NAME}"
  local worker_hosts=""
  local master_cpu="${GJ_TRAINING_MASTER_CPU_LIMIT}" master_gpu="${GJ_TRAINING_MASTER_GPU_LIMIT}"
  local master_replicas="${GJ_TRAINING_MASTER_REPLICAS}"
  local worker_cpu="${GJ_TRAINING_WORKER_CPU_LIMIT}" worker_gpu="${GJ_TRAINING_WORKER_GPU_LIMIT}"
  local worker_replicas="${GJ_TRAINING_WORKER_REPLICAS}"
  require_count GJ_TRAINING_MASTER_GPU_LIMIT "$master_gpu"
  require_count GJ_TRAINING_WORKER_GPU_LIMIT "$worker_gpu"
  require_count GJ_TRAINING_MASTER_REPLICAS "$master_replicas"
  require_count GJ_TRAINING_WORKER_REPLICAS "$worker_replicas"

  if [[ "${AIRFLOW_MPI_HOSTS_MODE:-host}" == hostfile ]]; then
    # A controller's own hostfile when it writes one (mpi-operator), else ours. Lines are
    # "host slots=N" (Open MPI's) or "host:N" (Hydra's, as mpi-operator writes for MPICH and Intel).
    local hostfile="${AIRFLOW_MPI_HOSTFILE:-$CONFIG_DIR/hostfile}"
    # shellcheck disable=SC2016 # awk program text: its $1 and $i are awk's
    local read_line='h = $1; n = 1
        if (h ~ /:[0-9]+$/) { n = substr(h, index(h, ":") + 1); h = substr(h, 1, index(h, ":") - 1) }
        for (i = 2; i <= NF; i++) if ($i ~ /^slots=/) { n = substr($i, 7) }'
    [[ -r "$hostfile" ]] || die "hostfile mode but $hostfile is missing"
    MPI_HOSTS=$(awk "!/^[[:space:]]*(#|\$)/ { $read_line; printf \"%s%s:%s\", sep, h, n; sep = \",\" }" "$hostfile")
    MPI_NP=$(awk "!/^[[:space:]]*(#|\$)/ { $read_line; s += n } END { print s + 0 }" "$hostfile")
    HOST_ARGS=(--hostfile "$hostfile")
  else
    if [[ "$master_gpu" -eq 0 && "$worker_gpu" -eq 0 ]]; then
      require_count GJ_TRAINING_MASTER_CPU_LIMIT "$master_cpu"
      require_count GJ_TRAINING_WORKER_CPU_LIMIT "$worker_cpu"
      worker_hosts=$(build_worker_hosts "$worker_cpu")
      MPI_HOSTS="${master_host}:${master_cpu}"
      if [[ -n "$worker_hosts" ]]; then
        MPI_HOSTS="${MPI_HOSTS},${worker_hosts}"
      fi
      MPI_NP=$((master_replicas * master_cpu + worker_replicas * worker_cpu))
    elif [[ "$master_gpu" -gt 0 && "$worker_gpu" -gt 0 ]]; then
      worker_hosts=$(build_worker_hosts "$worker_gpu")
      MPI_HOSTS="${master_host}:${master_gpu}"
      if [[ -n "$worker_hosts" ]]; then
        MPI_HOSTS="${MPI_HOSTS},${worker_hosts}"
      fi
      MPI_NP=$((master_replicas * master_gpu + worker_replicas * worker_gpu))
    elif [[ "$master_gpu" -eq 0 && "$worker_gpu" -gt 0 ]]; then
      MPI_HOSTS=$(build_worker_hosts "$worker_gpu")
      MPI_NP=$((worker_replicas * worker_gpu))
    else
      MPI_HOSTS="${master_host}:${master_gpu}"
      MPI_NP=$((master_replicas * master_gpu))
    fi
    HOST_ARGS=(--host "$MPI_HOSTS")
    # An injected default hostfile (mpi-operator sets one on its launcher) must not add hosts.
    unset OMPI_MCA_orte_default_hostfile
  fi

  if [[ "${MPI_NP}" -le 0 ]]; then
    echo "ERROR: invalid MPI_NP=${MPI_NP}"
    exit 1
  fi
  if [[ -n "${AIRFLOW_MPI_NP:-}" ]]; then
    require_count AIRFLOW_MPI_NP "$AIRFLOW_MPI_NP"
    ((AIRFLOW_MPI_NP > 0)) || die "invalid AIRFLOW_MPI_NP=${AIRFLOW_MPI_NP}"
    MPI_NP="$AIRFLOW_MPI_NP"
  fi

  # Hosts mpiexec will reach over ssh: every rank host but this pod. This pod's own names are
  # kept apart: mpiexec must resolve them to know the host is itself.
  local item
  local -a items
  RANK_HOSTS=()
  SELF_HOSTS=()
  IFS=',' read -r -a items <<<"$MPI_HOSTS"
  for item in "${items[@]}"; do
    item="${item%:*}"
    [[ -n "$item" ]] || continue
    # This pod, also under a longer name (a controller's hostfile: <pod>.<job>.<ns>.svc).
    if [[ "$item" == "$master_host" || "$item" == "$master_host".* ]]; then
      SELF_HOSTS+=("$item")
    else
      RANK_HOSTS+=("$item")
    fi
  done
}

read_args_file() { # sets MPI_IMPLEMENTATION, MPI_LAUNCHER, MPI_LAUNCH_ENV and the rendered tails
  local args_file="$CONFIG_DIR/mpiexec.args"
  [[ -r "$args_file" ]] || die "missing $args_file: the job's ConfigMap is not mounted"
  MPI_IMPLEMENTATION=openmpi MPI_LAUNCHER=mpiexec MPI_LAUNCH_ENV=() MPI_ARGS_RENDERED_OPEN_MPI_5=()
  # The renderer writes MPI_ARGS_RENDERED=( 'arg' ... ) and the launcher's lines, every value single-quoted.
  # shellcheck source=/dev/null
  source "$args_file"
}

load_mpiexec_args() { # sets MPI_ARGS from the tail for this launcher (Open MPI 5 has its own),
  # dropping the exports of unset variables (-x NAME, names of -genvlist)
  local i name kept
  local -a raw names
  raw=("${MPI_ARGS_RENDERED[@]}")
  if [[ "${LAUNCHER_MAJOR:-}" == 5 && ${#MPI_ARGS_RENDERED_OPEN_MPI_5[@]} -gt 0 ]]; then
    raw=("${MPI_ARGS_RENDERED_OPEN_MPI_5[@]}")
  fi
  MPI_ARGS=()
  for ((i = 0; i < ${#raw[@]}; i++)); do
    # mpiexec's options end where the rank wrapper starts: the user's command after it is passed
    # on untouched, whatever it holds (its own "-x NAME" is not an export).
    if [[ "${raw[i]}" == bash && "${raw[i + 1]:-}" == */launch.sh && "${raw[i + 2]:-}" == rank ]]; then
      MPI_ARGS+=("${raw[@]:i}")
      break
    fi
    if [[ "${raw[i]}" == "-x" && $((i + 1)) -lt ${#raw[@]} && "${raw[i + 1]}" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
      name="${raw[i + 1]}"
      if [[ -z "${!name+x}" ]]; then
        i=$((i + 1)) # unset here: mpiexec would only warn "could not find environment variable"
        continue
      fi
    fi
    if [[ "${raw[i]}" == -genvlist && $((i + 1)) -lt ${#raw[@]} ]]; then
      IFS=',' read -r -a names <<<"${raw[i + 1]}"
      kept=""
      for name in "${names[@]}"; do
        [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ && -z "${!name+x}" ]] || kept+="${kept:+,}$name"
      done
      i=$((i + 1))
      if [[ -n "$kept" ]]; then
        MPI_ARGS+=(-genvlist "$kept")
      else # without a list Hydra passes the master's whole environment
        MPI_ARGS+=(-genvnone)
      fi
      continue
    fi
    MPI_ARGS+=("${raw[i]}")
  done
}

# The launcher must be the MPI the job names: another one's options fail obscurely, or worse,
# run every rank as a world of its own (docs/guides/mpi-implementations.md).
launcher_implementation() { # launcher -> prints "openmpi 4.1.4", "mpich 4.0.2", "intel 2021.17", or "? <its first line>"
  local out version
  out=$("$1" --version 2>&1 </dev/null) || true
  case "$out" in
    *"Intel(R) MPI Library"*)
      version=$(printf '%s\n' "$out" | sed -n 's/.*Version \([0-9][0-9.]*\).*/\1/p' | head -n 1)
      echo "intel ${version:-unknown}" ;;
    *"HYDRA build details"*)
      version=$(printf '%s\n' "$out" | sed -n 's/^ *Version: *\([0-9][0-9.a-z]*\).*/\1/p' | head -n 1)
      echo "mpich ${version:-unknown}" ;;
    *"(OpenRTE)"* | *"(Open MPI)"* | *"(PRRTE)"*)
      version=$(printf '%s\n' "$out" | sed -n 's/^[^ ]* (\(OpenRTE\|Open MPI\|PRRTE\)) \([0-9][0-9.a-z]*\).*/\2/p' | head -n 1)
      echo "openmpi ${version:-unknown}" ;;
    *) echo "? $(printf '%s\n' "$out" | head -n 1)" ;;
  esac
}

check_launcher() { # the launcher exists and is the job's MPI; sets LAUNCHER_MAJOR (Open MPI: 4 or 5)
  local found name version
  command -v "$MPI_LAUNCHER" >/dev/null ||
    die "$MPI_LAUNCHER: not found on the master's PATH ($PATH): install the job's MPI ($MPI_IMPLEMENTATION) in the image, or name its launcher by its path in mpi.mpiexec"
  found=$(launcher_implementation "$MPI_LAUNCHER")
  name="${found%% *}" version="${found#* }"
  if [[ "$name" != "$MPI_IMPLEMENTATION" ]]; then
    if [[ "$name" == "?" ]]; then
      die "mpi.mpiexec: $MPI_LAUNCHER is not an MPI launcher airflow-mpi knows ('$MPI_LAUNCHER --version' said: $version); mpi.implementation is $MPI_IMPLEMENTATION: name its launcher in mpi.mpiexec"
    fi
    die "mpi.implementation is $MPI_IMPLEMENTATION but $(command -v "$MPI_LAUNCHER") is $name $version: set mpi.implementation: $name, or mpi.mpiexec to the launcher of $MPI_IMPLEMENTATION"
  fi
  LAUNCHER_MAJOR="${version%%.*}"
  if [[ "$name" == openmpi && "$LAUNCHER_MAJOR" != 4 && "$LAUNCHER_MAJOR" != 5 ]]; then
    die "$(command -v "$MPI_LAUNCHER") is Open MPI $version; jobs speak Open MPI 4.x and 5.x: use an image with one of them"
  fi
  log "launcher: $(command -v "$MPI_LAUNCHER") ($name $version)"
}

# --- master: ssh checks ----------------------------------------------------------------------

# The markers and hints are airflow_mpi.observe.readiness's SSH_FAILURE_MARKERS and PROBLEM_HINTS, word
# for word (tests/unit/test_launch_script_contract.py compares them).
probe_host() { # host -> exit 0, or print the reason it is not usable and exit 1
  local host="$1" port="${AIRFLOW_MPI_SSH_PORT:-22}" out
  # An authenticated session on the in-process sftp subsystem: no remote shell is started.
  if out=$(ssh -F "$SSH_DIR/ssh_config" -o ConnectTimeout=3 -s "$host" sftp 2>&1 </dev/null); then
    return 0
  fi
  case "$out" in
    *"Could not resolve hostname"* | *"Name or service not known"* | *"Temporary failure in name resolution"*)
      echo "not resolving: $host has no address (pod not running yet, or the headless Service is missing)" ;;
    *"Connection refused"*)
      echo "port closed: nothing listens on port $port: sshd is not running in the pod, so mpirun prints nothing or hangs; check 'ps aux | grep sshd' and 'ss -lntp | grep :$port' in the pod" ;;
    *"Permission denied"*)
      echo "key refused: sshd rejected the job key (Permission denied (publickey)): the job's public key must be in authorized_keys, and sshd refuses key files others can read (files 0600 under a 0700 directory)" ;;
    *"Host key verification failed"* | *"REMOTE HOST IDENTIFICATION HAS CHANGED"*)
      echo "host key mismatch: the host answering as $host is not this job's pod (its host key is not the pinned one)" ;;
    *"timed out"* | *"No route to host"* | *"Network is unreachable"*)
      echo "no answer: packets to $host port $port are dropped (network policy or routing): allow TCP to port $port between the job's pods" ;;
    *)
      echo "ssh failed: $(printf '%s' "$out" | tail -n 1)" ;;
  esac
  return 1
}

probe_hosts() { # host... -> sets FAILED_HOSTS and FAILED_REASONS (parallel, in batches)
  local tmp host i=0 pid
  local -a batch=()
  tmp=$(mktemp -d)
  for host in "$@"; do
    (probe_host "$host" >"$tmp/$i" || echo fail >"$tmp/$i.fail") &
    batch+=("$!")
    i=$((i + 1))
    if ((${#batch[@]} >= PROBE_CONCURRENCY || i == $#)); then
      for pid in "${batch[@]}"; do # only our probes: sshd runs in the background too
        wait "$pid" || true
      done
      batch=()
    fi
  done
  FAILED_HOSTS=()
  FAILED_REASONS=()
  i=0
  for host in "$@"; do
    if [[ -e "$tmp/$i.fail" ]]; then
      FAILED_HOSTS+=("$host")
      FAILED_REASONS+=("$(cat "$tmp/$i")")
    fi
    i=$((i + 1))
  done
  rm -rf "$tmp"
}

wait_for_hosts() { # host...: every host accepts an ssh login, or exit 1 with a line per host
  local timeout="${AIRFLOW_MPI_STARTUP_TIMEOUT:-300}" i round=0
  local -a pending=("$@")
  # A master started with its workers runs mpiexec this soon after the last sshd answers: sshd
  # starts within a second of its container, an image pull takes far longer, so back off to 0.5 s.
  local -a pauses=(0.1 0.1 0.2 0.2 0.3)
  local deadline=$((SECONDS + timeout))
  ((${#pending[@]})) || return 0
  while :; do
    probe_hosts "${pending[@]}"
    ((${#FAILED_HOSTS[@]})) || return 0
    pending=("${FAILED_HOSTS[@]}")
    if ((SECONDS >= deadline)); then
      echo "[airflow-mpi] ERROR: ${#pending[@]} host(s) did not accept ssh within ${timeout}s:" >&2
      for i in "${!FAILED_HOSTS[@]}"; do
        echo "[airflow-mpi]   ${FAILED_HOSTS[i]}: ${FAILED_REASONS[i]}" >&2
      done
      exit 1
    fi
    sleep "${pauses[round]:-0.5}"
    round=$((round + 1))
  done
}

# The sshd this script has just started takes connections once it listens: a TCP connect says
# so in a millisecond, where an ssh login takes a key exchange (~0.1 s). The workers' logins have
# checked the job's key already, against the same authorized_keys.
wait_for_own_sshd() { # host
  local port="${AIRFLOW_MPI_SSH_PORT:-22}" deadline=$((SECONDS + 30))
  until (exec 3<>"/dev/tcp/$1/$port") 2>/dev/null; do
    ((SECONDS < deadline)) || die "this pod's own sshd did not listen on $1:$port within 30s (see $RUNTIME_DIR/sshd.log)"
    sleep 0.02
  done
}

wait_for_own_names() { # name...: each resolves, or exit 1 naming it
  # mpiexec tells its own host from a remote one by the name's address. A name the cluster DNS
  # does not serve yet (a headless Service's record comes a moment after the pod is Ready) makes
  # it ssh to itself and fail "Temporary failure in name resolution".
  local timeout="${AIRFLOW_MPI_STARTUP_TIMEOUT:-300}" name
  local deadline=$((SECONDS + timeout))
  for name in "$@"; do
    until getent hosts "$name" >/dev/null; do
      if ((SECONDS >= deadline)); then
        echo "[airflow-mpi] ERROR: this pod's own host name $name did not resolve within ${timeout}s;" \
          "the job's headless Service or the cluster DNS is missing" >&2
        exit 1
      fi
      sleep 0.2
    done
  done
}

# --- master ----------------------------------------------------------------------------------

run_master() {
  local -a cmd
  compute_hosts
  read_args_file
  [[ "${AIRFLOW_MPI_DRY_RUN:-0}" == 1 ]] || check_launcher # a dry run prints Open MPI 4's line
  load_mpiexec_args
  if [[ "$MPI_IMPLEMENTATION" == openmpi ]]; then
    cmd=("$MPI_LAUNCHER" --allow-run-as-root "${HOST_ARGS[@]}" -np "$MPI_NP" "${MPI_ARGS[@]}")
  else # Hydra reads no slots= hostfile: the same hosts as a machine file, in both modes
    cmd=("$MPI_LAUNCHER" -machinefile "$RUNTIME_DIR/hosts")
    # Hydra starts the ranks of the host it calls local without ssh; it knows this pod's own name
    # only when told (else it ssh'd to itself, racing this pod's own sshd).
    ((${#SELF_HOSTS[@]} == 0)) || cmd+=(-localhost "${SELF_HOSTS[0]}")
    cmd+=(-np "$MPI_NP" "${MPI_ARGS[@]}")
  fi
  if ((${#MPI_LAUNCH_ENV[@]})); then
    cmd=(env "${MPI_LAUNCH_ENV[@]}" "${cmd[@]}")
  fi

  echo "MPI_HOST=${MPI_HOST:-}"
  echo "MPI_HOSTS=${MPI_HOSTS}"
  echo "MPI_NP=${MPI_NP}"
  if [[ "${AIRFLOW_MPI_DRY_RUN:-0}" == 1 ]]; then
    printf 'exec'
    printf ' %q' "${cmd[@]}"
    printf '\n'
    return 0
  fi

  install_ssh
  if [[ "$MPI_IMPLEMENTATION" != openmpi ]]; then # Hydra's machine file: host:n lines
    tr ',' '\n' <<<"$MPI_HOSTS" >"$RUNTIME_DIR/hosts"
  fi
  sshd_session_env
  "$SSHD" "${SSHD_ENV_ARGS[@]}" -D -e -f "$SSH_DIR/sshd_config" 2>>"$RUNTIME_DIR/sshd.log" &
  wait_for_own_names "${SELF_HOSTS[@]}"
  # Hydra may still ssh to this very pod (Debian's MPICH 4.0 did, -localhost or not, when its
  # name's address did not look local to it): this pod's own sshd must listen first too.
  if [[ "$MPI_IMPLEMENTATION" != openmpi ]] && ((${#SELF_HOSTS[@]})); then
    wait_for_own_sshd "${SELF_HOSTS[0]}"
  fi
  local verdict=check-hosts
  if [[ "${AIRFLOW_MPI_START_GATE:-}" == stdin ]]; then # started with the workers: wait for the word
    IFS= read -r verdict || die "the backend closed the start gate without a word: the job is being torn down"
    exec </dev/null # rank 0's standard input, as without the gate
  fi
  if ((${#RANK_HOSTS[@]})) && [[ "$verdict" == hosts-verified ]]; then
    log "sshd on ${#RANK_HOSTS[@]} host(s): checked by the launcher from this pod with its key"
  elif ((${#RANK_HOSTS[@]})); then
    log "waiting for sshd on ${#RANK_HOSTS[@]} host(s)"
    wait_for_hosts "${RANK_HOSTS[@]}"
  fi
  if [[ "$MPI_IMPLEMENTATION" == intel && -z "${I_MPI_HYDRA_IFACE:-}" ]] && ((${#RANK_HOSTS[@]})); then
    intel_upstream_interface "${RANK_HOSTS[0]}"
  fi
  log "starting mpiexec: ${MPI_NP} rank(s)" # every rank must report within a bounded time of this
  exec "${cmd[@]}"
}

intel_upstream_interface() { # remote host -> exports I_MPI_HYDRA_IFACE, the interface toward it
  # Intel MPI's proxies connect back to the launcher by its bare host name (gethostname():
  # -localhost leaves it alone), which no other pod resolves: only <pod>.<subdomain> is in the
  # cluster's DNS. Given an interface, it sends them that interface's address instead: the one
  # the route to the first remote host leaves by. A job's own I_MPI_HYDRA_IFACE is kept.
  local address dev
  address=$(getent ahostsv4 "$1" | awk 'NR == 1 { print $1 }') || true
  [[ -n "$address" ]] || return 0
  dev=$(ip -o route get "$address" 2>/dev/null | sed -n 's/.* dev \([^ ]*\).*/\1/p') || true
  if [[ -n "$dev" ]]; then
    export I_MPI_HYDRA_IFACE="$dev"
  fi
}

check_hosts() {
  local i
  compute_hosts
  probe_hosts "${RANK_HOSTS[@]}"
  for i in "${!FAILED_HOSTS[@]}"; do
    echo "${FAILED_HOSTS[i]}: ${FAILED_REASONS[i]}"
  done
  ((${#FAILED_HOSTS[@]} == 0)) && echo "all ${#RANK_HOSTS[@]} host(s) accept ssh"
  ((${#FAILED_HOSTS[@]} == 0))
}

# --- rank wrapper ----------------------------------------------------------------------------

run_rank() {
  local me="${HOSTNAME%%.*}" pod index=0 line
  local -a pods pre
  (($#)) || die "rank: no command given"
  # Open MPI names the rank OMPI_COMM_WORLD_*; Hydra (MPICH, Intel MPI) PMI_* and MPI_LOCAL*.
  # Under Hydra only its own are read: it never sets Open MPI's, so a job's env could.
  local rank size local_rank local_size
  if [[ "${AIRFLOW_MPI_ABORT_ON_EXIT:-0}" == 1 ]]; then # set for Hydra jobs only
    rank="${PMI_RANK:-}" size="${PMI_SIZE:-}" local_rank="${MPI_LOCALRANKID:-}" local_size="${MPI_LOCALNRANKS:-}"
  else
    rank="${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-}}" size="${OMPI_COMM_WORLD_SIZE:-${PMI_SIZE:-}}"
    local_rank="${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-}}"
    local_size="${OMPI_COMM_WORLD_LOCAL_SIZE:-${MPI_LOCALNRANKS:-}}"
  fi
  [[ -n "$rank" ]] || die "rank: not started by mpiexec (neither OMPI_COMM_WORLD_RANK nor PMI_RANK is set)"
  # Numbers only: the rank goes into every output line's tag (and the tagger's program text).
  [[ "$rank" =~ ^[0-9]+$ && "$size" =~ ^[0-9]+$ ]] ||
    die "rank: mpiexec's rank and world size are not numbers (rank '${rank:0:40}', size '${size:0:40}')"
  # Ranks start through ssh, without the pod's env: unless told, the config directory is the
  # one this script was run from (mpiexec runs <config dir>/launch.sh rank on every backend).
  if [[ -z "${AIRFLOW_MPI_CONFIG_DIR:-}" && -f "${BASH_SOURCE[0]}" ]]; then
    CONFIG_DIR="$(dirname -- "${BASH_SOURCE[0]}")"
  fi
  export AIRFLOW_MPI_CONFIG_DIR="$CONFIG_DIR" # the job's files (the spec's `files`), for the rank
  # Where sitecustomize.py registers each Python rank process for stack dumps (`launch.sh stacks`).
  export AIRFLOW_MPI_STACKS_DIR="$RUNTIME_DIR/stacks"
  # First thing, one line: the runner checks that every rank starts, on the pod the plan says
  # (docs/contract.md#rank-start), and folds these lines into one.
  if [[ "${AIRFLOW_MPI_TAG_OUTPUT:-0}" == 1 ]]; then # Hydra: each line tagged here, as --tag-output does
    tag_rank_output "$rank"
  fi
  printf 'AIRFLOW_MPI_RANK_START rank=%s size=%s host=%s\n' "$rank" "$size" "$me"
  export RANK="$rank" WORLD_SIZE="$size" LOCAL_RANK="$local_rank" LOCAL_WORLD_SIZE="$local_size"
  NODE_RANK=0
  IFS=',' read -r -a pods <<<"${AIRFLOW_MPI_RANK_PODS:-}"
  for pod in "${pods[@]}"; do
    if [[ "$pod" == "$me" ]]; then
      NODE_RANK=$index
      break
    fi
    index=$((index + 1))
  done
  export NODE_RANK
  # Python ranks load $CONFIG_DIR/sitecustomize.py: line-buffered output, so every line reaches
  # the task log at once and whole (unbuffered output gets tagged mid-line by --tag-output).
  export PYTHONPATH="$CONFIG_DIR${PYTHONPATH:+:$PYTHONPATH}"

  if [[ -n "${AIRFLOW_MPI_ENV_FILE:-}" ]]; then # VAR=VALUE per line, taken literally
    [[ -r "$AIRFLOW_MPI_ENV_FILE" ]] || die "rank: env file $AIRFLOW_MPI_ENV_FILE is not readable on $me"
    while IFS= read -r line || [[ -n "$line" ]]; do
      if [[ "$line" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]]; then
        # shellcheck disable=SC2163 # exports NAME=VALUE from the line, no shell expansion
        export "$line"
      fi
    done <"$AIRFLOW_MPI_ENV_FILE"
  fi

  # A Python rank that has imported mpi4py hangs in MPI_Finalize when it exits non-zero or
  # raises; under "python -m mpi4py" it calls MPI_Abort and the whole job ends within seconds.
  # Under Hydra, python_rank.py runs it the same way but exits with the code instead: Hydra's
  # answer to MPI_Abort kills this wrapper before it can name the rank (run_rank_command).
  if [[ "${1##*/}" =~ ^python[0-9.]*$ ]]; then
    local python="$1"
    shift
    pre=()
    while (($#)); do
      case "$1" in
        -m | -c | -) break ;;
        -W | -X) pre+=("$1" "${2:-}"); shift 2 ;;
        -*) pre+=("$1"); shift ;;
        *) break ;;
      esac
    done
    if [[ "${1:-}" == -m && "${2:-}" == mpi4py ]] || ! "$python" -c 'import mpi4py' 2>/dev/null; then
      run_rank_command "$rank" "$python" "${pre[@]}" "$@"
    fi
    if [[ "${AIRFLOW_MPI_ABORT_ON_EXIT:-0}" == 1 && -f "$CONFIG_DIR/python_rank.py" ]]; then
      run_rank_command "$rank" "$python" "${pre[@]}" "$CONFIG_DIR/python_rank.py" "$@"
    fi
    run_rank_command "$rank" "$python" "${pre[@]}" -m mpi4py "$@"
  fi
  run_rank_command "$rank" "$@"
}

# Open MPI ends the whole job when a rank exits non-zero (orte_abort_on_non_zero_status); Hydra
# waits for every other rank instead, unless the rank was an MPI process. Under Hydra the wrapper
# stays the rank's parent: on a non-zero exit it prints the rank and code, lets its line reach
# the launcher, and ends its Hydra proxy, which ends the job within a second.
run_rank_command() { # rank CMD...: exec CMD, or under Hydra run it and end the job if it fails
  local rank="$1" code=0
  shift
  if [[ "${AIRFLOW_MPI_ABORT_ON_EXIT:-0}" != 1 ]]; then
    register_rank "$rank"
    exec "$@"
  fi
  (
    register_rank "$rank"
    exec "$@"
  ) || code=$?
  if ((code)) && [[ ! -e "$RUNTIME_DIR/notice" ]]; then # (after a notice the others are saving)
    printf 'AIRFLOW_MPI_RANK_EXIT rank=%s code=%s host=%s\n' "$rank" "$code" "${HOSTNAME%%.*}" >&2
    exec >&- 2>&- # the taggers see the end, print what is left and exit
    wait || true
    sleep 0.3 # the proxy forwards the last lines before it goes
    kill -KILL "$PPID" 2>/dev/null || true
  fi
  exit "$code"
}

# Every rank process registers in $RUNTIME_DIR/ranks/<pid> (this pod's PID namespace's number),
# with its rank and start time, just before the shell becomes the rank's command (exec keeps
# both): `launch.sh notice` finds it there, and a reused pid does not match the start time.
register_rank() { # rank: for this shell ($BASHPID), about to exec the rank's command
  local pid="$BASHPID" start # (not inside $(...), whose own pid $BASHPID would be)
  start="$(process_start "$pid")"
  [[ -n "$start" ]] || return 0
  { mkdir -p "$RUNTIME_DIR/ranks" && printf '%s %s\n' "$1" "$start" >"$RUNTIME_DIR/ranks/$pid"; } 2>/dev/null || true
}

# The rank's stdout and stderr each through a tagger: "[1,RANK]<stdout>:" or "<stderr>:" before
# every line, as Open MPI's --tag-output writes it, so the task log reads every implementation
# alike. Both taggers write to the rank's stdout: the launcher forwards each of its streams in
# pieces that need not end at a line, and two streams meeting in one log would cut lines apart
# (stderr is redirected first, so both get the original stdout).
tag_rank_output() { # rank
  exec 2> >(tag_lines "[1,$1]<stderr>:") > >(tag_lines "[1,$1]<stdout>:")
}

# Each line of stdin, with the tag before it, in one write, as soon as it is read: perl (in every
# Debian-based image); else GNU sed -u (a read a byte: ~40 times slower on a flood); else awk.
# Not mawk -W interactive: it writes the tag, the text and the newline apart, and the other
# tagger's lines land between them. Plain mawk waits for a full buffer before it reads a line.
tag_lines() { # tag (digits and [,]<>: only)
  if command -v perl >/dev/null; then
    exec perl -e '$| = 1; my $tag = shift; print $tag, $_ while <STDIN>;' "$1"
  elif sed --version >/dev/null 2>&1; then
    exec sed -u "s/^/$1/"
  fi
  # shellcheck disable=SC2016 # the awk program's $0 is awk's
  exec awk -v tag="$1" '{ print tag $0; fflush() }'
}

# --- stacks ----------------------------------------------------------------------------------

# Every process sitecustomize.py registered in this pod ($RUNTIME_DIR/stacks/rank-R.PID, the file
# faulthandler writes to) gets SIGUSR2 and dumps every thread's stack into its file; one block per
# process: `AIRFLOW_MPI_STACK rank=R pid=P host=H state=S proc=C`, then the dump when S=answered.
# A process is signalled only while it catches SIGUSR2 (SigCgt), so asking never kills anything.
# S: answered; stopped (no answer, the process is stopped, e.g. SIGSTOP); silent (no answer in
# time: stuck outside Python, e.g. in the kernel); uncaught (not signalled: no handler any more).
# Asked as root (the local backend enters a pod as root) in a pod whose runtime directory the
# job's user owns, it runs again as that user (as_runtime_owner): the user could have planted a
# symbolic link there, and root would read, delete or signal through it.
STACK_BYTES=65536 # of one process's dump shown

take_stacks() {
  local wait="${1:-5}" dir="$RUNTIME_DIR/stacks" me="${HOSTNAME%%.*}" file name rank pid i state size
  local -a files=() ranks=() pids=() before=() states=() last=()
  require_count seconds "$wait"
  as_runtime_owner stacks "$wait"
  shopt -s nullglob
  for file in "$dir"/rank-*.*; do
    name="${file##*/rank-}"
    rank="${name%%.*}" pid="${name#*.}"
    [[ "$rank" =~ ^[0-9]+$ && "$pid" =~ ^[0-9]+$ ]] || continue
    if [[ ! -r "/proc/$pid/status" ]]; then
      rm -f -- "$file" 2>/dev/null || true # its process ended without unregistering (killed)
      continue
    fi
    state=uncaught
    if caught_usr2 "$pid"; then
      state=waiting
    fi
    files+=("$file") ranks+=("$rank") pids+=("$pid") before+=("$(stat -c %s -- "$file")") states+=("$state") last+=(-1)
  done
  if ((${#files[@]} == 0)); then
    log "no Python rank process registered for stacks on $me"
    return 0
  fi
  for i in "${!files[@]}"; do
    [[ "${states[i]}" == waiting ]] && kill -USR2 "${pids[i]}" 2>/dev/null
  done
  # A dump is complete once its file has grown and then held its size for one poll.
  local deadline=$((SECONDS + wait)) unanswered=1
  while ((unanswered && SECONDS < deadline)); do
    sleep 0.1
    unanswered=0
    for i in "${!files[@]}"; do
      [[ "${states[i]}" == waiting ]] || continue
      size="$(stat -c %s -- "${files[i]}" 2>/dev/null || echo 0)"
      if ((size > before[i] && size == last[i])); then
        states[i]=answered
      else
        last[i]=$size
        unanswered=1
      fi
    done
  done
  for i in "${!files[@]}"; do
    state="${states[i]}"
    local proc
    proc="$(process_state "${pids[i]}")"
    if [[ "$state" == waiting ]]; then
      [[ "$proc" == T || "$proc" == t ]] && state=stopped || state=silent
    fi
    printf 'AIRFLOW_MPI_STACK rank=%s pid=%s host=%s state=%s proc=%s\n' "${ranks[i]}" "${pids[i]}" "$me" "$state" "$proc"
    if [[ "$state" == answered ]]; then
      tail -c +"$((before[i] + 1))" -- "${files[i]}" | head -c "$STACK_BYTES"
      printf '\n'
    fi
  done
}

as_runtime_owner() { # subcommand [arg...]: as root, exec it again as the user owning the runtime dir
  ((EUID == 0)) || return 0
  local path owner group
  for path in "$RUNTIME_DIR" "$RUNTIME_DIR/stacks" "$RUNTIME_DIR/ranks"; do
    [[ -e "$path" || -L "$path" ]] || continue
    read -r owner group < <(stat -c '%u %g' -- "$path") # a link's own owner: stat without -L
    ((owner != 0)) || continue
    command -v setpriv >/dev/null || die "$1: $path is uid $owner's, so root will not act in it; install setpriv (util-linux) to ask as that user"
    # shellcheck disable=SC2093 # exec on purpose: the first path another user owns decides
    exec setpriv --reuid "$owner" --regid "$group" --clear-groups --no-new-privs --inh-caps=-all \
      --bounding-set=-all -- bash "${BASH_SOURCE[0]}" "$@"
  done
}

caught_usr2() { # pid: whether it has a handler for SIGUSR2 (signal 12: bit 11 of SigCgt)
  local key mask
  while read -r key mask; do
    if [[ "$key" == SigCgt: ]]; then
      (((16#$mask >> 11) & 1))
      return
    fi
  done <"/proc/$1/status"
  return 1
}

process_start() { # pid: its start time (field 22 of /proc/PID/stat, clock ticks since boot), or nothing
  local stat
  local -a fields
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 0
  read -r -a fields <<<"${stat##*) }" # from field 3 (state) on: field 22 is index 19
  printf '%s' "${fields[19]:-}"
}

# --- notice ----------------------------------------------------------------------------------

# The pod is about to be taken (its task was killed, a preemption, a drain): every rank process
# registered in this pod that still runs gets SIGCONT (a stopped one could not act on the next)
# and SIGTERM, the signal a training script saves a checkpoint on. Nothing waits here: whoever
# gives the notice waits the job's termination_grace, then removes the pod. Prints one line,
# `AIRFLOW_MPI_NOTICE host=<pod> ranks=<R,R,...>` (the ranks signalled; empty when none ran).
# As root in a pod whose runtime directory the job's user owns, it runs as that user, as stacks
# does: a planted file could otherwise name any process of the pod.
give_notice() {
  local me="${HOSTNAME%%.*}" file pid rank start
  local -a signalled=()
  as_runtime_owner notice
  : >"$RUNTIME_DIR/notice" 2>/dev/null || true # under Hydra a rank's exit then ends no one else
  for file in "$RUNTIME_DIR"/ranks/*; do
    [[ -f "$file" && ! -L "$file" ]] || continue
    pid="${file##*/}"
    [[ "$pid" =~ ^[0-9]+$ ]] || continue
    read -r rank start <"$file" || continue
    [[ -n "$start" && "$(process_start "$pid")" == "$start" ]] || continue
    kill -CONT "$pid" 2>/dev/null || true
    if kill -TERM "$pid" 2>/dev/null; then
      signalled+=("$rank")
    fi
  done
  printf 'AIRFLOW_MPI_NOTICE host=%s ranks=%s\n' "$me" "$(IFS=,; printf '%s' "${signalled[*]}")"
}

process_state() { # pid: the one-letter state of /proc/PID/stat (R, S, D, T, ...), or ? when gone
  local stat
  stat="$(cat "/proc/$1/stat" 2>/dev/null)" || {
    printf '?'
    return
  }
  stat="${stat##*) }"
  printf '%s' "${stat%% *}"
}

main() {
  case "${1:-}" in
    rank)
      shift
      run_rank "$@"
      ;;
    stacks)
      take_stacks "${2:-5}"
      ;;
    notice)
      give_notice
      ;;
    check-hosts)
      require_env GJ_TRAINING_POD_NAME GJ_TRAINING_VC_JOB_NAME GJ_TRAINING_MASTER_CPU_LIMIT \
        GJ_TRAINING_MASTER_GPU_LIMIT GJ_TRAINING_MASTER_REPLICAS GJ_TRAINING_WORKER_CPU_LIMIT \
        GJ_TRAINING_WORKER_GPU_LIMIT GJ_TRAINING_WORKER_REPLICAS
      check_hosts
      ;;
    "")
      require_env GJ_TRAINING_ROLE GJ_TRAINING_POD_NAME GJ_TRAINING_VC_JOB_NAME
      case "$GJ_TRAINING_ROLE" in
        worker) run_worker ;;
        master)
          require_env GJ_TRAINING_MASTER_CPU_LIMIT GJ_TRAINING_MASTER_GPU_LIMIT GJ_TRAINING_MASTER_REPLICAS \
            GJ_TRAINING_WORKER_CPU_LIMIT GJ_TRAINING_WORKER_GPU_LIMIT GJ_TRAINING_WORKER_REPLICAS
          run_master
          ;;
        *) die "GJ_TRAINING_ROLE=$GJ_TRAINING_ROLE is neither master nor worker" ;;
      esac
      ;;
    *) die "unknown command '$1' (use: rank CMD..., check-hosts, stacks [SECONDS], notice, or no argument)" ;;
  esac
}

[[ "${AIRFLOW_MPI_LAUNCH_LIBRARY:-0}" == 1 ]] || main "$@"
