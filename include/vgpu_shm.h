/* The layout of vgpu's part of a region file (src/shm/layout.rs), for
 * tools that read it from C. Every field is accessed atomically by vgpu:
 * read with __atomic_load_n(&field, __ATOMIC_ACQUIRE), never write.
 *
 * A region file (layout 2.x) is HAMi's layout 1.2 (include/hami_region.h,
 * what node monitors read), then, at VGPU_SHM_OFFSET, one vgpu_shm_header
 * (which holds the device table) followed by VGPU_SHM_MAX_SLOTS process
 * slots; VGPU_SHM_FILE_SIZE bytes in all. Layout 1.x (vgpu before issue
 * 11) had this part alone at offset 0. Check magic, version_major and size
 * before use: a reader must refuse a major version it does not know.
 */
#ifndef VGPU_SHM_H
#define VGPU_SHM_H

#include <stdint.h>

#define VGPU_SHM_MAGIC 0x004d485355504756ULL /* "VGPUSHM\0", little-endian */
#define VGPU_SHM_VERSION_MAJOR 2u
#define VGPU_SHM_VERSION_MINOR 10u
#define VGPU_SHM_OFFSET 2011136 /* where vgpu's part starts: HAMi's size, page-aligned */
#define VGPU_SHM_MAX_DEVICES 16
#define VGPU_SHM_MAX_SLOTS 1024
#define VGPU_SHM_NUM_KINDS 5
#define VGPU_SHM_STATE_READY 1u
#define VGPU_SHM_SLOT_HOST_PID_VERIFIED 1u /* vgpu_shm_slot.flags */

/* Index into vgpu_shm_slot.usage[dev][kind]. */
enum vgpu_shm_kind {
    VGPU_SHM_KIND_BUFFER = 0,  /* cuMemAlloc, pitch, managed */
    VGPU_SHM_KIND_ARRAY = 1,   /* CUDA arrays, mipmapped arrays */
    VGPU_SHM_KIND_VMM = 2,     /* cuMemCreate */
    VGPU_SHM_KIND_POOL = 3,    /* stream-ordered allocations */
    VGPU_SHM_KIND_CONTEXT = 4, /* context and library overhead (NVML) */
};

/* One physical GPU, keyed by UUID. */
typedef struct vgpu_shm_device {
    uint8_t uuid[16];           /* as cuDeviceGetUuid returns it */
    uint32_t in_use;            /* 0: free entry */
    uint32_t sm_limit;          /* percent, 0 = unlimited */
    uint64_t mem_limit;         /* bytes, 0 = unlimited */
    uint64_t total_mem;         /* physical bytes */
    uint32_t sm_count;
    uint32_t policy;            /* 0 default, 1 force, 2 disable */
    uint64_t tat_ns;            /* compute bucket: GCRA time, CLOCK_MONOTONIC */
    uint32_t rate_scale_milli;  /* controller's refill scale x1000 */
    uint32_t util_milli;        /* container utilisation x1000 */
    uint64_t leader;            /* pid << 32 | heartbeat seconds */
    uint64_t waits;             /* launches that waited on the bucket */
    uint64_t context_bytes;     /* a new context's cost, last measured */
    uint32_t hami_index;        /* index in the HAMi part + 1; 0: none yet (2.0) */
    uint32_t pad;
    uint64_t hami_limit_seen;   /* limit vgpu last wrote into the HAMi part (2.0) */
    uint64_t hami_sm_seen;      /* sm_limit vgpu last wrote there (2.0) */
    uint64_t oom_denials;       /* requests refused with CUDA_ERROR_OUT_OF_MEMORY (2.0) */
    uint64_t wait_ns;           /* ns launches waited for the bucket (2.0) */
    uint64_t turn_anchor_ns;    /* CLOCK_MONOTONIC start of the turns, 0 none (2.1) */
    uint64_t turn_moved_ns;     /* when the turns last moved (2.1) */
    uint64_t turn_cut_ns;       /* ns of each period's share left unspent (2.1) */
    uint64_t admitted_ns;       /* GPU ns the bucket admitted, ever (2.1) */
    uint64_t turn_flags;        /* 1: turns paused (several processes use it) (2.1); 2: windows placed from the SM board */
    uint64_t turn_fill_milli;   /* cost over span of its clean windows, x1000; 0 unknown (2.2) */
    uint64_t turn_shared_ns;    /* when a probe last ran beside another context, 0 never (2.2) */
    uint64_t held_ns;           /* GPU ns admitted launches typically hold, ever (2.3) */
    uint64_t alone_ns;          /* when the leader last saw no other container on it, 0 none (2.4) */
    uint64_t paced_ns;          /* when the leader last found the limits on the device leaving room to pace beside others, 0 none (2.5) */
    uint64_t sync_wait_ns;      /* ns its processes waited in synchronisations under an SM limit (2.5) */
    uint64_t rest_percent;      /* without an SM limit: the share it takes beside busy limited containers, 0 free (2.6) */
    uint64_t syncs;             /* synchronisations its processes made under an SM limit (2.7) */
    uint64_t rest_beside_ns;    /* when the leader last found only containers taking the rest beside it, 0 not (2.7) */
    uint64_t limited_beside_ns; /* when the leader last found a busy container with an SM limit beside it, 0 not (2.8) */
    uint64_t turn_period_ns;    /* the period of its turns on the device, as its leader chose it from the SM board, 0 the configured one (2.9) */
} vgpu_shm_device;

