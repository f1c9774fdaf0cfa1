#!/bin/bash
# Formats the tracked C++ and CUDA sources with the repo's .clang-format (Google style, 100
# columns), in place. `tools/format/format.sh --check` changes nothing and exits 1 listing the files
# whose format differs (what //tests/lint:format_test runs).
set -u
cd "$(dirname "$0")/../.."
command -v clang-format > /dev/null || { echo "format.sh: clang-format is not installed (apt-get install clang-format)" >&2; exit 2; }
mapfile -t files < <(git ls-files -- '*.cc' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in "${files[@]}"; do
    if ! clang-format --dry-run --Werror "$f" > /dev/null 2>&1; then
      echo "not formatted: $f"
      bad=1
    fi
  done
  [ $bad = 0 ] && echo "${#files[@]} files formatted"
  exit $bad
fi
clang-format -i "${files[@]}"
