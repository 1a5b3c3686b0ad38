#!/usr/bin/env bash
# A local Docker engine, an image registry and a base image, for building and testing hf2triton's
# serving image on a machine that can reach Debian's archive but no image registry.
#
#   bash infra/docker-env.sh up     start what is missing, print KEY=VALUE lines to use
#   bash infra/docker-env.sh down   stop what `up` started (nothing else)
#
# up: uses a Docker engine that already answers (DOCKER_HOST or the default socket); otherwise, as
# root, installs docker.io / docker-registry / debootstrap with apt when absent and starts dockerd.
# Starts `docker-registry` on 127.0.0.1:$HF2TRITON_REGISTRY_PORT (default 5000; 0 picks a free
# port) unless a registry answers there. Builds the base image by debootstrap + `docker import`
# unless it exists; the debootstrap tarball is cached in .cache/debootstrap.
# State (pid files, logs, registry storage) lives in $HF2TRITON_DOCKER_STATE (default
# .cache/docker-env). Output on stdout, for `eval "$(bash infra/docker-env.sh up)"`:
#   export HF2TRITON_REGISTRY=127.0.0.1:5000
#   export HF2TRITON_BASE_IMAGE=hf2triton/bookworm-python:3.11-63e32dca
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
STATE=${HF2TRITON_DOCKER_STATE:-$ROOT/.cache/docker-env}
PORT=${HF2TRITON_REGISTRY_PORT:-5000}
SUITE=bookworm
MIRROR=${HF2TRITON_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# python3.11 for the Triton stub; libpython3.11 is the shared library the stub links against;
# python3-venv gives ensurepip, so the image installs wheels with pip and no network.
INCLUDE=python3,python3-venv,libpython3.11
KEY=$(printf '%s %s %s' "$SUITE" "$INCLUDE" minbase | sha256sum | cut -c1-8)
BASE=${HF2TRITON_BASE_IMAGE_TAG:-hf2triton/bookworm-python:3.11-$KEY}

log() { echo "docker-env: $*" >&2; }
die() { echo "docker-env: error: $*" >&2; exit 1; }

engine_ok() { timeout 20 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }
registry_ok() { python3 - "$1" <<'PY' 2>/dev/null
import sys, urllib.request
with urllib.request.urlopen(f"http://{sys.argv[1]}/v2/", timeout=3) as r:
    sys.exit(0 if r.status == 200 else 1)
PY
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_missing() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v docker-registry >/dev/null || missing+=(docker-registry)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  ((${#missing[@]})) || return 0
  [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null \
    || die "missing ${missing[*]}: install them (apt-get install ${missing[*]}) or run as root"
  log "installing ${missing[*]}"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

start_engine() {
  if engine_ok; then log "using the running Docker engine"; return; fi
  [[ $(id -u) == 0 ]] || die "no Docker engine answers (DOCKER_HOST=${DOCKER_HOST:-unset}) and only root can start one"
  install_missing
  log "starting dockerd (log: $STATE/dockerd.log)"
  # setsid: dockerd and its containerd outlive this script; `down` stops them by pid.
  setsid dockerd --pidfile "$STATE/dockerd.pid.own" >"$STATE/dockerd.log" 2>&1 < /dev/null &
  echo $! >"$STATE/dockerd.pid"
  for _ in $(seq 120); do
    engine_ok && return
    alive "$STATE/dockerd.pid" || die "dockerd exited; see $STATE/dockerd.log: $(tail -3 "$STATE/dockerd.log")"
    sleep 0.5
  done
  die "dockerd did not answer within 60s; see $STATE/dockerd.log"
}

start_registry() {
  [[ "$PORT" == 0 ]] && PORT=$(free_port)
  if registry_ok "127.0.0.1:$PORT"; then log "using the registry at 127.0.0.1:$PORT"; return; fi
  command -v docker-registry >/dev/null || install_missing
  mkdir -p "$STATE/registry"
  cat >"$STATE/registry.yml" <<YML
version: 0.1
log: {level: warn}
storage:
  filesystem: {rootdirectory: $STATE/registry}
  delete: {enabled: true}
http: {addr: 127.0.0.1:$PORT}
YML
  log "starting docker-registry on 127.0.0.1:$PORT"
  setsid docker-registry serve "$STATE/registry.yml" >"$STATE/registry.log" 2>&1 < /dev/null &
  echo $! >"$STATE/registry.pid"
  for _ in $(seq 60); do
    registry_ok "127.0.0.1:$PORT" && return
    alive "$STATE/registry.pid" || die "docker-registry exited; see $STATE/registry.log: $(tail -3 "$STATE/registry.log")"
    sleep 0.5
  done
  die "the registry did not answer on 127.0.0.1:$PORT within 30s"
}

build_base() {
  if docker image inspect "$BASE" >/dev/null 2>&1; then log "base image $BASE exists"; return; fi
  local cache=$ROOT/.cache/debootstrap tar
  tar=$cache/$SUITE-minbase-$KEY.tar
  if [[ ! -s $tar ]]; then
    command -v debootstrap >/dev/null || install_missing
    [[ $(id -u) == 0 ]] || die "debootstrap needs root"
    mkdir -p "$cache"
    local dir; dir=$(mktemp -d "$cache/.rootfs.XXXXXX")
    log "debootstrap $SUITE (minbase + $INCLUDE) from $MIRROR"
    debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$dir" "$MIRROR" >"$cache/debootstrap.log" 2>&1 \
      || { rm -rf "$dir"; die "debootstrap failed; see $cache/debootstrap.log"; }
    rm -rf "$dir"/var/cache/apt/archives/*.deb "$dir"/var/lib/apt/lists/* "$dir"/usr/share/doc/* \
      "$dir"/usr/share/man/* "$dir"/usr/share/locale/*
    tar --numeric-owner -C "$dir" -cf "$tar.tmp" . && mv "$tar.tmp" "$tar"
    rm -rf "$dir"
  fi
  log "docker import $tar as $BASE"
  docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' "$tar" "$BASE" >/dev/null
}

stop_pid() {  # stop a process this script started, by its recorded pid
  local file=$1 name=$2 pid
  [[ -f $file ]] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

case "${1:-}" in
  up)
    mkdir -p "$STATE"
    start_engine
    start_registry
    build_base
    echo "export HF2TRITON_REGISTRY=127.0.0.1:$PORT"
    echo "export HF2TRITON_BASE_IMAGE=$BASE"
    ;;
  down)
    stop_pid "$STATE/registry.pid" docker-registry
    stop_pid "$STATE/dockerd.pid" dockerd
    ;;
  *) echo "usage: bash infra/docker-env.sh up|down" >&2; exit 2 ;;
esac
