/* A hostile neighbour on the oversubscription board (issue 26): what any
 * container that can open the node's board file can do to it, written with
 * nothing but the file (no vgpu code). The layout is src/shm/board.rs's,
 * version 2: a 4096-byte header, then 256 entries of 256 bytes; an entry
 * is live while some process holds a record lock on byte BOARD_SIZE + i,
 * and the node's restore lock is byte BOARD_SIZE + 256.
 *
 *   hostile_board figure DIR SECS [FREE]   one live entry, running on the
 *       victim's card, publishing FREE bytes free (default 100 GiB), read
 *       "an hour from now", refreshed every 10 ms
 *   hostile_board want DIR SECS [BYTES]    one live entry, running, waiting
 *       for BYTES (default 1 MiB) on the victim's card
 *   hostile_board locks DIR SECS           every free entry's lock and the
 *       restore lock
 *   hostile_board ahead DIR SECS           one live entry, restoring, waiting
 *       for 1 MiB on the victim's card since boot at high priority: first
 *       in the line of turns for ever
 *
 * The victim's card is the first card any entry of the board names. Prints
 * "hostile_ready=1 entries=N" once in place, then holds for SECS seconds.
 * Exit 2: no board, or no card on it, within 20 s. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define HEADER 4096
#define ENTRIES 256
#define ENTRY 256
#define BOARD_SIZE (HEADER + ENTRIES * ENTRY)
#define RUNNING 1

/* Offsets inside an entry (board.rs BoardEntry, repr(C)). */
#define OFF_PID 0
#define OFF_STATE 4
#define OFF_CARDS 8         /* [4][2] u64 */
#define OFF_BYTES 72        /* [4] u64 */
#define OFF_WANT_BYTES 112
#define OFF_WANT_CARD 120   /* [2] u64 */
#define OFF_LAST_ACTIVE 136
#define OFF_SINCE 144
#define OFF_FREE_SEEN 184   /* [4] u64 (layout 2 before issue 26) */
#define OFF_FREE_SEEN_NS 216 /* [4] u64 (idem) */
#define OFF_WANT_SINCE 184
#define OFF_PRIORITY 192    /* u32 */

static uint8_t *board;
static int fd;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static volatile uint64_t *u64_at(int i, int off) { return (volatile uint64_t *)(board + HEADER + i * ENTRY + off); }
static volatile uint32_t *u32_at(int i, int off) { return (volatile uint32_t *)(board + HEADER + i * ENTRY + off); }

static int lock_byte(long at) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = at, .l_len = 1};
    return fcntl(fd, F_SETLK, &fl) == 0;
}

/* The victim's card: the first one any entry names. */
static int victim_card(uint64_t card[2]) {
    for (int i = 0; i < ENTRIES; i++)
        for (int c = 0; c < 4; c++) {
            uint64_t a = *u64_at(i, OFF_CARDS + c * 16), b = *u64_at(i, OFF_CARDS + c * 16 + 8);
            if (a || b) {
                card[0] = a;
                card[1] = b;
                return 1;
            }
        }
    return 0;
}

/* Takes the first free entry, live from now on. */
static int take_entry(void) {
    for (int i = 0; i < ENTRIES; i++)
        if (lock_byte(BOARD_SIZE + i)) return i;
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: hostile_board figure|want|locks DIR SECS [N]\n");
        return 1;
    }
    const char *mode = argv[1];
    double secs = atof(argv[3]);
    char path[4096];
    snprintf(path, sizeof path, "%s/vgpu-oversub.board", argv[2]);
    uint64_t card[2] = {0, 0};
    for (int tries = 0;; tries++) {
        fd = open(path, O_RDWR | O_CLOEXEC);
        if (fd >= 0 && lseek(fd, 0, SEEK_END) >= BOARD_SIZE) {
            board = mmap(NULL, BOARD_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (board != MAP_FAILED && (!strcmp(mode, "locks") || victim_card(card))) break;
            munmap(board, BOARD_SIZE);
        }
        if (fd >= 0) close(fd);
        if (tries > 2000) {
            printf("hostile_ready=0\n");
            return 2;
        }
        usleep(10000);
    }
    int taken = 0;
    uint64_t until = now_ns() + (uint64_t)(secs * 1e9);
    if (!strcmp(mode, "locks")) {
        /* Each byte once: a process's own lock is never in its way. */
        for (int i = 0; i < ENTRIES; i++) taken += lock_byte(BOARD_SIZE + i);
        taken += lock_byte(BOARD_SIZE + ENTRIES);
        printf("hostile_ready=1 entries=%d\n", taken);
        fflush(stdout);
        while (now_ns() < until) usleep(10000);
        return 0;
    }
    int i = take_entry();
    if (i < 0) return 2;
    *u32_at(i, OFF_PID) = getpid();
    *u64_at(i, OFF_CARDS) = card[0];
    *u64_at(i, OFF_CARDS + 8) = card[1];
    *u64_at(i, OFF_BYTES) = 1;
    *u64_at(i, OFF_LAST_ACTIVE) = now_ns();
    *u64_at(i, OFF_SINCE) = now_ns();
    if (!strcmp(mode, "want") || !strcmp(mode, "ahead")) {
        uint64_t bytes = argc > 4 ? strtoull(argv[4], 0, 0) : (1ull << 20);
        *u64_at(i, OFF_WANT_CARD) = card[0];
        *u64_at(i, OFF_WANT_CARD + 8) = card[1];
        *u64_at(i, OFF_WANT_BYTES) = bytes;
    }
    if (!strcmp(mode, "ahead")) {
        *u64_at(i, OFF_BYTES) = 0;
        *u64_at(i, OFF_WANT_SINCE) = 1;
        *u32_at(i, OFF_PRIORITY) = 0;
        *u32_at(i, OFF_STATE) = 4; /* Restoring */
    } else if (!strcmp(mode, "claim")) {
        /* A restore "in flight" of 64 GiB that never lands. */
        *u64_at(i, OFF_BYTES) = 64ull << 30;
        *u32_at(i, OFF_STATE) = 4; /* Restoring */
    } else {
        *u32_at(i, OFF_STATE) = RUNNING;
    }
    printf("hostile_ready=1 entries=1 entry=%d\n", i);
    fflush(stdout);
    uint64_t free_bytes = argc > 4 ? strtoull(argv[4], 0, 0) : (100ull << 30);
    while (now_ns() < until) {
        if (!strcmp(mode, "figure")) {
            /* Read "an hour from now": always the newest, always fresh. */
            *u64_at(i, OFF_FREE_SEEN) = free_bytes;
            *u64_at(i, OFF_FREE_SEEN_NS) = now_ns() + 3600ull * 1000000000ull;
        }
        if (!strcmp(mode, "claim")) {
            /* A new pid every second: a bound kept per pid starts anew. */
            static uint64_t next;
            static uint32_t fake = 100000;
            if (now_ns() > next) {
                *u32_at(i, OFF_PID) = fake++;
                next = now_ns() + 1000000000ull;
            }
        }
        *u64_at(i, OFF_LAST_ACTIVE) = now_ns();
        usleep(10000);
    }
    return 0;
}
