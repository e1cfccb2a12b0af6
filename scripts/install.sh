#!/usr/bin/env bash
# Installs machina-toolhost into .venv, from this checkout: the Debian packages its build
# needs, the virtual environment, the build's own Python tools, then the package with the
# extras named as the first argument (e.g. test,bench). The build runs in .venv itself, not
# in a throw-away environment of pip's, so that a second install (other extras) finds the
# first one's build folder valid and compiles nothing again. It prints the compile steps
# as they go; the whole log is kept in build/install.log.
set -euo pipefail
cd "$(dirname "$0")/.."
# In a git checkout, the commit-msg hook: a subject of at most 72 characters, then a blank line.
if hooks=$(git rev-parse --git-path hooks 2>/dev/null); then mkdir -p "$hooks" && cp scripts/commit-msg "$hooks/commit-msg"; fi
# The test extras also get what the tests start (podman for the container runner's tests).
case ",${1:-}," in *,test,*) bash scripts/install-system-deps.sh --test ;; *) bash scripts/install-system-deps.sh ;; esac
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
# What pyproject.toml's [build-system] requires, and the build's own tools.
mapfile -t build_requires < <(python - <<'PY'
import ast, re
text = open("pyproject.toml").read()
section = text.split("[build-system]", 1)[1].split("\n[", 1)[0]
print("\n".join(ast.literal_eval(re.search(r"requires\s*=\s*(\[.*?\])", section, re.S).group(1))))
PY
)
pip install -q "${build_requires[@]}" "cmake>=3.25" ninja
mkdir -p build
log=build/install.log
target=".${1:+[$1]}"
# The test and bench extras get the _testing module (hooks the tests and benchmarks reach the
# core through); a plain install and the wheel leave it out.
testing_hooks=()
case ",${1:-}," in *,test,*|*,bench,*) testing_hooks=(-C cmake.define.MACHINA_TESTING_HOOKS=ON) ;; esac
echo "machina-toolhost: building and installing $target (the first build takes about three minutes on" \
     "two cores; its compile steps follow, the whole log goes to $log)"
if ! pip install --no-build-isolation -v "${testing_hooks[@]}" "$target" 2>&1 | tee "$log" |
       { grep --line-buffered -E '^ *\[[0-9]+/[0-9]+\] |^Successfully installed' || true; }; then
  echo "machina-toolhost: the install failed; the end of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
fi
