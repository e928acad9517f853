/* A node monitor's view of a region, built from include/hami_region.h
 * alone: what HAMi's vGPUmonitor reads, and what its feedback loop writes.
 * tests/hami.rs compares what it prints with vgpu's own view; the GPU
 * scenario `hami` runs it beside PyTorch.
 *
 *   hami_reader                       the layout: sizes and offsets
 *   hami_reader PATH                  read the region once (key=value)
 *   hami_reader PATH watch MS N       read it N times, MS ms apart, one line each
 *   hami_reader PATH set FIELD VALUE  write recent_kernel, utilization_switch,
 *                                     limit.D or sm_limit.D, as a monitor does
 *   hami_reader PATH hold SECONDS     map it and sleep (a process that uses it)
 *
 * Exit 3: not a region of HAMi's layout 1.2 (magic, major version, size).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../include/hami_region.h"

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define F(t, f) printf("%s.%s=%zu\n", #t, #f, offsetof(t, f))

static void layout(void) {
    printf("sizeof.region=%zu sizeof.proc=%zu sizeof.used=%zu sizeof.util=%zu\n", sizeof(hami_region),
           sizeof(hami_proc), sizeof(hami_used), sizeof(hami_util));
    F(hami_region, sem); F(hami_region, device_num); F(hami_region, uuids); F(hami_region, limit);
    F(hami_region, sm_limit); F(hami_region, procs); F(hami_region, proc_num);
    F(hami_region, utilization_switch); F(hami_region, recent_kernel); F(hami_region, priority);
    F(hami_region, last_kernel_time); F(hami_region, sem_postinit);
    F(hami_proc, hostpid); F(hami_proc, used); F(hami_proc, monitorused); F(hami_proc, device_util);
    F(hami_proc, status); F(hami_proc, seqlock);
    F(hami_used, context_size); F(hami_used, data_size); F(hami_used, total); F(hami_util, sm_util);
}

/* One process slot, read under its seqlock (a few tries). */
static void copy_proc(const hami_proc *src, hami_proc *dst) {
    for (int i = 0; i < 100; i++) {
        uint64_t before = LOAD(src->seqlock);
        if (before & 1) continue;
        memcpy(dst, src, sizeof *dst);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (LOAD(src->seqlock) == before) return;
    }
    memcpy(dst, src, sizeof *dst);
}

static void read_once(const hami_region *r) {
    printf("magic=%d version=%u.%u device_num=%llu proc_num=%d utilization_switch=%d recent_kernel=%d "
           "priority=%d last_kernel_time=%llu\n",
           LOAD(r->initialized_flag), r->major_version, r->minor_version,
           (unsigned long long)LOAD(r->device_num), LOAD(r->proc_num), LOAD(r->utilization_switch),
           LOAD(r->recent_kernel), LOAD(r->priority), (unsigned long long)LOAD(r->last_kernel_time));
    for (int d = 0; d < HAMI_REGION_DEVICES; d++) {
        char uuid[HAMI_REGION_UUID_LEN + 1] = {0};
        memcpy(uuid, r->uuids[d], HAMI_REGION_UUID_LEN);
        if (!uuid[0]) continue;
        printf("dev%d.uuid=%s dev%d.limit=%llu dev%d.sm_limit=%llu\n", d, uuid, d,
               (unsigned long long)LOAD(r->limit[d]), d, (unsigned long long)LOAD(r->sm_limit[d]));
    }
    int n = LOAD(r->proc_num);
    if (n < 0) n = 0;
    if (n > HAMI_REGION_PROCS) n = HAMI_REGION_PROCS;
    for (int k = 0; k < n; k++) {
        hami_proc p;
        copy_proc(&r->procs[k], &p);
        printf("proc%d.pid=%d proc%d.hostpid=%d proc%d.status=%d", k, p.pid, k, p.hostpid, k, p.status);
        for (int d = 0; d < HAMI_REGION_DEVICES; d++) {
            if (!r->uuids[d][0]) continue;
            printf(" proc%d.dev%d.total=%llu proc%d.dev%d.context=%llu proc%d.dev%d.data=%llu "
                   "proc%d.dev%d.monitorused=%llu proc%d.dev%d.sm_util=%llu",
                   k, d, (unsigned long long)p.used[d].total, k, d, (unsigned long long)p.used[d].context_size,
                   k, d, (unsigned long long)p.used[d].data_size, k, d, (unsigned long long)p.monitorused[d], k,
                   d, (unsigned long long)p.device_util[d].sm_util);
        }
        printf("\n");
    }
}

