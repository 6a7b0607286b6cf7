/*
 * uname_preload.c - libgpulab-uname.so, listed in a lab host's /etc/ld.so.preload.
 *
 * A lab host is a chroot on the controller's kernel, so uname(2) would report the controller's kernel.
 * This wrapper makes every dynamically linked program on the host (uname -r, Python's os.uname() and
 * platform.release(), apt's kernel hooks, ...) see the host's *simulated booted kernel* instead:
 *
 *   $GPULAB_STATE_DIR/kernel (GPULAB_STATE_DIR unset or empty: /run/gpulab/kernel)
 *     line 1: the release, e.g. "6.5.0-45-generic"        -> utsname.release
 *     line 2: optional, the full version string            -> utsname.version
 *             (default: derived from the release, Ubuntu style:
 *              "6.5.0-45-generic"  -> "#45~22.04.1-Ubuntu SMP PREEMPT_DYNAMIC Fri Jul 12 16:40:02 UTC 2"
 *              (cut at 64 characters, exactly as a real Ubuntu HWE kernel's `uname -v` is)
 *              "5.15.0-113-generic" -> "#113-Ubuntu SMP Fri Jul 12 16:40:02 UTC 2024")
 *
 * No file, an unreadable file, or an empty/oversized/non-printable first line: the real values pass
 * through untouched.  Statically linked programs and /proc/sys/kernel/osrelease are not affected.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int (*uname_fn)(struct utsname *);

static int real_uname(struct utsname *buf)
{
    static uname_fn next;
    if (!next)
        next = (uname_fn)dlsym(RTLD_NEXT, "uname");
    if (next)
        return next(buf);
    return (int)syscall(SYS_uname, buf);
}

/* strip trailing newline/whitespace; reject empty, too long, or non-printable values */
static int clean_line(char *s, size_t max)
{
    size_t n = strlen(s);
    size_t i;
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    if (n == 0 || n >= max)
        return -1;
    for (i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] == 0x7f)
            return -1;
    return 0;
}

static void default_version(const char *release, char *out, size_t len)
{
    unsigned int major = 0, minor = 0, patch = 0, abi = 0;
    if (sscanf(release, "%u.%u.%u-%u", &major, &minor, &patch, &abi) != 4) {
        snprintf(out, len, "#1 SMP PREEMPT_DYNAMIC Fri Jul 12 16:40:02 UTC 2024");
        return;
    }
    if (major == 5 && minor == 15) /* Ubuntu 22.04 GA kernel */
        snprintf(out, len, "#%u-Ubuntu SMP Fri Jul 12 16:40:02 UTC 2024", abi);
    else /* 22.04 HWE kernels (6.2, 6.5, 6.8) */
        snprintf(out, len, "#%u~22.04.1-Ubuntu SMP PREEMPT_DYNAMIC Fri Jul 12 16:40:02 UTC 2024", abi);
}

API int uname(struct utsname *buf)
{
    char path[4096];
    char release[sizeof(buf->release) + 2];
    char version[160]; /* a default can exceed 64 chars: cut below, as the kernel cuts UTS_VERSION */
    const char *dir;
    FILE *f;
    int rc = real_uname(buf);

    if (rc != 0 || !buf)
        return rc;
    dir = getenv("GPULAB_STATE_DIR");
    if (!dir || !*dir)
        dir = "/run/gpulab";
    if ((size_t)snprintf(path, sizeof(path), "%s/kernel", dir) >= sizeof(path))
        return rc;
    f = fopen(path, "re");
    if (!f)
        return rc;
    if (!fgets(release, sizeof(release), f) || clean_line(release, sizeof(buf->release)) != 0) {
        fclose(f);
        return rc;
    }
    if (!fgets(version, sizeof(version), f) || clean_line(version, sizeof(version)) != 0)
        default_version(release, version, sizeof(version));
    fclose(f);

    memset(buf->release, 0, sizeof(buf->release));
    memcpy(buf->release, release, strlen(release));
    memset(buf->version, 0, sizeof(buf->version));
    memcpy(buf->version, version, strlen(version) < sizeof(buf->version) ? strlen(version) : sizeof(buf->version) - 1);
    return rc;
}
