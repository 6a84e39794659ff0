#!/usr/bin/env bash
# A machine like the GPU machine, by what it lacks: a minimal Debian 12 root
# (debootstrap --variant=minbase, plus python3) in which a command runs with
# nothing else but the folders named on the command line (docs/gpu.md, "The
# pack's dry run").
#
#   scripts/minroot.sh [--ro PATH]... [--rw PATH]... [--] COMMAND [ARG]...
#   scripts/minroot.sh --build     only make sure the root exists (prints its path)
#
# --ro PATH  bind-mounted read-only at the same path inside the root (the pack,
#            the project's Python environment: their absolute paths still work)
# --rw PATH  bind-mounted writable at the same path (an output folder)
# Inside: /proc, a private /dev (null, zero, random, urandom, tty, shm, pts),
# /sys read-only, and an empty /tmp; HOME=/root, PATH=/usr/bin:/bin, nothing
# else from the calling environment. No libsentencepiece, zlib headers, Boost,
# RE2, compilers or ldd targets beyond the base system: what the GPU machine
# does not have. The command's exit status is the script's.
#
# The root is built once per machine (a minute or two: debootstrap downloads
# about 40 MB from deb.debian.org) into
#   ${FSDP_MINROOT:-${XDG_CACHE_HOME:-~/.cache}/fsdp-cpp/minroot-bookworm}
# under a lock, and used only once complete (the marker <root>.ok is written
# last; a root without it is removed and built again). Nothing the command does
# persists in it: it sees the root through an overlay on a tmpfs.
#
# Mounts live in a private mount namespace (unshare): they vanish with the
# command, even when it is killed; a trap also unmounts them in order on every
# way out. Needs root (debootstrap, mount, chroot) and debootstrap
# (scripts/deps.sh installs it).
set -euo pipefail
die() { echo "minroot.sh: $*" >&2; exit 2; }

ROOT=${FSDP_MINROOT:-${XDG_CACHE_HOME:-$HOME/.cache}/fsdp-cpp/minroot-bookworm}
readonly kSuite=bookworm kMirror=${FSDP_DEBIAN_MIRROR:-http://deb.debian.org/debian}

# ---- inside the namespace: mount, chroot, run, unmount ----------------------------
if [[ ${1:-} == --inside ]]; then
  shift
  mounted=()  # in mount order; unmounted in reverse
  child=""
  cleanup() {
    local i
    [[ -n $child ]] && kill -KILL "$child" 2> /dev/null
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2> /dev/null || true; done
  }
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  m() {  # mount ARGS... TARGET (the last argument)
    mount "$@" || die "mount $* failed"
    mounted+=("${!#}")
  }
  # The root seen through an overlay whose upper layer is a tmpfs: the command
  # may write anywhere, and nothing it writes reaches the cached root.
  scratch=$ROOT.mnt
  m -t tmpfs -o mode=755 scratch "$scratch"
  mkdir "$scratch/upper" "$scratch/work" "$scratch/root"
  new=$scratch/root
  m -t overlay -o "lowerdir=$ROOT,upperdir=$scratch/upper,workdir=$scratch/work" minroot "$new"
  m -t proc proc "$new/proc"
  m -t tmpfs -o mode=755 dev "$new/dev"
  for d in null zero full random urandom tty; do
    touch "$new/dev/$d"
    m --bind "/dev/$d" "$new/dev/$d"
  done
  mkdir -p "$new/dev/shm" "$new/dev/pts"
  m -t tmpfs -o mode=1777 shm "$new/dev/shm"
  m -t devpts -o newinstance,ptmxmode=0666 devpts "$new/dev/pts"
  ln -s pts/ptmx "$new/dev/ptmx"
  ln -s /proc/self/fd "$new/dev/fd"
  m -t sysfs -o ro sysfs "$new/sys"
  m -t tmpfs -o mode=1777 tmp "$new/tmp"
  while [[ ${1:-} == --ro || ${1:-} == --rw ]]; do
    kind=$1 path=$2
    shift 2
    mkdir -p "$new$path"
    m --bind "$path" "$new$path"
    if [[ $kind == --ro ]]; then mount -o remount,bind,ro "$new$path" || die "cannot make $path read-only"; fi
  done
  [[ ${1:-} == -- ]] && shift
  # In the background, so that a signal reaches the trap (which kills it) at once.
  chroot "$new" /usr/bin/env -i HOME=/root PATH=/usr/bin:/bin LANG=C.UTF-8 TMPDIR=/tmp "$@" < /dev/null &
  child=$!
  rc=0
  wait "$child" || rc=$?
  child=""
  exit $rc
fi

# ---- build the root once ----------------------------------------------------------
[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, mount, chroot); run it as root"
ensure_root() {
  [[ -f $ROOT.ok ]] && return 0
  command -v debootstrap > /dev/null || die "debootstrap is not installed (scripts/deps.sh installs it)"
  mkdir -p "$(dirname "$ROOT")"
  exec 8> "$ROOT.lock"
  flock 8
  if [[ ! -f $ROOT.ok ]]; then  # not made while we waited
    rm -rf "$ROOT"
    local t0=$SECONDS
    echo "minroot.sh: building $ROOT (debootstrap --variant=minbase $kSuite, plus python3)" >&2
    debootstrap --variant=minbase --include=python3 "$kSuite" "$ROOT" "$kMirror" > "$ROOT.log" 2>&1 ||
      die "debootstrap failed (the last lines of $ROOT.log:
$(tail -n 5 "$ROOT.log"))"
    # Nothing but what debootstrap installed: drop its package cache.
    rm -rf "$ROOT"/var/cache/apt/archives/*.deb
    "$ROOT/usr/bin/python3" --version > /dev/null 2>&1 || chroot "$ROOT" python3 --version > /dev/null ||
      die "the new root at $ROOT has no working python3 (see $ROOT.log)"
    mkdir -p "$ROOT.mnt"  # where each run mounts its overlay, in its own namespace
    date -u +%Y-%m-%dT%H:%M:%SZ > "$ROOT.ok"
    echo "minroot.sh: $ROOT built in $((SECONDS - t0))s ($(du -sh "$ROOT" | cut -f1))" >&2
  fi
  exec 8>&-
}

if [[ ${1:-} == --build ]]; then
  [[ $# -eq 1 ]] || die "--build takes no other argument"
  ensure_root
  echo "$ROOT"
  exit 0
fi

args=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --ro | --rw)
      [[ $# -ge 2 ]] || die "$1 needs a path"
      [[ $2 == /* ]] || die "$1 $2: give an absolute path"
      [[ -d $2 ]] || die "$1 $2: no such folder"
      args+=("$1" "$(realpath "$2")")
      shift 2
      ;;
    --) shift; break ;;
    -*) die "unknown option '$1' (--ro PATH, --rw PATH, --build)" ;;
    *) break ;;
  esac
done
[[ $# -gt 0 ]] || die "no command given; usage: scripts/minroot.sh [--ro PATH]... [--rw PATH]... [--] COMMAND..."
ensure_root
# A private mount namespace: whatever happens to this script, the mounts die with it.
mkdir -p "$ROOT.mnt"
exec unshare --mount --propagation private -- "$0" --inside "${args[@]}" -- "$@"
