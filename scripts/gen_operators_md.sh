#!/bin/sh
# Regenerates the operator table of docs/OPERATORS.md (the part between the
# markers) from the registry: scripts/gen_operators_md.sh [build/birkhoff]
set -eu
BK=${1:-build/birkhoff}
DOC=$(dirname "$0")/../docs/OPERATORS.md
TMP=$DOC.tmp.$$
sed '/<!-- BEGIN generated/q' "$DOC" > "$TMP"
"$BK" attn --list --markdown >> "$TMP"
echo "<!-- END generated -->" >> "$TMP"
mv "$TMP" "$DOC"
