/* Reading the core out of the bundle (bundle.h has the format).
 *
 * A damaged bundle must fail closed, never crash: a core cut short and
 * handed to dlopen makes ld.so map pages past the end of the file and
 * die of SIGBUS at the first CUDA call (issue 26, finding 5). So the core
 * is copied into a sealed private file first (nobody can shrink it
 * under us), and only a copy whose length and checksum match the trailer
 * and whose program headers lie within it goes to dlopen. Everything
 * here runs once per CUDA process. */
#define _GNU_SOURCE
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "bundle.h"

#define M 0x9e3779b97f4a7c15ull

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/* Four independent lanes over 8-byte words (about a byte per cycle
 * would be too slow; this is several), the last partial block padded
 * with zeros, the length folded in. Not cryptographic: it catches a cut
 * or damaged copy, not a forger (who could write the whole file). */
uint64_t vgpu_checksum(const unsigned char *p, size_t n) {
    uint64_t h[4] = {1, 2, 3, 4};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int l = 0; l < 4; l++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * l, 8);
            h[l] = rotl(h[l] ^ w, 31) * M;
        }
    if (i < n) {
        unsigned char tail[32] = {0};
        memcpy(tail, p + i, n - i);
        for (int l = 0; l < 4; l++) {
            uint64_t w;
            memcpy(&w, tail + 8 * l, 8);
            h[l] = rotl(h[l] ^ w, 31) * M;
        }
    }
    uint64_t r = (uint64_t)n;
    for (int l = 0; l < 4; l++) r = rotl(r ^ h[l], 31) * M;
    return r ^ (r >> 29);
}

/* Whether the ELF image p[0..n) holds its own program headers and every
 * segment's file bytes. */
static int fits(const unsigned char *p, uint64_t n) {
    const ElfW(Ehdr) *eh = (const void *)p;
    if (n < sizeof *eh || memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_phentsize != sizeof(ElfW(Phdr)))
        return 0;
    if (eh->e_phoff > n || (uint64_t)eh->e_phnum * sizeof(ElfW(Phdr)) > n - eh->e_phoff) return 0;
    const ElfW(Phdr) *ph = (const void *)(p + eh->e_phoff);
    for (unsigned i = 0; i < eh->e_phnum; i++)
        if (ph[i].p_offset > n || ph[i].p_filesz > n - ph[i].p_offset) return 0;
    return 1;
}

/* A file of our own: a memfd, else an unnamed O_TMPFILE (memfd_create
 * blocked, or vm.memfd_noexec set); -1 if none. */
static int private_file(char *why, size_t why_len) {
    int fd = (int)syscall(SYS_memfd_create, "libvgpu_core.so", 3u /* MFD_CLOEXEC | MFD_ALLOW_SEALING */);
    if (fd >= 0) return fd;
    int e = errno;
    const char *dirs[] = {"/tmp", "/dev/shm", "/var/tmp"};
    for (unsigned i = 0; i < sizeof dirs / sizeof *dirs && fd < 0; i++)
        fd = open(dirs[i], O_TMPFILE | O_RDWR | O_CLOEXEC, 0700);
    if (fd < 0) snprintf(why, why_len, "memfd_create for the appended core: %s", strerror(e));
    return fd;
}

/* Copies n bytes at `off` of fd into a new private file, sealed; -1 and
 * why on failure. */
static int copy_out(int fd, off_t off, uint64_t n, char *why, size_t why_len) {
    int mfd = private_file(why, why_len);
    if (mfd < 0) return -1;
    uint64_t left = n;
    while (left > 0) {
        ssize_t k = sendfile(mfd, fd, &off, left > (1u << 30) ? (1u << 30) : (size_t)left);
        if (k <= 0) {
            snprintf(why, why_len, "copying the appended core out of the bundle: %s",
                     k < 0 ? strerror(errno) : "the file got shorter");
            close(mfd);
            return -1;
        }
        left -= (uint64_t)k;
    }
    /* Sealed (a memfd; an O_TMPFILE refuses, harmlessly): neither a
     * stray write of the program to a reused descriptor number nor a
     * truncation can change the core's pages. */
    (void)fcntl(mfd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    return mfd;
}

/* Whether the copy in mfd (n bytes) matches `sum` and its headers. */
static int check(int mfd, uint64_t n, uint64_t sum, char *why, size_t why_len) {
    void *p = mmap(NULL, (size_t)n, PROT_READ, MAP_PRIVATE | MAP_POPULATE, mfd, 0);
    if (p == MAP_FAILED) {
        snprintf(why, why_len, "mapping the appended core to check it: %s", strerror(errno));
        return 0;
    }
    int ok = 0;
    if (vgpu_checksum(p, (size_t)n) != sum)
        snprintf(why, why_len, "the appended core's checksum does not match its trailer (a damaged bundle)");
    else if (!fits(p, n))
        snprintf(why, why_len, "the appended core's program headers reach past its %llu bytes (a damaged bundle)",
                 (unsigned long long)n);
    else
        ok = 1;
    munmap(p, (size_t)n);
    return ok;
}

int vgpu_bundle_core(const char *path, char *why, size_t why_len) {
    why[0] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_len, "cannot open %s to read the appended core: %s", path, strerror(errno));
        return -1;
    }
    ElfW(Ehdr) eh;
    struct stat st;
    unsigned char t[VGPU_TRAILER_SIZE];
    int mfd = -1;
    if (pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh || fstat(fd, &st) != 0) {
        snprintf(why, why_len, "cannot read %s: %s", path, strerror(errno));
        goto out;
    }
    /* The section headers end the stub's ELF image (GNU ld, lld); a
     * core, if any, follows them. */
    uint64_t size = (uint64_t)st.st_size;
    uint64_t end = eh.e_shoff + (uint64_t)eh.e_shnum * eh.e_shentsize;
    if (eh.e_shoff == 0 || end >= size) goto out; /* nothing appended */
    uint64_t room = size - end;
    if (room < VGPU_TRAILER_SIZE + sizeof eh ||
        pread(fd, t, sizeof t, (off_t)(size - sizeof t)) != (ssize_t)sizeof t ||
        memcmp(t + 16, VGPU_TRAILER_MAGIC, 8) != 0) {
        snprintf(why, why_len,
                 "%llu bytes follow the stub without a vgpu trailer (a truncated or damaged bundle, or one not "
                 "made by deploy/build.sh)",
                 (unsigned long long)room);
        goto out;
    }
    uint64_t n, sum;
    memcpy(&n, t, 8);
    memcpy(&sum, t + 8, 8);
    if (n < sizeof eh || n > room - VGPU_TRAILER_SIZE) {
        snprintf(why, why_len, "the trailer names a core of %llu bytes, %llu are there (a damaged bundle)",
                 (unsigned long long)n, (unsigned long long)(room - VGPU_TRAILER_SIZE));
        goto out;
    }
    mfd = copy_out(fd, (off_t)(size - VGPU_TRAILER_SIZE - n), n, why, why_len);
    if (mfd >= 0 && !check(mfd, n, sum, why, why_len)) {
        close(mfd);
        mfd = -1;
    }
    if (mfd >= 0) {
        /* Kept above the low numbers a program that closed its standard
         * streams would hand out again. */
        int high = fcntl(mfd, F_DUPFD_CLOEXEC, 100);
        if (high >= 0) {
            close(mfd);
            mfd = high;
        }
    }
out:
    close(fd);
    return mfd;
}
