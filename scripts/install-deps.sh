#!/usr/bin/env bash
# Installs the Debian packages kvrouter needs to build, test and benchmark.
# Idempotent: does nothing (and needs no network) when everything is present.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config clang libclang-rt-dev
  libxxhash-dev libyajl-dev liburcu-dev libcmocka-dev
  libmsgpack-dev libzmq3-dev libevent-dev
  libnats-dev nats-server
  python3 python3-msgpack python3-zmq python3-cryptography openssl
  gnuplot-nox
  libck-dev uthash-dev
  prometheus
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing: ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq </dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null

# prometheus is here for its promtool (make test checks /metrics with it). Its package also
# enables and starts a Prometheus server where systemd runs; one this script installed is
# stopped and disabled again, so the machine gains a tool, not a daemon on :9090.
# nats-server and libnats-dev: router replicas and discovery (docs/replicas.md).
# nats-server likewise: the tests and the demo start their own on free ports.
# python3-cryptography and openssl: test_nats_trust makes nkey users (ed25519) and a TLS CA
# with client certificates for the NATS servers it starts.
for p in "${missing[@]}"; do
  if { [ "$p" = prometheus ] || [ "$p" = nats-server ]; } && command -v systemctl >/dev/null 2>&1 &&
     [ -d /run/systemd/system ]; then
    $SUDO systemctl disable --now "$p" >/dev/null 2>&1 || true
  fi
done
