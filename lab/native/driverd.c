/*
 * gpulab-driverd: the NVIDIA driver daemons of a lab host, installed by the lab's driver package as
 * /usr/bin/nvidia-persistenced and /usr/bin/nv-fabricmanager (the same program under both names).
 *
 * What matters to the fleet tooling is what a real daemon shows in /proc: its executable is a file named
 * after the daemon (so /proc/<pid>/exe ends in "nvidia-persistenced" while /proc/<pid>/comm, cut by the kernel
 * to 15 characters, reads "nvidia-persiste"), and it holds the device files open for as long as it runs:
 *   nvidia-persistenced: /dev/nvidiactl and every /dev/nvidia<N> (it keeps each GPU initialised);
 *   nv-fabricmanager:    /dev/nvidiactl (the lab has no /dev/nvidia-nvswitch* to open).
 * Like the real ones it refuses to start without the module's devices (exit 1), writes its pid to
 * /run/<name>/<name>.pid, and ends on SIGTERM. It never forks: the start script puts it in the background.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int is_gpu_node(const char *name) {
    if (strncmp(name, "nvidia", 6) != 0 || name[6] == '\0') return 0;
    for (const char *p = name + 6; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

int main(int argc, char **argv) {
    (void)argc;
    const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    if (open("/dev/nvidiactl", O_RDONLY) < 0) {
        fprintf(stderr, "%s: /dev/nvidiactl: the NVIDIA kernel module is not loaded\n", name);
        return 1;
    }
    if (strcmp(name, "nvidia-persistenced") == 0) {
        DIR *d = opendir("/dev");
        struct dirent *e;
        while (d && (e = readdir(d))) {
            if (is_gpu_node(e->d_name)) {
                char path[300];
                snprintf(path, sizeof path, "/dev/%s", e->d_name);
                if (open(path, O_RDONLY) < 0) perror(path);
            }
        }
        if (d) closedir(d);
    }
    char dir[256], pidfile[600];
    snprintf(dir, sizeof dir, "/run/%s", name);
    mkdir(dir, 0755);
    snprintf(pidfile, sizeof pidfile, "%s/%s.pid", dir, name);
    FILE *f = fopen(pidfile, "w");
    if (f) {
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
    }
    for (;;) pause();  /* SIGTERM's default action ends it */
}
