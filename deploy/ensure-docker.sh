#!/usr/bin/env bash
# Make a Docker engine reachable and the local base image present, on a bare machine.
#   - installs Debian's docker.io when dockerd is missing (needs root and apt);
#   - starts dockerd in the background when no engine answers (log: /var/log/worldline-dockerd.log);
#   - builds the base image worldline/busybox:latest with `docker import` of a rootfs
#     made from Debian's busybox-static: no registry is needed.
# Idempotent: a second run changes nothing. Exits non-zero, saying why, when it cannot.
set -euo pipefail

IMAGE=${WORLDLINE_BASE_IMAGE:-worldline/busybox:latest}
say() { echo "ensure-docker: $*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    say "need root to run: $*"; exit 1; fi
}

apt_install() {
  if ! command -v apt-get >/dev/null; then say "no apt-get: install $* by hand"; exit 1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null; then
  say "installing docker.io"
  apt_install docker.io
fi

if ! docker info >/dev/null 2>&1; then
  say "starting dockerd"
  as_root sh -c 'nohup dockerd --storage-driver=overlay2 >/var/log/worldline-dockerd.log 2>&1 &'
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  if ! docker info >/dev/null 2>&1; then
    say "dockerd did not come up; its log:"; tail -20 /var/log/worldline-dockerd.log >&2 || true
    exit 1
  fi
fi

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  # A static busybox runs inside an image with no libc; ldd succeeds only on a dynamic one.
  if [ ! -x /bin/busybox ] || ldd /bin/busybox >/dev/null 2>&1; then
    apt_install busybox-static
  fi
  say "building $IMAGE from busybox-static"
  rootfs=$(mktemp -d)
  trap 'rm -rf "$rootfs"' EXIT
  mkdir -p "$rootfs"/{bin,sbin,etc,tmp,root,var,usr/bin,usr/sbin,proc,sys,dev,work}
  cp /bin/busybox "$rootfs/bin/busybox"
  for applet in $("$rootfs/bin/busybox" --list); do
    [ -e "$rootfs/bin/$applet" ] || ln -s busybox "$rootfs/bin/$applet"
  done
  echo 'root:x:0:0:root:/root:/bin/sh' > "$rootfs/etc/passwd"
  echo 'root:x:0:' > "$rootfs/etc/group"
  chmod 1777 "$rootfs/tmp"
  tar -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' --change 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null
fi
say "engine up; base image $IMAGE present"
