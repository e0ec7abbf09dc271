#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
int main(int argc, char **argv) {
    if (argc == 2 && !strcmp(argv[1], "stamp")) { printf("started %.9f\n", now()); return 0; }
    long procs = 1;
    for (int i = 1; i + 1 < argc; i += 2) {
        long n = atol(argv[i + 1]);
        if (!strcmp(argv[i], "procs")) { procs = n; continue; }
        double start = now();
        if (!strcmp(argv[i], "cycles")) {
            char name[64];
            for (long k = 0; k < n; k++) {
                snprintf(name, sizeof name, "bench-%ld.tmp", k);
                int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
                if (fd < 0) return 2;
                if (write(fd, "data\n", 5) != 5) return 3;
                close(fd);
                unlink(name);
            }
        } else if (!strcmp(argv[i], "execs")) {
            for (long k = 0; k < n; k++) {
                pid_t pid = fork();
                if (pid == 0) { execl("/bin/true", "true", (char *)0); _exit(127); }
                int status; waitpid(pid, &status, 0);
            }
        } else if (!strcmp(argv[i], "flood")) {
            int fd0 = open("flood.tmp", O_WRONLY | O_CREAT, 0644); close(fd0);
            for (long k = 0; k < n; k++) { int fd = open("flood.tmp", O_WRONLY); close(fd); }
            unlink("flood.tmp");
        } else if (!strcmp(argv[i], "pflood")) {
            char name[64];
            int go[2];
            if (pipe(go)) return 4;
            for (long g = 0; g < procs; g++) {
                snprintf(name, sizeof name, "gen-%ld.tmp", g);
                int fd0 = open(name, O_WRONLY | O_CREAT, 0644); close(fd0);
            }
            for (long g = 0; g < procs; g++) {
                pid_t pid = fork();
                if (pid < 0) return 5;
                if (pid == 0) {
                    char c;
                    close(go[1]);
                    if (read(go[0], &c, 1) < 0) _exit(6); /* the start: EOF */
                    snprintf(name, sizeof name, "gen-%ld.tmp", g);
                    for (long k = 0; k < n; k++) { int fd = open(name, O_WRONLY); close(fd); }
                    _exit(0);
                }
            }
            close(go[0]);
            start = now();
            close(go[1]);
            int failed = 0;
            for (long g = 0; g < procs; g++) { int status; wait(&status); failed |= !WIFEXITED(status) || WEXITSTATUS(status); }
            for (long g = 0; g < procs; g++) { snprintf(name, sizeof name, "gen-%ld.tmp", g); unlink(name); }
            if (failed) return 7;
            n *= procs;
        }
        printf("%s %ld %.6f\n", argv[i], n, now() - start);
    }
    struct rusage self, children;
    getrusage(RUSAGE_SELF, &self); getrusage(RUSAGE_CHILDREN, &children);
    double cpu = self.ru_utime.tv_sec + self.ru_stime.tv_sec + children.ru_utime.tv_sec + children.ru_stime.tv_sec
        + (self.ru_utime.tv_usec + self.ru_stime.tv_usec + children.ru_utime.tv_usec + children.ru_stime.tv_usec) / 1e6;
    printf("cpu %.6f\n", cpu);
    return 0;
}
