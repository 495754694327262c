"""What a sandbox pod is from the inside: its first process (``POD_INIT``: host name, mounts, user),
its mounts and its ``/etc/hosts``. Pure: ``sandbox`` creates the namespaces and runs these."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

# PID 1 of every pod, after `ip netns exec` (network, hosts file) and `unshare` (uts, pid, mount).
# Arguments only, never interpolated: the pod name, then "--tmpfs TARGET OPTIONS" and
# "--bind SOURCE TARGET ro|rw" groups in order, optionally "--user UID GID", then "--" and the
# command. With a user, the command runs as it with no capabilities (bounding set emptied) and
# no_new_privs (setuid binaries cannot raise privileges) and no supplementary groups (none of the
# host's groups the user is in, e.g. docker or disk): the mounts are made as root first.
POD_INIT = r"""
set -euo pipefail
printf '%s' "$1" >/proc/sys/kernel/hostname
shift
user=()
while (($#)); do
  case "$1" in
    --tmpfs) mount -t tmpfs -o "$3" tmpfs "$2"; shift 3 ;;
    --bind)
      mount --bind "$2" "$3"
      if [[ "$4" == ro ]]; then mount -o remount,bind,ro "$3"; fi
      shift 4 ;;
    --user) user=("$2" "$3"); shift 3 ;;
    --) shift; break ;;
    *) echo "pod-init: bad argument $1" >&2; exit 2 ;;
  esac
done
cd /
if ((${#user[@]})); then
  exec setpriv --reuid "${user[0]}" --regid "${user[1]}" --clear-groups --no-new-privs \
    --inh-caps=-all --bounding-set=-all -- "$@"
fi
exec "$@"
"""


@dataclass(frozen=True)
class Mount:
    """A bind of a host path (``source``) or, without one, a private tmpfs at ``target``."""

    target: str
    source: str | None = None
    read_only: bool = False
    tmpfs_size: str = "64m"
    tmpfs_mode: str = "0755"
    tmpfs_owner: tuple[int, int] | None = None  # (uid, gid) of the tmpfs's root; default root

    def pod_init_args(self) -> list[str]:
        if self.source is None:
            options = f"mode={self.tmpfs_mode},size={self.tmpfs_size}"
            if self.tmpfs_owner is not None:
                options += f",uid={self.tmpfs_owner[0]},gid={self.tmpfs_owner[1]}"
            return ["--tmpfs", self.target, options]
        return ["--bind", self.source, self.target, "ro" if self.read_only else "rw"]


def render_hosts(entries: Sequence[tuple[str, Sequence[str]]]) -> str:
    """A pod's /etc/hosts: localhost, then each (ip, names). An IPv4 address is named a second
    time as IPv4-mapped IPv6 (``::ffff:10.244.0.2``): a dual-stack socket, such as torch's
    TCPStore (the rendezvous of torch.distributed), holds the peers' addresses in that form, and
    the C library resolves a mapped address only from a line that spells it so; without it each
    rank's lookup goes to a DNS server the pod cannot reach and c10d warns "The hostname of the
    client socket cannot be retrieved". The IPv4 line comes first, so a lookup of a name still
    gives the IPv4 address first (ssh, Open MPI and gloo connect to it as before)."""
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    for ip, names in entries:
        lines.append(f"{ip} {' '.join(names)}")
    for ip, names in entries:
        if isinstance(ipaddress.ip_address(ip), ipaddress.IPv4Address):
            lines.append(f"::ffff:{ip} {' '.join(names)}")
    return "\n".join(lines) + "\n"
