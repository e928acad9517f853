/* Prints the layout of include/vgpu_shm.h, and reads a region file
 * through it: tests/shm_layout.rs compares both with the Rust side. */
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../include/vgpu_shm.h"

#define F(t, f) printf("%s.%s=%zu\n", #t, #f, offsetof(t, f))

int main(int argc, char **argv) {
    printf("magic=%llu\n", (unsigned long long)VGPU_SHM_MAGIC);
    printf("sizeof.header=%zu sizeof.device=%zu sizeof.slot=%zu part=%zu file=%zu offset=%zu\n",
           sizeof(vgpu_shm_header), sizeof(vgpu_shm_device), sizeof(vgpu_shm_slot), (size_t)VGPU_SHM_PART_SIZE,
           (size_t)VGPU_SHM_FILE_SIZE, (size_t)VGPU_SHM_OFFSET);
    F(vgpu_shm_header, version_major); F(vgpu_shm_header, size); F(vgpu_shm_header, header_size);
    F(vgpu_shm_header, state); F(vgpu_shm_header, slot_hwm); F(vgpu_shm_header, created_unix_s);
    F(vgpu_shm_header, reclaims); F(vgpu_shm_header, boot_id); F(vgpu_shm_header, region_id);
    F(vgpu_shm_header, hami_writer); F(vgpu_shm_header, origin); F(vgpu_shm_header, devices);
    F(vgpu_shm_device, in_use); F(vgpu_shm_device, sm_limit); F(vgpu_shm_device, mem_limit);
    F(vgpu_shm_device, total_mem); F(vgpu_shm_device, sm_count); F(vgpu_shm_device, policy);
    F(vgpu_shm_device, tat_ns); F(vgpu_shm_device, rate_scale_milli); F(vgpu_shm_device, util_milli);
    F(vgpu_shm_device, leader); F(vgpu_shm_device, waits); F(vgpu_shm_device, context_bytes);
    F(vgpu_shm_device, hami_index); F(vgpu_shm_device, hami_limit_seen); F(vgpu_shm_device, hami_sm_seen);
    F(vgpu_shm_device, oom_denials); F(vgpu_shm_device, wait_ns);
    F(vgpu_shm_device, turn_anchor_ns); F(vgpu_shm_device, turn_moved_ns); F(vgpu_shm_device, turn_cut_ns);
    F(vgpu_shm_device, admitted_ns); F(vgpu_shm_device, turn_flags); F(vgpu_shm_device, turn_fill_milli);
    F(vgpu_shm_device, turn_shared_ns);
    F(vgpu_shm_device, held_ns);
    F(vgpu_shm_device, alone_ns);
    F(vgpu_shm_device, paced_ns);
    F(vgpu_shm_device, sync_wait_ns);
    F(vgpu_shm_device, rest_percent);
    F(vgpu_shm_device, syncs);
    F(vgpu_shm_device, rest_beside_ns);
    F(vgpu_shm_device, limited_beside_ns);
    F(vgpu_shm_device, turn_period_ns);
    F(vgpu_shm_slot, host_pid); F(vgpu_shm_slot, start_time); F(vgpu_shm_slot, pidns);
    F(vgpu_shm_slot, claimed_unix_s); F(vgpu_shm_slot, sm_util); F(vgpu_shm_slot, usage);
    F(vgpu_shm_slot, dead_since_ms); F(vgpu_shm_slot, heartbeat_ms); F(vgpu_shm_slot, flags);
    F(vgpu_shm_slot, nvml_used);
    F(vgpu_shm_slot, gap_device);
    F(vgpu_shm_slot, host_gap_ns);
    if (argc < 2) return 0;
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) return 2;
    const char *file = mmap(NULL, VGPU_SHM_FILE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
    if (file == MAP_FAILED) return 3;
    const vgpu_shm_header *h = (const vgpu_shm_header *)(file + VGPU_SHM_OFFSET);
    if (h->magic != VGPU_SHM_MAGIC || h->version_major != VGPU_SHM_VERSION_MAJOR) return 3;
    const vgpu_shm_slot *slots = (const vgpu_shm_slot *)(h + 1);
    printf("read.mem_limit=%llu read.sm_limit=%u read.uuid0=%u\n", (unsigned long long)h->devices[0].mem_limit,
           h->devices[0].sm_limit, h->devices[0].uuid[0]);
    for (unsigned i = 0; i < h->slot_hwm; i++)
        if (slots[i].pid)
            printf("read.slot%u.pid=%d read.slot%u.vmm=%llu\n", i, slots[i].pid, i,
                   (unsigned long long)slots[i].usage[0][VGPU_SHM_KIND_VMM]);
    return 0;
}
