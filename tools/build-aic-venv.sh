#!/usr/bin/env bash
# The AIConfigurator interpreter for the optional timing source (mocker/timing_aic.py) and its real test
# (tests/mocker/test_timing_aic.py): aiconfigurator-core needs numpy >= 2.1 and dynoplan's own venv pins
# numpy < 2, so it lives in a venv of its own, outside the repository:
#   ${DYNOPLAN_CACHE:-$HOME/.cache/dynoplan}/aicvenv-<version>/bin/python
# (point DYNOPLAN_AIC_PYTHON at it to use `--timing aic:...` outside the tests). Nothing is done when it is
# already there. Usage: tools/build-aic-venv.sh. Environment: DYNOPLAN_CACHE, PY (default python3.11).
# Prints one line: "aicvenv <python path> <seconds-or-cached>".
set -euo pipefail
version="0.12.0"
cache="${DYNOPLAN_CACHE:-${HOME:-/root}/.cache/dynoplan}"
venv="$cache/aicvenv-$version"
py="$venv/bin/python"
if [ -x "$py" ] && [ -f "$venv/.installed" ]; then
    echo "aicvenv $py cached"
    exit 0
fi
start=$(date +%s)
rm -rf "$venv"
mkdir -p "$cache"
"${PY:-python3.11}" -m venv "$venv"
nice -n 10 "$py" -m pip install -q --disable-pip-version-check "aiconfigurator-core==$version"
touch "$venv/.installed"
echo "aicvenv $py $(( $(date +%s) - start ))s"
