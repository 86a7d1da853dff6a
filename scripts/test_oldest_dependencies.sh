#!/usr/bin/env bash
# Run the test suite against the oldest releases pyproject.toml admits: each `>=` lower bound
# (core dependencies, the dev extra and the extras it names) is installed as `==`, in a new
# virtual environment, so the README's dependency policy ("every lower bound is a release the
# tests have passed on") can be checked by anyone.
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

# The lower bounds, read from pyproject.toml by the standard library's TOML reader. Written
# to a file first: a failure inside `mapfile < <(...)` would not stop the script.
"$python" - "$root/pyproject.toml" >"$scratch/oldest.txt" <<'PY'
import re
import sys
import tomllib

with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
extras = project["optional-dependencies"]


def requirements(names: list[str]) -> list[str]:
    """The requirements of these lists, with nmt-cli[extra,...] replaced by those extras' own."""
    found = []
    for requirement in names:
        self_reference = re.fullmatch(r"nmt-cli\[([a-z0-9,_-]+)\]", requirement.replace(" ", ""))
        if self_reference:
            found += requirements([r for extra in self_reference.group(1).split(",") for r in extras[extra]])
        else:
            found.append(requirement)
    return found


for requirement in requirements(project["dependencies"] + extras["dev"]):
    match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9][0-9A-Za-z.]*)", requirement.replace(" ", ""))
    if match is None:
        sys.exit(f"pyproject.toml: {requirement!r} is not of the form NAME>=VERSION")
    if match.group(1) != "torch":
        print(f"{match.group(1)}=={match.group(2)}")
PY
mapfile -t oldest <"$scratch/oldest.txt"
echo "oldest releases: ${oldest[*]}"
"$python" -m pip install -q --disable-pip-version-check "${oldest[@]}"
"$python" -m pip install -q --disable-pip-version-check --no-deps -e "$root"
"$python" -m pip check

cd "$root"
PATH="$scratch/venv/bin:$PATH" "$python" -m pytest -q -p no:cacheprovider "$@"
