#!/usr/bin/env bash
# Builds the deployable bundle, target/dist/libvgpu.so: the preloaded stub
# with the stripped core and its trailer appended (preload/bundle.h), both
# linked against glibc 2.17's symbol versions, so the file loads in every
# image with glibc 2.17 or newer (CentOS 7, UBI 8, Ubuntu 20.04, ...).
# This is the file deploy/ installs; the image (deploy/image/Dockerfile)
# runs this script.
#
# Needs cargo, python3 (with venv) and binutils' objcopy/objdump. zig and
# cargo-zigbuild come from PyPI into a venv under target/ (nothing global).
# Fails if the bundle needs any GLIBC_ version above 2.17.
set -eu
cd "$(dirname "$0")/.."
tools=target/dist-tools
if [ ! -x "$tools/bin/cargo-zigbuild" ] || [ ! -x "$tools/bin/python3" ] \
   || ! "$tools/bin/python3" -c 'import ziglang' 2>/dev/null; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q ziglang cargo-zigbuild
fi
# `--tools-only`: just the venv above (CI fetches it while clippy runs).
[ "${1:-}" = --tools-only ] && exit 0
# cargo-zigbuild finds zig as `python3 -m ziglang` of the venv.
export PATH="$PWD/$tools/bin:$PATH"
triple=x86_64-unknown-linux-gnu
cargo zigbuild --release -p vgpu -p vgpu-preload --features vgpu/static-unwinder \
  --target "$triple.2.17"
built="target/$triple/release"
mkdir -p target/dist
# Without debug sections: each CUDA process copies the core into a memfd.
objcopy --strip-debug "$built/libvgpu_core.so" target/dist/libvgpu_core.stripped.so
objcopy --strip-debug "$built/libvgpu.so" target/dist/libvgpu.stub.so
# (The debug build: the one the tests share.)
cargo run --quiet -p vgpu-preload --bin vgpu-bundle -- \
  target/dist/libvgpu.stub.so target/dist/libvgpu_core.stripped.so target/dist/libvgpu.so
rm -f target/dist/libvgpu_core.stripped.so target/dist/libvgpu.stub.so
# The floor: no symbol version above GLIBC_2.17 (objdump reads the stub's
# dynamic symbols; the core's follow it in the same file, so check both
# images as built).
for f in "$built/libvgpu.so" "$built/libvgpu_core.so"; do
  over=$(objdump -T "$f" | grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV \
    | awk -F'[_.]' '$2 > 2 || ($2 == 2 && $3 > 17)')
  if [ -n "$over" ]; then
    echo "deploy/build.sh: $f needs $over (the floor is GLIBC_2.17)" >&2
    exit 1
  fi
done
echo "target/dist/libvgpu.so: $(stat -c %s target/dist/libvgpu.so) bytes, glibc >= 2.17"
