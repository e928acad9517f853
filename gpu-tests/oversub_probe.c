/* Answers, on the real driver, what vgpu's oversubscription design rests
 * on (docs/oversubscription.md): can a process checkpoint and restore
 * ITSELF with the CUDA checkpoint API, from which thread, and how fast;
 * and can another (root) process do it to a live one. The driver is
 * reached with dlopen, so this also runs on the simulated GPU.
 *
 *   oversub_probe self thread GIB   a second thread of this process locks,
 *                                   checkpoints, restores and unlocks it
 *   oversub_probe self main GIB     the thread that uses CUDA does it itself
 *   oversub_probe other PID         this process does it to process PID
 *
 * `self` fills GIB GiB of device memory with a pattern, checks it after
 * the restore, and meanwhile asks from another thread whether
 * cuCtxGetCurrent blocks while the process is checkpointed. Prints
 * key=value lines; every step prints its CUresult.
 *
 * With PROBE_CROWD set to a shell command that takes the card's memory
 * and prints `hold_rc=0` (cuclient hold), `self` runs it while the process
 * is checkpointed, first tries a restore on the crowded card (its rc and
 * the state it leaves: can a refused restore be tried again?), then kills
 * the command and restores as usual.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef struct {
    unsigned int timeoutMs;
    unsigned int reserved0;
    uint64_t reserved1[7];
} LockArgs;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, int);
static CUresult (*cuCtxSetCurrent)(CUcontext);
static CUresult (*cuCtxGetCurrent)(CUcontext *);
static CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
static CUresult (*cuMemcpyHtoD_v2)(CUdeviceptr, const void *, size_t);
static CUresult (*cuMemcpyDtoH_v2)(void *, CUdeviceptr, size_t);
static CUresult (*cuCheckpointProcessLock)(int, LockArgs *);
static CUresult (*cuCheckpointProcessCheckpoint)(int, void *);
static CUresult (*cuCheckpointProcessRestore)(int, void *);
static CUresult (*cuCheckpointProcessUnlock)(int, void *);
static CUresult (*cuCheckpointProcessGetState)(int, int *);
static CUresult (*cuCheckpointProcessGetRestoreThreadId)(int, int *);

static void load(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("error=dlopen_libcuda\n");
        exit(2);
    }
#define L(name)                                        \
    *(void **)&name = dlsym(h, #name);                 \
    if (!name) {                                       \
        printf("error=missing_%s\n", #name);           \
        exit(2);                                       \
    }
    L(cuInit) L(cuDeviceGet) L(cuDevicePrimaryCtxRetain) L(cuCtxSetCurrent) L(cuCtxGetCurrent)
    L(cuMemAlloc_v2) L(cuMemcpyHtoD_v2) L(cuMemcpyDtoH_v2) L(cuCheckpointProcessLock)
    L(cuCheckpointProcessCheckpoint) L(cuCheckpointProcessRestore) L(cuCheckpointProcessUnlock)
    L(cuCheckpointProcessGetState) L(cuCheckpointProcessGetRestoreThreadId)
#undef L
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double last_checkpoint_ms;

static int state_of(int pid) {
    int s = -1;
    CUresult rc = cuCheckpointProcessGetState(pid, &s);
    return rc ? -100 - rc : s;
}

/* One suspend and resume of `pid`, timed; `bytes` for the bandwidth. */
static int cycle(int pid, const char *who, double bytes) {
    int tid = -1;
    CUresult trc = cuCheckpointProcessGetRestoreThreadId(pid, &tid);
    printf("%s_restore_tid_rc=%d %s_restore_tid=%d caller_tid=%ld state_before=%d\n", who, trc, who, tid,
           (long)syscall(SYS_gettid), state_of(pid));
    LockArgs la = {.timeoutMs = 10000};
    double t0 = now_s();
    CUresult lrc = cuCheckpointProcessLock(pid, &la);
    double t1 = now_s();
    CUresult crc = lrc ? -1 : cuCheckpointProcessCheckpoint(pid, NULL);
    double t2 = now_s();
    int mid = state_of(pid);
    last_checkpoint_ms = (t2 - t1) * 1e3;
    printf("%s_lock_rc=%d %s_checkpoint_rc=%d state_checkpointed=%d lock_ms=%.1f checkpoint_ms=%.1f\n", who, lrc,
           who, crc, mid, (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    fflush(stdout);
    return crc == 0 ? 0 : (lrc == 0 ? 1 : 2);
}

static int uncycle(int pid, const char *who, double bytes, double t_ckpt_ms) {
    double t2 = now_s();
    CUresult rrc = cuCheckpointProcessRestore(pid, NULL);
    double t3 = now_s();
    CUresult urc = rrc ? -1 : cuCheckpointProcessUnlock(pid, NULL);
    double t4 = now_s();
    printf("%s_restore_rc=%d %s_unlock_rc=%d state_after=%d restore_ms=%.1f unlock_ms=%.1f\n", who, rrc, who, urc,
           state_of(pid), (t3 - t2) * 1e3, (t4 - t3) * 1e3);
    (void)t_ckpt_ms;
    if (bytes > 0 && last_checkpoint_ms > 0)
        printf("checkpoint_gbs=%.2f restore_gbs=%.2f\n", bytes / 1e9 / (last_checkpoint_ms / 1e3),
               bytes / 1e9 / ((t3 - t2)));
    fflush(stdout);
    return rrc || urc;
}

/* ---- self ---------------------------------------------------------------- */

/* 256 MiB: the largest allocation whose contents the simulated GPU keeps. */
#define CHUNK (256ull << 20)
#define HOSTBUF (64ull << 20)
static CUdeviceptr *chunks;
static size_t nchunks;
static uint32_t *host;

static uint32_t word(size_t chunk, size_t i) {
    uint64_t x = (chunk + 1) * 0x9e3779b97f4a7c15ull ^ (i * 0xbf58476d1ce4e5b9ull);
    x ^= x >> 31;
    return (uint32_t)(x * 0x94d049bb133111ebull >> 32);
}

static int fill_or_check(int check) {
    size_t per = HOSTBUF / 4;
    long bad = 0;
    for (size_t c = 0; c < nchunks; c++) {
        for (size_t off = 0; off < CHUNK; off += HOSTBUF) {
            size_t base = off / 4;
            if (check) {
                if (cuMemcpyDtoH_v2(host, chunks[c] + off, HOSTBUF)) return -1;
                for (size_t i = 0; i < per; i++) bad += host[i] != word(c, base + i);
            } else {
                for (size_t i = 0; i < per; i++) host[i] = word(c, base + i);
                if (cuMemcpyHtoD_v2(chunks[c] + off, host, HOSTBUF)) return -1;
            }
        }
    }
    return bad != 0;
}

static volatile int probe_done;
static double probe_ms;

/* NVML, which vgpu's watcher uses to judge room for a restore: does a
 * query of this (checkpointed) process block? */
typedef struct {
    unsigned long long total, free, used;
} NvmlMemory;
static int (*nvmlInit_v2)(void);
static int (*nvmlDeviceGetHandleByIndex_v2)(unsigned, void **);
static int (*nvmlDeviceGetMemoryInfo)(void *, NvmlMemory *);
static void *nvml_dev;
static volatile int nvml_done;
static double nvml_ms;
static int nvml_rc = -1;

static void nvml_load(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) return;
    *(void **)&nvmlInit_v2 = dlsym(h, "nvmlInit_v2");
    *(void **)&nvmlDeviceGetHandleByIndex_v2 = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    *(void **)&nvmlDeviceGetMemoryInfo = dlsym(h, "nvmlDeviceGetMemoryInfo");
    if (!nvmlInit_v2 || !nvmlDeviceGetHandleByIndex_v2 || !nvmlDeviceGetMemoryInfo || nvmlInit_v2() ||
        nvmlDeviceGetHandleByIndex_v2(0, &nvml_dev))
        nvml_dev = NULL;
}

static void *probe_nvml(void *arg) {
    (void)arg;
    double t = now_s();
    NvmlMemory m;
    nvml_rc = nvmlDeviceGetMemoryInfo(nvml_dev, &m);
    nvml_ms = (now_s() - t) * 1e3;
    nvml_done = 1;
    return NULL;
}

static void *probe_get_current(void *arg) {
    (void)arg;
    double t = now_s();
    CUcontext c;
    cuCtxGetCurrent(&c);
    probe_ms = (now_s() - t) * 1e3;
    probe_done = 1;
    return NULL;
}

/* Runs `cmd` (sh -c) until it prints hold_rc=0; its pid, or -1. */
static pid_t crowd_start(const char *cmd) {
    int fd[2];
    if (pipe(fd)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    char line[256];
    int up = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "hold_rc=")) {
            up = strstr(line, "hold_rc=0") != NULL;
            break;
        }
    printf("crowd_up=%d crowd_line=%s", up, up ? line : "-\n");
    if (!up) {
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

/* A restore onto a card without room for it: its rc, and whether the
 * process is still checkpointed (2) so that it can be tried again. */
static void crowded_restore(int pid, const char *cmd) {
    pid_t crowd = crowd_start(cmd);
    if (crowd < 0) return;
    double t = now_s();
    CUresult rc = cuCheckpointProcessRestore(pid, NULL);
    double ms = (now_s() - t) * 1e3;
    printf("crowded_restore_rc=%d state_after_crowded_restore=%d crowded_restore_ms=%.1f\n", rc, state_of(pid), ms);
    fflush(stdout);
    system("echo crowded_apps=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits"
           " | tr '\\n' ';')");
    kill(crowd, SIGKILL);
    waitpid(crowd, NULL, 0);
    sleep(2);
    system("echo after_apps=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits"
           " | tr '\\n' ';') free_mib=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits)");
    /* Can a process whose restore was refused be restored later? */
    for (int i = 0; i < 8; i++) {
        t = now_s();
        rc = cuCheckpointProcessRestore(pid, NULL);
        printf("retry=%d retry_restore_rc=%d state=%d ms=%.1f\n", i, rc, state_of(pid), (now_s() - t) * 1e3);
        fflush(stdout);
        if (rc == 0) break;
        sleep(1);
    }
}

struct job {
    int pid;
    double bytes;
    int rc;
};

static void *suspend_resume(void *arg) {
    struct job *j = arg;
    double t = now_s();
    int r = cycle(j->pid, "self", j->bytes);
    double ckpt_ms = (now_s() - t) * 1e3;
    if (r != 0) {
        if (r == 1) cuCheckpointProcessUnlock(j->pid, NULL);
        j->rc = 1;
        return NULL;
    }
    /* While checkpointed: does a plain query block? */
    pthread_t q, n;
    probe_done = 0;
    pthread_create(&q, NULL, probe_get_current, NULL);
    if (nvml_dev) pthread_create(&n, NULL, probe_nvml, NULL);
    usleep(1000 * 1000);
    printf("get_current_blocked_while_checkpointed=%d\n", !probe_done);
    if (nvml_dev) printf("nvml_memory_info_blocked_while_checkpointed=%d\n", !nvml_done);
    const char *crowd = getenv("PROBE_CROWD");
    if (crowd && *crowd) crowded_restore(j->pid, crowd);
    if (state_of(j->pid) == 1) { /* the crowded restore went through after all */
        j->rc = cuCheckpointProcessUnlock(j->pid, NULL);
        printf("self_unlock_rc=%d state_after=%d\n", j->rc, state_of(j->pid));
    } else {
        j->rc = uncycle(j->pid, "self", j->bytes, ckpt_ms);
    }
    pthread_join(q, NULL);
    printf("get_current_ms=%.1f\n", probe_ms);
    if (nvml_dev) {
        pthread_join(n, NULL);
        printf("nvml_memory_info_ms=%.1f nvml_memory_info_rc=%d\n", nvml_ms, nvml_rc);
    }
    return NULL;
}

static int self(const char *mode, double gib) {
    CUresult rc = cuInit(0);
    nvml_load();
    int dev;
    CUcontext ctx;
    if (rc || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) || cuCtxSetCurrent(ctx)) {
        printf("error=setup rc=%d\n", rc);
        return 2;
    }
    nchunks = (size_t)(gib * 4 + 0.5);
    chunks = calloc(nchunks, sizeof *chunks);
    host = malloc(HOSTBUF);
    for (size_t c = 0; c < nchunks; c++)
        if ((rc = cuMemAlloc_v2(&chunks[c], CHUNK))) {
            printf("error=alloc rc=%d chunk=%zu\n", rc, c);
            return 2;
        }
    double t = now_s();
    if (fill_or_check(0)) {
        printf("error=fill\n");
        return 2;
    }
    printf("mode=%s gib=%.2f fill_s=%.2f\n", mode, nchunks / 4.0, now_s() - t);
    fflush(stdout);
    struct job j = {.pid = getpid(), .bytes = (double)nchunks * CHUNK};
    if (!strcmp(mode, "thread")) {
        pthread_t th;
        pthread_create(&th, NULL, suspend_resume, &j);
        pthread_join(th, NULL);
    } else {
        double t0 = now_s();
        int r = cycle(j.pid, "self", j.bytes);
        double ckpt_ms = (now_s() - t0) * 1e3;
        if (r == 1) cuCheckpointProcessUnlock(j.pid, NULL);
        j.rc = r ? 1 : uncycle(j.pid, "self", j.bytes, ckpt_ms);
    }
    int bad = fill_or_check(1);
    printf("intact=%d cycle_rc=%d\n", bad == 0, j.rc);
    return j.rc || bad;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3) {
        fprintf(stderr, "usage: oversub_probe self thread|main GIB | other PID\n");
        return 2;
    }
    load();
    if (!strcmp(argv[1], "self")) return self(argv[2], argc > 3 ? atof(argv[3]) : 1);
    if (!strcmp(argv[1], "other")) {
        int pid = atoi(argv[2]);
        cuInit(0);
        double t = now_s();
        int r = cycle(pid, "other", 0);
        double ckpt_ms = (now_s() - t) * 1e3;
        if (r == 1) cuCheckpointProcessUnlock(pid, NULL);
        if (r) return 1;
        return uncycle(pid, "other", 0, ckpt_ms);
    }
    return 2;
}
