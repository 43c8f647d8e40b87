#!/usr/bin/env bash
# Fetches the CUTLASS C++ headers (cutlass/, cute/) that the CUDA backend's fused W8A8
# INT8 GEMM (src/backends/cuda/ops/int8_gemm_sm90.cu) is built from, into
# third_party/cutlass/include (git-ignored; CMake's KILN_CUTLASS_DIR points there by
# default). They come from NVIDIA's PyPI wheel `nvidia-cutlass` (pinned below), whose
# cutlass_library/source/include holds the header-only C++ library. Idempotent: a tree
# already holding this version is left alone.
#   scripts/fetch_cutlass.sh [WHEEL]   # WHEEL: an already downloaded nvidia_cutlass wheel
set -euo pipefail
cd "$(dirname "$0")/.."
version=4.2.0.0
dest=third_party/cutlass
stamp=$dest/VERSION
if [ -f "$dest/include/cutlass/cutlass.h" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$version" ]; then
  echo "CUTLASS $version headers already in $dest/include"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
wheel=${1:-}
if [ -z "$wheel" ]; then
  python3 -m pip download "nvidia-cutlass==$version" --no-deps --only-binary=:all: -d "$tmp" >/dev/null
  wheel=$(ls "$tmp"/nvidia_cutlass-"$version"-*.whl)
fi
[ -f "$wheel" ] || { echo "fetch_cutlass.sh: no wheel at '$wheel'" >&2; exit 1; }
case "$(basename "$wheel")" in
  nvidia_cutlass-"$version"-*.whl) ;;
  *) echo "fetch_cutlass.sh: $wheel is not nvidia_cutlass $version" >&2; exit 1 ;;
esac
python3 - "$wheel" "$tmp/x" <<'EOF'
import sys, zipfile
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if n.startswith(prefix) or n.endswith("LICENSE.txt")]
    if not any(n == prefix + "cutlass/cutlass.h" for n in names):
        sys.exit(f"fetch_cutlass.sh: {sys.argv[1]} holds no {prefix}cutlass/cutlass.h")
    z.extractall(sys.argv[2], names)
EOF
rm -rf "$dest/include"
mkdir -p "$dest"
mv "$tmp/x/cutlass_library/source/include" "$dest/include"
cp "$tmp"/x/nvidia_cutlass-*.dist-info/licenses/LICENSE.txt "$dest/LICENSE.txt" 2>/dev/null || true
echo "$version" >"$stamp"
echo "CUTLASS $version headers in $dest/include ($(find "$dest/include" -type f | wc -l) files)"
