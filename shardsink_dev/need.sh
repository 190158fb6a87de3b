#!/usr/bin/env bash
# Debian packages the two commands need, installed in ONE apt-get run if any is missing.
#
#   bash shardsink_dev/need.sh CHECK:PACKAGE ...
#
# CHECK is a command on PATH, or a path glob (contains a '/') that must match a file. As root
# with apt-get, the missing packages are installed (one `apt-get update`, one install);
# otherwise the script names them, says how to install them, and exits 1. Safe to re-run.
set -euo pipefail
missing=()
for pair in "$@"; do
  check=${pair%%:*} pkg=${pair#*:}
  if [[ $check == */* ]]; then
    compgen -G "$check" >/dev/null && continue
  else
    command -v "$check" >/dev/null 2>&1 && continue
  fi
  [[ " ${missing[*]-} " == *" $pkg "* ]] || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing Debian packages: ${missing[*]} (Spark needs a JVM; the tests use Chromium, PostgreSQL, Redis and jq)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "ERROR: missing: ${missing[*]}. Install them (Debian/Ubuntu: sudo apt-get install ${missing[*]};"
  echo "macOS: brew install openjdk@17 chromium postgresql redis jq) and re-run."
  exit 1
fi
