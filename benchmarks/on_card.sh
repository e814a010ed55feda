#!/usr/bin/env bash
# Runs a command only where the GPU's name contains a given text: a device call that asks for
# an H200 may start an H100, and a measurement meant for the H200's targets is worth nothing
# there. Exits 3 (after printing the card's name) where the card does not match, so the call
# costs only the machine's start.
#
# usage: bash benchmarks/on_card.sh NAME COMMAND [ARG...]
#   NAME     text the card's name must contain, case-insensitive (e.g. H200)
#   COMMAND  what to run on a matching card, with its arguments
set -uo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then sed -n 2,9p "$0"; exit 0; fi
if [ $# -lt 2 ]; then sed -n 7,9p "$0" >&2; exit 2; fi
want=$1; shift
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
if [ -z "$card" ]; then echo "on_card: no NVIDIA GPU answered nvidia-smi" >&2; exit 3; fi
echo "on_card: the card is '$card'"
if [[ "${card,,}" != *"${want,,}"* ]]; then
    echo "on_card: not an $want: nothing run" >&2
    exit 3
fi
exec "$@"
