/* The bundle: libvgpu.so (the stub) with the core appended, then a
 * trailer of 24 bytes (the format preload/src/lib.rs writes):
 *
 *   [stub ELF image][core ELF image][core length: u64 LE][checksum: u64 LE]["VGPUCOR1"]
 *
 * The checksum is vgpu_checksum() of the core's bytes. */
#ifndef VGPU_BUNDLE_H
#define VGPU_BUNDLE_H

#include <stddef.h>
#include <stdint.h>

#define VGPU_TRAILER_MAGIC "VGPUCOR1"
#define VGPU_TRAILER_SIZE 24

#define VGPU_HIDDEN __attribute__((visibility("hidden")))

VGPU_HIDDEN uint64_t vgpu_checksum(const unsigned char *p, size_t n);

/* A sealed private copy (memfd, else O_TMPFILE) of the core appended to
 * the file `path`, checked against its trailer and its program headers;
 * -1 if there is none, with `why` empty when nothing follows the stub,
 * else the reason in words. */
VGPU_HIDDEN int vgpu_bundle_core(const char *path, char *why, size_t why_len);

#endif
