/* Per-exec cost of a preload library: how much longer a process takes to
 * start and exit when the library is preloaded than when it is not.
 *
 *   exec_cost [-n ROUNDS] [-c CPU] LIB... [-- PROGRAM ARGS...]
 *
 * Each round spawns PROGRAM (default /bin/true) once bare and once per LIB
 * (LD_PRELOAD=LIB), in a shuffled order, timing posix_spawn to waitpid.
 * Prints the median of each variant and, per LIB, the median and quartiles
 * of the paired difference LIB - bare within a round, in microseconds.
 * Interleaving and pairing make slow drifts in machine load cancel out.
 * Build: cc -O2 -o exec_cost benches/exec_cost.c (benches/exec_cost.sh). */
#define _GNU_SOURCE
#include <sched.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define MAX_VARIANTS 8

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

/* environ without LD_PRELOAD, plus LD_PRELOAD=lib when lib is set. */
static char **make_env(const char *lib) {
    size_t n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + 2, sizeof *env);
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0) env[k++] = environ[i];
    if (lib) {
        size_t len = strlen(lib) + 12;
        env[k] = malloc(len);
        snprintf(env[k], len, "LD_PRELOAD=%s", lib);
        k++;
    }
    env[k] = NULL;
    return env;
}

static double run_once(char **argv, char **env) {
    pid_t pid;
    double t0 = now_us();
    if (posix_spawn(&pid, argv[0], NULL, NULL, argv, env) != 0) {
        perror("posix_spawn");
        exit(1);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status)) {
        fprintf(stderr, "%s did not exit cleanly\n", argv[0]);
        exit(1);
    }
    return now_us() - t0;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double quantile(double *v, int n, double q) {
    qsort(v, n, sizeof *v, cmp);
    return v[(int)(q * (n - 1) + 0.5)];
}

int main(int argc, char **argv) {
    int rounds = 2000, cpu = -1, nlibs = 0;
    const char *libs[MAX_VARIANTS];
    char *deflt[] = {"/bin/true", NULL};
    char **prog = deflt;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-n") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-c") && i + 1 < argc) cpu = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--")) { prog = &argv[i + 1]; break; }
        else if (nlibs < MAX_VARIANTS - 1) libs[nlibs++] = argv[i];
    }
    if (nlibs == 0 || rounds < 10 || !prog[0]) {
        fprintf(stderr, "usage: exec_cost [-n ROUNDS] [-c CPU] LIB... [-- PROGRAM ARGS...]\n");
        return 2;
    }
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        sched_setaffinity(0, sizeof set, &set);
    }
    for (int v = 0; v < nlibs; v++)
        if (access(libs[v], R_OK) != 0) {
            fprintf(stderr, "exec_cost: cannot read %s\n", libs[v]);
            return 2;
        }
    int nv = nlibs + 1; /* variant 0 is bare */
    char **envs[MAX_VARIANTS];
    double *t[MAX_VARIANTS];
    for (int v = 0; v < nv; v++) {
        envs[v] = make_env(v ? libs[v - 1] : NULL);
        t[v] = calloc(rounds, sizeof(double));
        run_once(prog, envs[v]); /* warm the page cache */
    }
    srand(12345);
    for (int r = 0; r < rounds; r++) {
        int order[MAX_VARIANTS];
        for (int v = 0; v < nv; v++) order[v] = v;
        for (int v = nv - 1; v > 0; v--) {
            int j = rand() % (v + 1), tmp = order[v];
            order[v] = order[j];
            order[j] = tmp;
        }
        for (int k = 0; k < nv; k++) t[order[k]][r] = run_once(prog, envs[order[k]]);
    }
    double *d = calloc(rounds, sizeof(double)), *s = calloc(rounds, sizeof(double));
    memcpy(s, t[0], rounds * sizeof(double));
    printf("program=%s rounds=%d bare_median_us=%.1f\n", prog[0], rounds, quantile(s, rounds, 0.5));
    for (int v = 1; v < nv; v++) {
        for (int r = 0; r < rounds; r++) d[r] = t[v][r] - t[0][r];
        memcpy(s, t[v], rounds * sizeof(double));
        printf("lib=%s median_us=%.1f extra_median_us=%.1f extra_p25_us=%.1f extra_p75_us=%.1f\n",
               libs[v - 1], quantile(s, rounds, 0.5), quantile(d, rounds, 0.5),
               quantile(d, rounds, 0.25), quantile(d, rounds, 0.75));
    }
    return 0;
}
