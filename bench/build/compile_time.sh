#!/usr/bin/env bash
# Compile time of the translation units that include the project's public
# headers carrying JSON (checkpoint/sharded.h, checkpoint/hf.h,
# common/json_input.h), at a reference commit and in the working tree, in the
# same run, one file at a time: the effect of a header change on the build.
#
#   bench/build/compile_time.sh [REF]     (REF: a commit, default HEAD)
#
# Uses build/compile_commands.json (scripts/build.sh makes it) for each file's
# flags; the reference is checked out into a temporary worktree and compiled
# with the same flags, its own sources and headers. Prints one row per file
# and the totals with their ratio.
set -euo pipefail
cd "$(dirname "$0")/../.."
REF=${1:-HEAD}
ROOT=$(pwd)
DB=build/compile_commands.json
[[ -f "$DB" ]] || { echo "compile_time.sh: $DB is missing; run scripts/build.sh first" >&2; exit 2; }
ref_sha=$(git rev-parse --verify "$REF^{commit}" 2>/dev/null) ||
  { echo "compile_time.sh: '$REF' is not a commit of this repository" >&2; exit 2; }
WT=$(mktemp -d)
OUT=$(mktemp -d)
trap 'git worktree remove --force "$WT" >/dev/null 2>&1 || rm -rf "$WT"; rm -rf "$OUT"' EXIT
git worktree add --detach "$WT" "$ref_sha" >/dev/null 2>&1

# The files: every source (src, apps, tests) that includes one of the headers, in either tree.
mapfile -t files < <( (cd "$ROOT" && grep -rlE 'fsdp/checkpoint/(sharded|hf|agreement)\.h|fsdp/common/json_input\.h' src apps tests --include='*.cpp';
                       cd "$WT" && grep -rlE 'fsdp/checkpoint/(sharded|hf)\.h|fsdp/common/json_input\.h' src apps tests --include='*.cpp') |
                     sort -u | grep -v '^tests/fuzz/')

timed_compile() {  # TREE FILE -> seconds, or "-" when the file is not in that tree or has no command
  local tree=$1 file=$2 cmd
  [[ -f "$tree/$file" ]] || { echo "-"; return; }
  cmd=$(python3 - "$DB" "$ROOT" "$tree" "$file" "$OUT/x.o" <<'PY'
import json, shlex, sys
db, root, tree, file, out = sys.argv[1:]
for e in json.load(open(db)):
    if e["file"] == f"{root}/{file}":
        args = shlex.split(e["command"])
        args = [a.replace(f"{root}/src", f"{tree}/src").replace(f"{root}/include", f"{tree}/include")
                 .replace(f"{root}/apps", f"{tree}/apps").replace(f"{root}/tests", f"{tree}/tests") for a in args]
        i = args.index("-o"); args[i + 1] = out
        i = args.index("-c"); args[i + 1] = f"{tree}/{file}"
        print("cd " + shlex.quote(e["directory"]) + " && " + shlex.join(args))
        break
PY
)
  [[ -n "$cmd" ]] || { echo "-"; return; }
  local t0 t1
  t0=$(date +%s.%N)
  bash -c "$cmd" > "$OUT/log" 2>&1 || { echo "compile_time.sh: $file failed to compile in $tree:" >&2; tail -5 "$OUT/log" >&2; exit 1; }
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.1f}')"
}

printf '%-48s %10s %10s %7s\n' "file" "ref (s)" "now (s)" "x"
ref_total=0; now_total=0
for f in "${files[@]}"; do
  r=$(timed_compile "$WT" "$f"); n=$(timed_compile "$ROOT" "$f")
  if [[ "$r" == "-" || "$n" == "-" ]]; then printf '%-48s %10s %10s %7s\n' "$f" "$r" "$n" ""; continue; fi
  ratio=$(python3 -c "print(f'{$n / $r:.2f}')")
  printf '%-48s %10s %10s %7s\n' "$f" "$r" "$n" "$ratio"
  ref_total=$(python3 -c "print($ref_total + $r)"); now_total=$(python3 -c "print($now_total + $n)")
done
printf '%-48s %10.1f %10.1f %7s\n' "total (files in both trees)" "$ref_total" "$now_total" \
  "$(python3 -c "print(f'{$now_total / $ref_total:.2f}' if $ref_total else '')")"
echo "reference: $(git log -1 --format='%h %s' "$ref_sha" | cut -c1-80)"
