#!/bin/sh
# Installs vgpu's libvgpu.so and ld.so.preload into the host directory that
# HAMi's and Volcano's device plugins mount into containers (/usr/local/vgpu),
# and can put back what was there. Run by the vgpu-installer DaemonSet
# (deploy/vgpu-installer.yaml) with the host directory mounted at DIR.
#
#   install.sh install DIR [LIB]   replace libvgpu.so and every libvgpu.so.* in DIR
#   install.sh keep DIR [LIB]      install, then re-check every $VGPU_KEEP_INTERVAL s
#   install.sh restore DIR         put back what install replaced
#
# Every file is replaced by rename, never rewritten in place: a running
# process keeps the library it mapped, and a container keeps the file it
# bind-mounted at its start (its inode). What was replaced is kept, as hard
# links, in DIR/.vgpu-backup/ so that `restore` can rename it back.
# HAMi's device plugin mounts DIR/libvgpu.so.<its version> when it exists,
# else DIR/libvgpu.so: both are replaced.
#
# ld.so.preload names the library by the path it has inside containers,
# which is its path on the host: HAMi's plugin mounts the host's
# {gpuHookPath}/vgpu/libvgpu.so at that same path, Volcano's mounts
# HOOK_PATH/libvgpu.so (/usr/local/vgpu) there. So DIR must be the host
# directory as mounted under $VGPU_HOST_ROOT (default /host), and the line
# is DIR without that prefix: /host/opt/hami/vgpu -> /opt/hami/vgpu/libvgpu.so.
# A line naming a file containers lack would be ignored by ld.so, and the
# containers would run unlimited: a DIR outside $VGPU_HOST_ROOT is refused.
set -eu

MODE=${1:-}
DIR=${2:-}
LIB=${3:-/vgpu/libvgpu.so}
HOST_ROOT=${VGPU_HOST_ROOT:-/host}
INTERVAL=${VGPU_KEEP_INTERVAL:-30}

say() { echo "vgpu-install: $*"; }
die() { echo "vgpu-install: $*" >&2; exit 1; }

[ -n "$MODE" ] && [ -n "$DIR" ] || die "usage: install.sh install|keep|restore DIR [LIB]"
[ -d "$DIR" ] || die "$DIR is not a directory (mount the host's /usr/local/vgpu there)"
BACKUP=$DIR/.vgpu-backup

# The line for ld.so.preload: DIR's path on the host, + /libvgpu.so.
preload_line() {
    root=${HOST_ROOT%/}
    dir=${DIR%/}
    case $dir in
        "$root"/?*) line=${dir#"$root"}/libvgpu.so ;;
        *) die "$DIR is not under VGPU_HOST_ROOT=$HOST_ROOT: the path containers see the library at cannot be told (mount the host's {gpuHookPath}/vgpu at $root{gpuHookPath}/vgpu and pass that)" ;;
    esac
    case $line in
        *[[:space:]]*) die "$line: ld.so.preload cannot name a path with white space" ;;
    esac
    printf '%s\n' "$line"
}

# Atomically makes DST a copy of SRC (a temporary file in DST's directory,
# then rename), keeping the first thing DST replaced in the backup.
put() {
    src=$1 dst=$2
    if [ -f "$dst" ] && cmp -s "$src" "$dst"; then
        return 0
    fi
    mkdir -p "$BACKUP"
    name=$(basename "$dst")
    if [ -f "$dst" ] && [ ! -e "$BACKUP/$name" ]; then
        ln "$dst" "$BACKUP/$name"
    elif [ ! -e "$dst" ] && [ ! -e "$BACKUP/$name" ]; then
        : > "$BACKUP/$name.absent"
    fi
    tmp=$(dirname "$dst")/.$name.vgpu-new.$$
    cp "$src" "$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$dst"
    say "installed $dst"
}

install_once() {
    put "$LIB" "$DIR/libvgpu.so"
    for f in "$DIR"/libvgpu.so.*; do
        [ -f "$f" ] || continue
        case $f in *.vgpu-new.*) continue ;; esac
        put "$LIB" "$f"
    done
    line=$(mktemp)
    printf '%s\n' "$PRELOAD_LINE" > "$line"
    put "$line" "$DIR/ld.so.preload"
    rm -f "$line"
}

restore() {
    [ -d "$BACKUP" ] || { say "nothing to restore in $DIR"; return 0; }
    for b in "$BACKUP"/*; do
        [ -e "$b" ] || continue
        name=$(basename "$b")
        case $name in
            *.absent) rm -f "$DIR/${name%.absent}" "$b"; say "removed $DIR/${name%.absent}" ;;
            *) mv -f "$b" "$DIR/$name"; say "restored $DIR/$name" ;;
        esac
    done
    rmdir "$BACKUP" 2>/dev/null || true
}

case $MODE in
    install|keep)
        [ -f "$LIB" ] || die "$LIB: no library to install"
        PRELOAD_LINE=$(preload_line) || exit 1
        ;;
esac
case $MODE in
    install) install_once ;;
    keep)
        install_once
        # A device plugin that restarts may copy its own library back.
        while sleep "$INTERVAL"; do install_once; done
        ;;
    restore) restore ;;
    *) die "unknown mode $MODE: install, keep or restore" ;;
esac
