/*
 * gpulab-init: PID 1 of one simulated lab host.
 *
 * Started (through exec, so it keeps PID 1 of the host's PID namespace) by `python -m lab.boot` after the
 * host's root filesystem is mounted. It chroots into that root, runs the host's start scripts
 * (/etc/rc2.d/S*, the way sysvinit's runlevel 2 would) and then only reaps children.
 *
 * Signals:
 *   SIGUSR1  reboot now: stop every process of the host, exit 100 (the lab supervisor boots the host again)
 *   SIGTERM  halt now:   stop every process of the host, exit 0  (the supervisor leaves the host down)
 *   SIGUSR2  reboot in DELAY_MS (what `shutdown -r` / `reboot` inside the host send)
 *   SIGPWR   halt in DELAY_MS   (what `shutdown -h` / `halt` / `poweroff` inside the host send)
 *   SIGHUP   re-run the start scripts (used by the lab to bring a stopped sshd back)
 *
 * The delayed requests let the caller's SSH session return before the host goes down, as a real `shutdown -r 0`
 * does. The delay is kept here, in PID 1, on purpose: a helper process that sleeps and then signals init is
 * lost when the session ends before the helper has left the session (an SSH session with a terminal, as
 * Ansible's reboot uses, hangs up its process group), and the reboot never happens.
 *
 * It never calls reboot(2): inside a PID namespace that call only ends the namespace, but the same
 * binary run outside one would reboot the machine. Ending the host is always "kill everything, exit".
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DELAY_MS 1000

static volatile sig_atomic_t want_exit = -1;
static volatile sig_atomic_t want_delayed = -1;
static volatile sig_atomic_t want_rc = 0;

static void on_signal(int sig) {
    if (sig == SIGUSR1) want_exit = 100;
    else if (sig == SIGTERM || sig == SIGINT) want_exit = 0;
    else if (sig == SIGUSR2) want_delayed = 100;
    else if (sig == SIGPWR) { if (want_delayed < 0) want_delayed = 0; }  /* a pending reboot wins over a halt */
    else if (sig == SIGHUP) want_rc = 1;
}

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void run_start_scripts(void) {
    DIR *d = opendir("/etc/rc2.d");
    if (!d) return;
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        if (e->d_name[0] == 'S') names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof(char *), cmp);
    for (int i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, "/etc/rc2.d/%s", names[i]);
        free(names[i]);
        pid_t pid = fork();
        if (pid == 0) {
            sigset_t none;
            sigemptyset(&none);
            sigprocmask(SIG_SETMASK, &none, NULL);
            execl(path, path, "start", (char *)NULL);
            _exit(127);
        }
        if (pid > 0) {
            int status;
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
        }
    }
}

static void stop_everything(void) {
    kill(-1, SIGTERM);
    for (int i = 0; i < 30; i++) {  /* up to 3 s for a clean stop */
        while (waitpid(-1, NULL, WNOHANG) > 0) {}
        if (kill(-1, 0) < 0 && errno == ESRCH) return;
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    kill(-1, SIGKILL);
    while (waitpid(-1, NULL, 0) > 0) {}
}

int main(int argc, char **argv) {
    if (getpid() != 1) {
        fprintf(stderr, "gpulab-init: must run as PID 1 of a lab host's PID namespace; refusing\n");
        return 2;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: gpulab-init ROOT\n");
        return 2;
    }
    if (chroot(argv[1]) != 0 || chdir("/") != 0) {
        perror("gpulab-init: chroot");
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    sigaction(SIGPWR, &sa, NULL);
    setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
    setenv("RUNLEVEL", "2", 1);

    run_start_scripts();
    long long delayed_at = -1;
    for (;;) {
        if (want_delayed >= 0 && want_exit < 0) {
            if (delayed_at < 0) delayed_at = now_ms() + DELAY_MS;
            else if (now_ms() >= delayed_at) want_exit = want_delayed;
        }
        if (want_exit >= 0) {
            int code = want_exit;
            stop_everything();
            return code;
        }
        if (want_rc) {
            want_rc = 0;
            run_start_scripts();
        }
        while (waitpid(-1, NULL, WNOHANG) > 0) {}
        struct timespec ts = {0, 100 * 1000 * 1000};  /* a signal cuts the sleep short */
        nanosleep(&ts, NULL);
    }
}