/* One process of the container; pid 0 marks a free slot. */
typedef struct vgpu_shm_slot {
    int32_t pid;
    int32_t host_pid;           /* the pid NVML reports; 0 while unknown */
    uint64_t start_time;        /* field 22 of /proc/<pid>/stat */
    uint64_t pidns;             /* inode of /proc/<pid>/ns/pid */
    uint64_t claimed_unix_s;
    uint32_t sm_util[VGPU_SHM_MAX_DEVICES];
    uint64_t usage[VGPU_SHM_MAX_DEVICES][VGPU_SHM_NUM_KINDS]; /* bytes */
    uint64_t dead_since_ms;     /* CLOCK_MONOTONIC ms a reclaim found it dead */
    uint64_t heartbeat_ms;      /* CLOCK_MONOTONIC ms of the owner's last tick (1.1) */
    uint32_t flags;             /* VGPU_SHM_SLOT_HOST_PID_VERIFIED (1.1) */
    uint32_t pad;
    uint64_t nvml_used[VGPU_SHM_MAX_DEVICES]; /* NVML's used memory per device (2.0) */
    uint64_t gap_device;        /* device entry + 1 whose host gaps the process counts, 0 none yet (2.10) */
    uint64_t host_gap_ns;       /* ns from a synchronisation's return to the next launch, under an SM limit (2.10) */
    uint64_t reserved[15];
} vgpu_shm_slot;

typedef struct vgpu_shm_header {
    uint64_t magic;
    uint32_t version_major;
    uint32_t version_minor;
    uint64_t size;              /* bytes of the whole file */
    uint32_t header_size;
    uint32_t slot_size;
    uint32_t max_devices;
    uint32_t max_slots;
    uint32_t state;             /* VGPU_SHM_STATE_READY once initialised */
    uint32_t slot_hwm;          /* one past the highest slot ever claimed */
    uint64_t created_unix_s;
    uint64_t reclaims;
    uint64_t boot_id[2];        /* /proc/sys/kernel/random/boot_id, as 16 bytes (1.1) */
    uint64_t region_id;         /* random, new at each initialisation (1.1) */
    uint64_t hami_writer;       /* pid << 32 | heartbeat s of the HAMi part's writer (2.0) */
    uint64_t origin;            /* 0 new, 1 upgraded from vgpu 1.x, 2 adopted from HAMi-core (2.0) */
    uint64_t reserved[3];
    vgpu_shm_device devices[VGPU_SHM_MAX_DEVICES];
} vgpu_shm_header;

/* Bytes of vgpu's part, and of a whole region file. */
#define VGPU_SHM_PART_SIZE (sizeof(vgpu_shm_header) + VGPU_SHM_MAX_SLOTS * sizeof(vgpu_shm_slot))
#define VGPU_SHM_FILE_SIZE (VGPU_SHM_OFFSET + VGPU_SHM_PART_SIZE)

#endif