/* The container's figures on one line: what a monitor exports per device,
 * summed as HAMi's vGPUmonitor sums them (procs[0..proc_num), status != 0). */
static void summary(const hami_region *r, double t) {
    printf("t=%.3f recent_kernel=%d proc_num=%d", t, LOAD(r->recent_kernel), LOAD(r->proc_num));
    int n = LOAD(r->proc_num);
    if (n < 0) n = 0;
    if (n > HAMI_REGION_PROCS) n = HAMI_REGION_PROCS;
    for (int d = 0; d < HAMI_REGION_DEVICES; d++) {
        if (!r->uuids[d][0]) continue;
        unsigned long long used = 0, monitor = 0, sm = 0;
        for (int k = 0; k < n; k++) {
            hami_proc p;
            copy_proc(&r->procs[k], &p);
            /* HAMi's monitor skips a slot whose status is 0 (its v1 spec). */
            if (p.status == 0) continue;
            used += p.used[d].total;
            monitor += p.monitorused[d];
            sm += p.device_util[d].sm_util;
        }
        printf(" dev%d.used=%llu dev%d.monitorused=%llu dev%d.sm_util=%llu dev%d.limit=%llu", d, used, d,
               monitor, d, sm, d, (unsigned long long)LOAD(r->limit[d]));
    }
    printf(" last_kernel_time=%llu\n", (unsigned long long)LOAD(r->last_kernel_time));
    fflush(stdout);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        layout();
        return 0;
    }
    int writing = argc > 2 && !strcmp(argv[2], "set");
    int fd = open(argv[1], writing ? O_RDWR : O_RDONLY);
    if (fd < 0) return 2;
    struct stat st;
    if (fstat(fd, &st) || st.st_size < (off_t)sizeof(hami_region)) return 3;
    hami_region *r = mmap(NULL, sizeof(hami_region), PROT_READ | (writing ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
    if (r == MAP_FAILED) return 3;
    if (LOAD(r->initialized_flag) != HAMI_REGION_MAGIC || r->major_version != HAMI_REGION_MAJOR) return 3;
    if (argc == 2) {
        read_once(r);
        return 0;
    }
    if (!strcmp(argv[2], "watch") && argc == 5) {
        double t0 = now_s();
        int ms = atoi(argv[3]), n = atoi(argv[4]);
        for (int i = 0; i < n; i++) {
            summary(r, now_s() - t0);
            usleep(ms * 1000);
        }
        return 0;
    }
    if (writing && argc == 5) {
        const char *f = argv[3];
        long long v = atoll(argv[4]);
        int d = -1;
        if (!strcmp(f, "recent_kernel")) __atomic_store_n(&r->recent_kernel, (int32_t)v, __ATOMIC_RELEASE);
        else if (!strcmp(f, "utilization_switch"))
            __atomic_store_n(&r->utilization_switch, (int32_t)v, __ATOMIC_RELEASE);
        else if (sscanf(f, "limit.%d", &d) == 1 && d >= 0 && d < HAMI_REGION_DEVICES)
            __atomic_store_n(&r->limit[d], (uint64_t)v, __ATOMIC_RELEASE);
        else if (sscanf(f, "sm_limit.%d", &d) == 1 && d >= 0 && d < HAMI_REGION_DEVICES)
            __atomic_store_n(&r->sm_limit[d], (uint64_t)v, __ATOMIC_RELEASE);
        else return 4;
        printf("set %s=%lld\n", f, v);
        return 0;
    }
    if (!strcmp(argv[2], "hold") && argc == 4) {
        printf("holding\n");
        fflush(stdout);
        sleep(atoi(argv[3]));
        return 0;
    }
    return 4;
}
