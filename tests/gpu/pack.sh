#!/usr/bin/env bash
# Build machine: builds every GPU program (tests/gpu/pack_manifest.txt: the daemon, CLI, demo,
# every gpu-tagged test, every GPU benchmark, libkvrail.so, the Python package with its protos)
# and packs them, stripped, with one shared lib/ folder and the tests/gpu scripts, into ONE
# xz-compressed bundle in the folder the device tool carries (default .gpupack/, git-ignored;
# PACK names another; no other folder is touched): .gpupack/gpupack.tar.xz (~110 MiB unpacked,
# ~15 MiB packed: the static CUDA programs share most of their bytes) and .gpupack/MANIFEST.
# Then, on the device machine, carry .gpupack and run from the repository root:
#   bash tests/gpu/run.sh one-gpu [STEP...]      (or two-gpu; `list` names the steps)
# run.sh unpacks the bundle once per machine and runs the pack's own copy of itself.
# Checks, and fails on: a gpu-tagged target or tests/gpu program missing from the manifest
# (bazel query), an entry over its size budget (unpacked), the bundle over the manifest's
# archive budget or, with the tracked tree, over the device tool's 64 MiB carry limit.
# NO_BUILD=1 packs what bazel-bin holds (no build, no query).
set -euo pipefail
cd "$(dirname "$0")/../.."
pack=${PACK:-.gpupack}
manifest=tests/gpu/pack_manifest.txt
carry_limit_kib=$((64 * 1024))

targets=()
while read -r kind src _ _; do
  [[ $kind == target ]] && targets+=("$src")
done < <(grep -vE '^\s*(#|$)' "$manifest")

if [[ ${NO_BUILD:-0} != 1 ]]; then
  # Completeness at pack time: what Bazel knows as a GPU program must be in the manifest.
  want=$(bazel query --keep_going --output=label \
    'attr(tags, "[\[ ]gpu[,\]]", //...) union kind("cc_binary|cc_test", //tests/gpu:*)' \
    2>/dev/null || true)
  [[ -n $want ]] || { echo "pack: bazel query found no GPU targets" >&2; exit 1; }
  missing=$(comm -23 <(sort -u <<< "$want") <(printf '%s\n' "${targets[@]}" | sort -u))
  if [[ -n $missing ]]; then
    echo "pack: not in $manifest (add them with a size budget):" >&2
    echo "$missing" >&2
    exit 1
  fi
  bazel build "${targets[@]}"
fi

# bazel-bin through its link (`bazel info` would wait for the shared server's lock).
bin=bazel-bin
out_of() {  # //pkg:name -> bazel-bin/pkg/name
  local l=${1#//}
  echo "$bin/${l%%:*}/${l#*:}"
}

programs=()
while read -r kind src _ _; do
  case $kind in
    target) [[ $src == //python:protos ]] || programs+=("$(out_of "$src")") ;;
    system) programs+=("$src") ;;
  esac
done < <(grep -vE '^\s*(#|$)' "$manifest")
rm -rf "$pack"
stage=$pack/stage
tests/gpu/devpack.sh -s -o "$stage" "${programs[@]}"

while read -r kind src dest _; do
  case $kind in
    tree)
      mkdir -p "$(dirname "$stage/$dest")"
      cp -r "$src" "$stage/$dest"
      ;;
    scripts)
      mkdir -p "$stage/$dest"
      ;;
    script)
      cp "$src" "$stage/$dest"
      ;;
  esac
done < <(grep -vE '^\s*(#|$)' "$manifest")
mkdir -p "$stage/py/kvrail/proto"
cp "$bin"/python/kvrail/proto/*_pb2.py "$stage/py/kvrail/proto/"
find "$stage/py" -name __pycache__ -prune -exec rm -rf {} +
chmod -R u+w "$stage"

# Sizes against the budgets; the pack's own MANIFEST records them with the commit.
kib() { du -sk "$1" | cut -f1; }
over=0
target_libs=0
{
  echo "# $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with local changes)'), packed $(date -u '+%F %H:%M UTC')"
  echo "# KIND SOURCE PACK_PATH KIB BUDGET_KIB"
} > "$stage/MANIFEST"
while read -r kind src dest budget; do
  [[ $kind == limit ]] && continue
  [[ $kind == script ]] && { echo "script $src $dest" >> "$stage/MANIFEST"; continue; }
  if [[ $kind == libs ]]; then
    size=$(( $(kib "$stage/lib") - target_libs ))
  elif [[ -e $stage/$dest ]]; then
    size=$(kib "$stage/$dest")
  else
    echo "pack: $src did not land at $stage/$dest" >&2
    exit 1
  fi
  [[ $kind == target && $dest == lib/* ]] && target_libs=$((target_libs + size))
  # The package's size without the generated protos (their own entry).
  [[ $dest == py/kvrail ]] && size=$((size - $(kib "$stage/py/kvrail/proto")))
  echo "$kind $src $dest $size $budget" >> "$stage/MANIFEST"
  if (( size > budget )); then
    echo "pack: $src takes $size KiB, over its budget of $budget KiB ($manifest)" >&2
    over=1
  fi
done < <(grep -vE '^\s*(#|$)' "$manifest")
unpacked=$(kib "$stage")
limit() { awk -v w="$1" '$1 == "limit" && $2 == w {print $4}' "$manifest"; }
if (( unpacked > $(limit unpacked) )); then
  echo "pack: $unpacked KiB unpacked, over the manifest's limit of $(limit unpacked) KiB" >&2
  over=1
fi
(( over == 0 )) || exit 1

# One archive (xz: ~7x on these programs; run.sh unpacks it with tar or, without xz, Python).
tar -C "$stage" -cf - . | xz -9 -T2 -c > "$pack/gpupack.tar.xz"
cp "$stage/MANIFEST" "$pack/MANIFEST"
rm -rf "$stage"
archive=$(kib "$pack/gpupack.tar.xz")
echo "archive $archive KiB (unpacked $unpacked KiB)" >> "$pack/MANIFEST"
tree_kib=$(git ls-files -z | xargs -0 stat -c %s | awk '{s += $1} END {print int(s / 1024)}')
echo "pack: $pack/gpupack.tar.xz is $archive KiB ($unpacked KiB unpacked); the tracked tree" \
  "$tree_kib KiB; together $((archive + tree_kib)) of the device tool's $carry_limit_kib KiB"
if (( archive > $(limit archive) )); then
  echo "pack: the archive is over the manifest's limit of $(limit archive) KiB" >&2
  exit 1
fi
if (( archive + tree_kib > carry_limit_kib )); then
  echo "pack: over the device tool's carry limit" >&2
  exit 1
fi
echo "device machine: carry $pack; run from the repository root: bash tests/gpu/run.sh one-gpu" \
  "(or two-gpu; 'list' names the steps)"
