# Sourced by the lint tests that try their lint on a made-up checkout and then on the project's
# own. Defines `check NAME COMMAND` (prints ok/FAIL, a failure sets $fail) and
# `check_project NAME LINT`: runs `python3 LINT --root <the checkout the runfiles link back to>`
# (tracked files only); CI (deploy/dev.sh test) runs from a git checkout, anywhere else it fails,
# saying so. Expects $tmp (a scratch folder).
fail=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fail=1; fi; }
check_project() {
  local name=$1 lint=$2 src
  src=$(dirname "$(dirname "$(dirname "$(readlink -f "$lint")")")")
  if [ -e "$src/.git" ] && command -v git > /dev/null; then
    if python3 "$lint" --root "$src" > "$tmp/project"; then
      echo "ok   $name"
    else
      cat "$tmp/project"
      echo "FAIL $name"
      fail=1
    fi
    tail -1 "$tmp/project"
  else
    echo "FAIL the source checkout is not reachable from the runfiles ($src): run from a git checkout"
    fail=1
  fi
}
