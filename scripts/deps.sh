#!/usr/bin/env bash
# Installs what birkhoff needs on Debian 12 when it is missing (called by the
# README's commands and by .ci/run). Set BK_NO_ORACLE=1 to skip the PyTorch
# oracle packages (~1.2 GB). SentencePiece (libsentencepiece-dev; g++ for the
# C++ shim src/data/spm.cc) is linked into the library; its tools (sentencepiece)
# serve scripts/data.sh, its Python module the oracle test tests/oracle/test_spm.py.
set -euo pipefail
need=()
have() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in gcc g++ make pkg-config cmake libopenblas-dev liblapacke-dev zlib1g-dev libcairo2-dev python3-venv openmpi-bin libopenmpi-dev \
         libsentencepiece-dev sentencepiece; do have "$p" || need+=("$p"); done
if [ "${BK_NO_ORACLE:-0}" != 1 ]; then
  for p in python3-torch python3-numpy python3-nltk python3-sentencepiece; do have "$p" || need+=("$p"); done
fi
if [ ${#need[@]} -eq 0 ]; then
  echo "deps: all present"
  exit 0
fi
echo "deps: installing ${need[*]}"
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y --no-install-recommends "${need[@]}"
