#!/usr/bin/env bash
# Compile every schemas/*.ksy into Python parsers under tools/_kaitai_out/.
#
# Needs node (>= 18) and npm; installs the pinned compiler into tools/kaitai/node_modules
# (git-ignored). The generated modules need the PyPI `kaitaistruct` runtime (0.11) to import.
# Usage: bash tools/kaitai/build.sh            (from anywhere)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out="$root/tools/_kaitai_out"

for tool in node npm; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "build.sh: '$tool' not found on PATH (Node.js 18+ with npm is required)" >&2
    exit 127
  fi
done

# package.json pins exact versions; no lock file is written, so the work tree stays clean.
# Skip the install when node_modules already holds exactly the pinned versions.
installed_ok() {
  (cd "$here" && node -e '
    const deps = require("./package.json").dependencies;
    for (const [name, want] of Object.entries(deps)) {
      let got;
      try { got = require(`./node_modules/${name}/package.json`).version; } catch (e) { process.exit(1); }
      if (got !== want) process.exit(1);
    }')
}
if ! installed_ok; then
  (cd "$here" && npm install --no-audit --no-fund --no-package-lock --prefer-offline --loglevel=error)
fi

shopt -s nullglob
schemas=("$root"/schemas/*.ksy)
if [ "${#schemas[@]}" -eq 0 ]; then
  echo "build.sh: no schemas/*.ksy found under $root" >&2
  exit 1
fi

# Start from an empty output folder so that a removed schema leaves no stale parser behind.
rm -rf "$out"
mkdir -p "$out"
# A schema that imports another (hurray_wire_blob imports hurray_descriptor) also writes the
# imported module; its generated Python does `import hurray_descriptor`, so tools/_kaitai_out/
# must be on sys.path (or the module registered under that name) when it is imported.
for ksy in "${schemas[@]}"; do
  node "$here/compile.js" "$ksy" "$out"
done
