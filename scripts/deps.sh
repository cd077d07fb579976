#!/usr/bin/env bash
# Installs the Debian packages replay builds against, only those missing.
# Idempotent and quiet when everything is present; safe to run from make.
set -euo pipefail

pkgs=(build-essential cmake pkg-config libjansson-dev libcmocka-dev
      libpcre2-dev libutf8proc-dev libmicrohttpd-dev libedit-dev nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# nodejs/npm may come from elsewhere (nvm, a tarball): a working npm is enough.
if command -v npm >/dev/null 2>&1; then
  missing=("${missing[@]/nodejs}"); missing=("${missing[@]/npm}")
fi
read -r -a missing <<<"${missing[*]:-}"
[ ${#missing[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >/dev/null
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
