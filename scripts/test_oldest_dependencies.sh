#!/usr/bin/env bash
# Run the test suite against the oldest releases pyproject.toml admits: each `>=` lower bound
# (core dependencies and the dev extra) is installed as `==`, in a new virtual environment,
# so the README's dependency policy ("every lower bound is a release the tests have passed
# on") can be checked by anyone.
#
#   scripts/test_oldest_dependencies.sh [PYTEST_ARGS...]
#
# torch is the exception: TORCH (default 2.13.0, the CPU wheel) is installed instead of its
# lower bound, whose CPU build may not be at hand; its bound is checked where that release
# runs (see the README's Install section).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

python3 -m venv "$scratch/venv"
python=$scratch/venv/bin/python
"$python" -m pip install -q --disable-pip-version-check "torch==${TORCH:-2.13.0}"

# The lower bounds, read from pyproject.toml by the standard library's TOML reader.
mapfile -t oldest < <("$python" - "$root/pyproject.toml" <<'PY'
import re
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
for requirement in project["dependencies"] + project["optional-dependencies"]["dev"]:
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][0-9A-Za-z.]*)", requirement.replace(" ", ""))
    if match is None:
        sys.exit(f"pyproject.toml: {requirement!r} is not of the form NAME>=VERSION")
    if match.group(1) != "torch":
        print(f"{match.group(1)}=={match.group(2)}")
PY
)
echo "oldest releases: ${oldest[*]}"
"$python" -m pip install -q --disable-pip-version-check "${oldest[@]}"
"$python" -m pip install -q --disable-pip-version-check --no-deps -e "$root"
"$python" -m pip check

cd "$root"
PATH="$scratch/venv/bin:$PATH" "$python" -m pytest -q -p no:cacheprovider "$@"
