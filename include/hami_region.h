/* HAMi's region layout 1.2 (shared_region_t of HAMi-core), as vgpu writes
 * it at the start of every region file: what the node monitors of HAMi,
 * Volcano and KAI read. Rust side: src/shm/hami/layout.rs; the two are
 * compared by tests/hami.rs. x86-64, little-endian.
 *
 * A reader checks initialized_flag == HAMI_REGION_MAGIC, major_version ==
 * 1 and a file size >= HAMI_REGION_SIZE, then reads procs[0 .. proc_num).
 * Read every field with __atomic_load_n(&field, __ATOMIC_ACQUIRE): the
 * container's processes write them while you read. A slot is whole when
 * its seqlock is even and the same before and after the read.
 *
 * A vgpu region file goes on after this layout: vgpu's own part
 * (include/vgpu_shm.h) starts at VGPU_SHM_OFFSET, with its magic
 * "VGPUSHM\0". A HAMi-core file has no such part.
 *
 * What a monitor may write: recent_kernel (-1 blocks the container's
 * launches until it is set to 0 again), utilization_switch (0: the SM
 * limit need not apply under GPU_CORE_UTILIZATION_POLICY=default), and
 * limit / sm_limit (taken by vgpu as the container's limits within a
 * second). Everything else is vgpu's.
 */
#ifndef HAMI_REGION_H
#define HAMI_REGION_H

#include <stdint.h>

#define HAMI_REGION_MAGIC 19920718
#define HAMI_REGION_MAJOR 1u
#define HAMI_REGION_MINOR 2u
#define HAMI_REGION_DEVICES 16
#define HAMI_REGION_PROCS 1024
#define HAMI_REGION_UUID_LEN 96
#define HAMI_REGION_SIZE 2008952 /* sizeof(hami_region) */
#define HAMI_STATUS_RUNNING 1

/* One device's bytes in one process (device_memory_t). */
typedef struct hami_used {
    uint64_t context_size; /* the process's context estimate */
    uint64_t module_size;  /* 0 */
    uint64_t data_size;    /* allocations */
    uint64_t offset;       /* 0 */
    uint64_t total;        /* context_size + data_size */
    uint64_t unused[3];
} hami_used;

/* One device's utilisation by one process (device_util_t). */
typedef struct hami_util {
    uint64_t dec_util;
    uint64_t enc_util;
    uint64_t sm_util; /* NVML SM utilisation, percent 0-100 */
    uint64_t unused[3];
} hami_util;

/* One process (shrreg_proc_slot_t). */
typedef struct hami_proc {
    int32_t pid;     /* as seen in the container; 0: free */
    int32_t hostpid; /* as NVML sees it; 0 while unknown */
    hami_used used[HAMI_REGION_DEVICES];
    uint64_t monitorused[HAMI_REGION_DEVICES]; /* NVML per-process used memory */
    hami_util device_util[HAMI_REGION_DEVICES];
    int32_t status; /* 1 running */
    int32_t pad;
    uint64_t seqlock; /* odd while being written */
    uint64_t unused[2];
} hami_proc;

/* The region (shared_region_t). Device index d of uuids, limit, sm_limit,
 * used and device_util is the device's number in the container (its place
 * in NVIDIA_VISIBLE_DEVICES, else its NVML index). */
typedef struct hami_region {
    int32_t initialized_flag; /* HAMI_REGION_MAGIC */
    uint32_t major_version;
    uint32_t minor_version;
    int32_t sm_init_flag;
    uint64_t owner_pid;
    unsigned char sem[32]; /* sem_t */
    uint64_t device_num;
    char uuids[HAMI_REGION_DEVICES][HAMI_REGION_UUID_LEN]; /* "GPU-...", NUL-terminated */
    uint64_t limit[HAMI_REGION_DEVICES];    /* bytes, 0: none */
    uint64_t sm_limit[HAMI_REGION_DEVICES]; /* percent, 0 or 100: none */
    hami_proc procs[HAMI_REGION_PROCS];
    int32_t proc_num; /* procs[0 .. proc_num) are live processes */
    int32_t utilization_switch;
    int32_t recent_kernel; /* 2 after a launch; -1: blocked by the monitor */
    int32_t priority;      /* CUDA_TASK_PRIORITY: 0 high, 1 normal */
    uint64_t last_kernel_time; /* Unix seconds of the last launch */
    unsigned char sem_postinit[32];
} hami_region;

#endif
