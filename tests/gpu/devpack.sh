#!/usr/bin/env bash
# devpack: copies built programs and the shared libraries they need into one pack folder, so the
# GPU machine (Ubuntu 24.04, none of this machine's Debian libraries) can run them.
#
#   tests/gpu/devpack.sh [-a] [-s] -o DIR FILE...
#   -o DIR  the pack folder, relative to the repository root (required: no default, so no call
#           wipes a pack it was not asked for)
#   -a      add to DIR instead of starting it afresh (several calls build one pack)
#   -s      strip what is copied (symbols and debug info; the kernels' device code stays)
#   FILE    an executable (to DIR/bin) or a shared library (*.so*, to DIR/lib)
#
# Only DIR is ever removed or written. glibc, libstdc++, libgcc, libcuda and the other NVIDIA
# driver libraries are the GPU machine's own and are not copied; every other library an ELF file
# needs (ldd) goes to DIR/lib once, shared by all programs. libfabric's provider plugins come too.
# On the GPU machine: export LD_LIBRARY_PATH=$PWD/DIR/lib:$LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/../.."
append=0 strip_them=0 pack=""
while getopts "aso:" opt; do
  case $opt in
    a) append=1 ;;
    s) strip_them=1 ;;
    o) pack=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [[ -z $pack || $# -eq 0 ]]; then
  sed -n 2,16p "$0" >&2
  exit 2
fi
pack=${pack%/}
case $pack in
  /* | .. | ../* | */../* | . | "") echo "devpack: -o must name a folder inside the repository" >&2; exit 2 ;;
esac
[[ $append == 1 ]] || rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib"
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libutil|libresolv|libstdc\+\+|libgcc_s|libcuda\.so|libnvidia)'
# Copies $1 to the file $2 (replacing a read-only copy from an earlier call), stripped with -s.
put() {
  local to=$2
  rm -f "$to"
  cp -L "$1" "$to"
  chmod u+w "$to"
  if [[ $strip_them == 1 ]]; then strip --strip-unneeded "$to" 2>/dev/null || true; fi
}
for f in "$@"; do
  if [[ ! -f $f ]]; then echo "devpack: $f: no such file (built?)" >&2; exit 2; fi
  case $(basename "$f") in
    *.so | *.so.*) put "$f" "$pack/lib/$(basename "$f")" ;;
    *)
      [[ -x $f ]] || { echo "devpack: $f is not an executable" >&2; exit 2; }
      put "$f" "$pack/bin/$(basename "$f")"
      ;;
  esac
  # Libraries: read ldd's whole output first (no reader stops early under pipefail).
  deps=$(ldd "$f" 2>/dev/null || true)
  while read -r name arrow path _; do
    [[ $arrow == "=>" && $path == /* ]] || continue
    [[ $name =~ $skip ]] && continue
    # Under the name the program asks for (the soname), whatever the file is called here.
    [[ -e $pack/lib/$name ]] || put "$path" "$pack/lib/$name"
  done <<< "$deps"
done
# libfabric loads some providers as plugins from its own folder.
if grep -q libfabric <<< "$(ls "$pack/lib")" && [[ -d /usr/lib/x86_64-linux-gnu/libfabric ]]; then
  cp -rLn /usr/lib/x86_64-linux-gnu/libfabric "$pack/lib/" 2>/dev/null || true
fi
echo "devpack: $(du -sh "$pack" | cut -f1) in $pack ($(ls "$pack/bin" | wc -l) programs, $(ls "$pack/lib" | wc -l) libraries)"
