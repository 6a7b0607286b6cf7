/*
 * nvml.c - a file-driven stand-in for NVIDIA's libnvidia-ml.so.1, for the lab's simulated GPU hosts.
 *
 * Built by lab/native/build.py as libnvidia-ml.so.1 (soname libnvidia-ml.so.1, libc only).  The real,
 * unmodified pynvml (PyPI nvidia-ml-py) and lab/hostfiles/nvidia-smi load it exactly as they load the
 * real library: same symbol names, same argument lists, same struct layouts, same return codes, same
 * buffer-size rules (NVML_ERROR_INSUFFICIENT_SIZE, *count set to what is needed).  Functions that are
 * not implemented are simply absent, so callers see NVML_ERROR_FUNCTION_NOT_FOUND as they would with an
 * older driver.
 *
 * The userspace driver version is compiled in:  -DGPULAB_DRIVER_VERSION="\"535.183.01\""
 * (the CUDA driver version reported follows from the branch: 535 -> 12020, 550 -> 12040, else 12000).
 *
 * ---------------------------------------------------------------------------------------------------
 * STATE FILES  (directory: $GPULAB_STATE_DIR if set and non-empty, else /run/gpulab)
 * ---------------------------------------------------------------------------------------------------
 *   <dir>/module    One line: the version of the *loaded kernel module*, e.g. "535.183.01".
 *                   Missing/empty      -> every nvmlInit* returns NVML_ERROR_DRIVER_NOT_LOADED (9).
 *                   != compiled-in     -> every nvmlInit* returns NVML_ERROR_LIB_RM_VERSION_MISMATCH (18)
 *                                         (userspace upgraded, old module still loaded, no reboot yet).
 *   <dir>/hw/gpus   Hardware state, "key=value" per line.  Blank lines and lines starting with '#' are
 *                   ignored; whitespace around keys and values is trimmed; unknown keys are ignored;
 *                   numbers are decimal or 0x-hex, anything unparsable counts as 0; GPU indices >= 16 are
 *                   ignored.  A missing file means "all defaults" (one healthy A100 80GB PCIe).
 *                   The file is read at every nvmlInit* and re-read (when its mtime/size/inode changed)
 *                   by later calls, so a running process sees e.g. a GPU falling off the bus.  Writers
 *                   should replace it atomically (write a temp file, rename it over).
 *
 *     hang=0|1                        1: nvmlInit* never returns (the "NVML hangs" fault).
 *     gpu_count=N                     GPUs on the bus (0..16; default 1).  0: init succeeds, count is 0.
 *     gpu.<i>.name                    default "NVIDIA A100 80GB PCIe"
 *     gpu.<i>.uuid                    default GPU-4f1b6e2a-8c3d-4e5f-9a0b-1c2d3e4f50<ii>
 *     gpu.<i>.serial                  default 13210210345<ii>
 *     gpu.<i>.pci_bus_id              default <i+1 as 8 hex digits>:00:00.0 (Azure NC A100 v4 style);
 *                                     accepts DDDDDDDD:BB:DD.F, DDDD:BB:DD.F or BB:DD.F
 *     gpu.<i>.pci_device_id           default 0x20B510DE (A100 80GB PCIe; device << 16 | vendor)
 *     gpu.<i>.pci_subsystem_id        default 0x153310DE
 *     gpu.<i>.memory_total            bytes, default 85899345920 (81920 MiB)
 *     gpu.<i>.memory_reserved         bytes, default 691011584 (659 MiB, driver/firmware reservation)
 *     gpu.<i>.memory_used             bytes allocated by contexts (nvmlMemory_v2_t.used); default
 *                                     4 MiB + the sum of gpu.<i>.procs.  nvmlMemory_t (v1) reports
 *                                     used = memory_used + memory_reserved, like the real driver.
 *     gpu.<i>.temperature             degC, default 33
 *     gpu.<i>.temp_shutdown           default 92    (NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0)
 *     gpu.<i>.temp_slowdown           default 89    (NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1)
 *     gpu.<i>.temp_mem_max            default 95    (NVML_TEMPERATURE_THRESHOLD_MEM_MAX  = 2)
 *     gpu.<i>.temp_gpu_max            default 85    (NVML_TEMPERATURE_THRESHOLD_GPU_MAX  = 3)
 *     gpu.<i>.power_mw                default 43120
 *     gpu.<i>.power_limit_mw          default 300000 (enforced = management limit)
 *     gpu.<i>.util_gpu / util_memory  percent, default 0 / 0
 *     gpu.<i>.clock_graphics|clock_sm|clock_mem|clock_video           MHz, default 210/210/1512/795
 *     gpu.<i>.max_clock_graphics|max_clock_sm|max_clock_mem|max_clock_video  default 1410/1410/1512/1290
 *     gpu.<i>.clocks_event_reasons    nvmlClocksEventReason* bitmask, default 0x1 (GpuIdle)
 *     gpu.<i>.ecc_mode                0/1, default 1.  0: nvmlDeviceGetTotalEccErrors -> NOT_SUPPORTED
 *     gpu.<i>.ecc_volatile_corrected|ecc_volatile_uncorrected|ecc_aggregate_corrected|
 *             ecc_aggregate_uncorrected                                 default 0
 *     gpu.<i>.retired_sbe|retired_dbe pages retired for multiple single-bit / double-bit errors, default 0
 *     gpu.<i>.retired_pending         0/1, default 0
 *     gpu.<i>.page_retirement_supported  0/1, default 1 (a real A100 says 0: it remaps rows instead;
 *                                     0 makes the retired-pages calls return NOT_SUPPORTED)
 *     gpu.<i>.remapped_correctable|remapped_uncorrectable|remap_pending|remap_failure  default 0
 *     gpu.<i>.persistence_mode        0/1, default 1
 *     gpu.<i>.pstate                  0..15 (P0..P15), default 0
 *     gpu.<i>.lost                    1: nvmlDeviceGetHandleBy* for it and every call on an existing
 *                                     handle to it return NVML_ERROR_GPU_IS_LOST (15)
 *     gpu.<i>.procs                   compute processes, "pid:used_bytes:name;pid:used_bytes:name"
 *                                     (at most 64; the name may contain ':'; may be empty)
 *     gpu.<i>.fail_under_load         1: while the load hook is on (<dir>/load), the GPU behaves as lost
 *                                     (NVML_ERROR_GPU_IS_LOST); idle, it looks healthy (the lab's
 *                                     fails-under-load fault: "healthy after reboot" that fails under load)
 *   <dir>/load      The lab's load hook (no GPU here to run a kernel on): "key=value" lines written by the
 *                   load gate's host program (remediation/hostside/gpuload.py) for the length of its load.
 *                   until=<unix seconds>   the load is on while now < until (a crashed writer's file expires);
 *                   util_gpu=<pct>         utilisation reported while on (default 100);
 *                   util_memory=<pct>      memory utilisation reported while on (default 45).
 *                   Read by nvmlDeviceGetUtilizationRates and, for a GPU with fail_under_load, by every call.
 *                   gpulabLoadHookVersion() (a lab-only symbol) returns 1: how a program knows the hook is there.
 *
 * Besides gpu.<i>.procs, every process of the host that holds /dev/nvidia<i> open (a job started on the
 * host, see the lab's gpu-job fault) is a compute process of GPU <i>, as the real driver reports a process
 * with a CUDA context there; it is listed with GPULAB_JOB_BYTES of GPU memory.
 *
 * Threading: one mutex serialises every call, which is all a single process needs.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef GPULAB_DRIVER_VERSION
#error "build with -DGPULAB_DRIVER_VERSION=\"535.183.01\" (see lab/native/build.py)"
#endif

#define API __attribute__((visibility("default")))

/* ---- NVML types and constants (values from nvml.h) ------------------------------------------------ */
typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_INSUFFICIENT_POWER = 8,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_IRQ_ISSUE = 11,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_CORRUPTED_INFOROM = 14,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_OPERATING_SYSTEM = 17,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_VGPU_ECC_NOT_SUPPORTED = 22,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_FREQ_NOT_SUPPORTED = 24,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_DEPRECATED = 26,
    NVML_ERROR_NOT_READY = 27,
    NVML_ERROR_GPU_NOT_FOUND = 28,
    NVML_ERROR_INVALID_STATE = 29,
    NVML_ERROR_UNKNOWN = 999,
};

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu

typedef struct gpulab_device *nvmlDevice_t;

/* nvmlPciInfo_t as used by nvmlDeviceGetPciInfo_v3 (68 bytes). */
typedef struct {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

/* The legacy layout used by nvmlDeviceGetPciInfo and nvmlDeviceGetPciInfo_v2 (52 bytes). */
typedef struct {
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    unsigned int reserved0, reserved1, reserved2, reserved3;
} nvmlPciInfo_v2_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24))) /* 0x02000028 */

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct { /* nvmlProcessInfo_v1_t: nvmlDevice*RunningProcesses (unversioned) */
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct { /* nvmlProcessInfo_v2_t == nvmlProcessInfo_t (v3): the _v2 and _v3 calls */
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t;

_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlPciInfo_v2_t) == 52, "nvmlPciInfo_v2_t layout");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlProcessInfo_v1_t) == 16, "nvmlProcessInfo_v1_t layout");
_Static_assert(sizeof(nvmlProcessInfo_v2_t) == 24, "nvmlProcessInfo_v2_t layout");

enum { NVML_TEMPERATURE_GPU = 0 };
enum {
    NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0,
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1,
    NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2,
    NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3,
    NVML_TEMPERATURE_THRESHOLD_COUNT = 8,
};
enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3, NVML_CLOCK_COUNT = 4 };
enum { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 };
enum { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 };
enum { NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0, NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1 };
enum { NVML_BRAND_NVIDIA = 14 };
enum { NVML_DEVICE_ARCH_AMPERE = 7 };

/* nvmlClocksEventReason* bits supported by an A100 PCIe */
#define GPULAB_SUPPORTED_EVENT_REASONS 0x00000000000001FFull

/* ---- simulated state ------------------------------------------------------------------------------- */
#define GPULAB_MAX_GPUS 16
#define GPULAB_MAX_PROCS 64
#define GPULAB_DEVICE_MAGIC 0x6e766d6cu /* "nvml" */
#define MiB (1024ull * 1024ull)

struct gpulab_proc {
    unsigned int pid;
    unsigned long long used;
    char name[256];
};

struct gpulab_device {
    unsigned int magic;
    unsigned int index;
    char name[96];
    char uuid[96];
    char serial[30]; /* NVML_DEVICE_SERIAL_BUFFER_SIZE: a longer value is cut so callers never see INSUFFICIENT_SIZE */
    unsigned int domain, bus, dev, function;
    unsigned int pci_device_id, pci_subsystem_id;
    unsigned long long mem_total, mem_reserved, mem_used;
    int mem_used_set;
    unsigned int temp, temp_threshold[4];
    unsigned int power_mw, power_limit_mw;
    unsigned int util_gpu, util_mem;
    unsigned int clock[NVML_CLOCK_COUNT], max_clock[NVML_CLOCK_COUNT];
    unsigned long long event_reasons;
    unsigned int ecc_mode;
    unsigned long long ecc[2][2]; /* [error type][counter type] */
    unsigned int retired[2];      /* [cause] */
    unsigned int retired_pending, page_retirement_supported;
    unsigned int remap_corr, remap_unc, remap_pending, remap_failure;
    unsigned int persistence, pstate, lost, fail_under_load;
    unsigned int nprocs;
    struct gpulab_proc procs[GPULAB_MAX_PROCS];
};

struct gpulab_hw {
    int hang;
    unsigned int count;
    struct gpulab_device dev[GPULAB_MAX_GPUS];
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned int g_refcount;
/* Handles are pointers into g_hw.dev: stable for the life of the process. */
static struct gpulab_hw g_hw;
static struct gpulab_hw g_scratch; /* parse target; only touched under g_lock */
static struct stat g_hw_stat;
static int g_hw_stat_valid;

static const char g_lib_version[] = GPULAB_DRIVER_VERSION;

/* ---- helpers ---------------------------------------------------------------------------------------- */
static const char *state_dir(void)
{
    const char *d = getenv("GPULAB_STATE_DIR");
    return (d && *d) ? d : "/run/gpulab";
}

static void state_path(char *out, size_t len, const char *leaf)
{
    snprintf(out, len, "%s/%s", state_dir(), leaf);
}

static char *trim(char *s)
{
    char *e;
    while (*s && isspace((unsigned char)*s))
        s++;
    e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = '\0';
    return s;
}

/* decimal or 0x-hex; anything else (including a negative number or trailing junk) is 0 */
static unsigned long long parse_u64(const char *s)
{
    char *end = NULL;
    unsigned long long v;
    if (!s || !*s || *s == '-' || *s == '+')
        return 0;
    errno = 0;
    v = strtoull(s, &end, 0);
    if (errno || end == s || *end != '\0')
        return 0;
    return v;
}

static unsigned int parse_u32(const char *s)
{
    unsigned long long v = parse_u64(s);
    return v > 0xFFFFFFFFull ? 0 : (unsigned int)v;
}

static void copy_field(char *dst, size_t len, const char *src)
{
    snprintf(dst, len, "%s", src);
}

static int cuda_driver_version(void)
{
    long major = strtol(g_lib_version, NULL, 10);
    if (major == 535)
        return 12020;
    if (major == 550)
        return 12040;
    return 12000;
}

/* "DDDDDDDD:BB:DD.F", "DDDD:BB:DD.F", "BB:DD.F" (function optional) -> 0 on success */
static int parse_bus_id(const char *s, unsigned int *domain, unsigned int *bus, unsigned int *dev, unsigned int *fn)
{
    unsigned int a, b, c, d;
    char tail;
    if (!s)
        return -1;
    if (sscanf(s, "%x:%x:%x.%x%c", &a, &b, &c, &d, &tail) == 4) {
        *domain = a; *bus = b; *dev = c; *fn = d;
    } else if (sscanf(s, "%x:%x:%x%c", &a, &b, &c, &tail) == 3) {
        *domain = a; *bus = b; *dev = c; *fn = 0;
    } else if (sscanf(s, "%x:%x.%x%c", &b, &c, &d, &tail) == 3) {
        *domain = 0; *bus = b; *dev = c; *fn = d;
    } else {
        return -1;
    }
    if (*bus > 0xFF || *dev > 0x1F || *fn > 7)
        return -1;
    return 0;
}

static void device_defaults(struct gpulab_device *g, unsigned int i)
{
    memset(g, 0, sizeof(*g));
    g->magic = GPULAB_DEVICE_MAGIC;
    g->index = i;
    copy_field(g->name, sizeof(g->name), "NVIDIA A100 80GB PCIe");
    snprintf(g->uuid, sizeof(g->uuid), "GPU-4f1b6e2a-8c3d-4e5f-9a0b-1c2d3e4f50%02x", i);
    snprintf(g->serial, sizeof(g->serial), "13210210345%02u", i);
    g->domain = i + 1;
    g->pci_device_id = 0x20B510DEu;
    g->pci_subsystem_id = 0x153310DEu;
    g->mem_total = 81920ull * MiB;
    g->mem_reserved = 659ull * MiB;
    g->temp = 33;
    g->temp_threshold[NVML_TEMPERATURE_THRESHOLD_SHUTDOWN] = 92;
    g->temp_threshold[NVML_TEMPERATURE_THRESHOLD_SLOWDOWN] = 89;
    g->temp_threshold[NVML_TEMPERATURE_THRESHOLD_MEM_MAX] = 95;
    g->temp_threshold[NVML_TEMPERATURE_THRESHOLD_GPU_MAX] = 85;
    g->power_mw = 43120;
    g->power_limit_mw = 300000;
    g->clock[NVML_CLOCK_GRAPHICS] = 210;
    g->clock[NVML_CLOCK_SM] = 210;
    g->clock[NVML_CLOCK_MEM] = 1512;
    g->clock[NVML_CLOCK_VIDEO] = 795;
    g->max_clock[NVML_CLOCK_GRAPHICS] = 1410;
    g->max_clock[NVML_CLOCK_SM] = 1410;
    g->max_clock[NVML_CLOCK_MEM] = 1512;
    g->max_clock[NVML_CLOCK_VIDEO] = 1290;
    g->event_reasons = 0x1; /* nvmlClocksEventReasonGpuIdle */
    g->ecc_mode = 1;
    g->page_retirement_supported = 1;
    g->persistence = 1;
}

static void parse_procs(struct gpulab_device *g, char *v)
{
    char *save = NULL, *entry;
    g->nprocs = 0;
    for (entry = strtok_r(v, ";", &save); entry; entry = strtok_r(NULL, ";", &save)) {
        char *pid_s, *used_s, *name, *c1, *c2;
        struct gpulab_proc *p;
        entry = trim(entry);
        if (!*entry)
            continue;
        if (g->nprocs >= GPULAB_MAX_PROCS)
            break;
        pid_s = entry;
        c1 = strchr(pid_s, ':');
        used_s = c1 ? c1 + 1 : NULL;
        c2 = used_s ? strchr(used_s, ':') : NULL;
        name = c2 ? c2 + 1 : NULL;
        if (c1)
            *c1 = '\0';
        if (c2)
            *c2 = '\0';
        p = &g->procs[g->nprocs++];
        p->pid = parse_u32(trim(pid_s));
        p->used = used_s ? parse_u64(trim(used_s)) : 0;
        copy_field(p->name, sizeof(p->name), name ? trim(name) : "");
    }
}

static void set_device_key(struct gpulab_device *g, const char *k, char *v)
{
    if (!strcmp(k, "name")) copy_field(g->name, sizeof(g->name), v);
    else if (!strcmp(k, "uuid")) copy_field(g->uuid, sizeof(g->uuid), v);
    else if (!strcmp(k, "serial")) copy_field(g->serial, sizeof(g->serial), v);
    else if (!strcmp(k, "pci_bus_id")) {
        unsigned int d, b, dv, f;
        if (parse_bus_id(v, &d, &b, &dv, &f) == 0) {
            g->domain = d; g->bus = b; g->dev = dv; g->function = f;
        } else {
            g->domain = g->bus = g->dev = g->function = 0;
        }
    }
    else if (!strcmp(k, "pci_device_id")) g->pci_device_id = parse_u32(v);
    else if (!strcmp(k, "pci_subsystem_id")) g->pci_subsystem_id = parse_u32(v);
    else if (!strcmp(k, "memory_total")) g->mem_total = parse_u64(v);
    else if (!strcmp(k, "memory_reserved")) g->mem_reserved = parse_u64(v);
    else if (!strcmp(k, "memory_used")) { g->mem_used = parse_u64(v); g->mem_used_set = 1; }
    else if (!strcmp(k, "temperature")) g->temp = parse_u32(v);
    else if (!strcmp(k, "temp_shutdown")) g->temp_threshold[NVML_TEMPERATURE_THRESHOLD_SHUTDOWN] = parse_u32(v);
    else if (!strcmp(k, "temp_slowdown")) g->temp_threshold[NVML_TEMPERATURE_THRESHOLD_SLOWDOWN] = parse_u32(v);
    else if (!strcmp(k, "temp_mem_max")) g->temp_threshold[NVML_TEMPERATURE_THRESHOLD_MEM_MAX] = parse_u32(v);
    else if (!strcmp(k, "temp_gpu_max")) g->temp_threshold[NVML_TEMPERATURE_THRESHOLD_GPU_MAX] = parse_u32(v);
    else if (!strcmp(k, "power_mw")) g->power_mw = parse_u32(v);
    else if (!strcmp(k, "power_limit_mw")) g->power_limit_mw = parse_u32(v);
    else if (!strcmp(k, "util_gpu")) g->util_gpu = parse_u32(v);
    else if (!strcmp(k, "util_memory")) g->util_mem = parse_u32(v);
    else if (!strcmp(k, "clock_graphics")) g->clock[NVML_CLOCK_GRAPHICS] = parse_u32(v);
    else if (!strcmp(k, "clock_sm")) g->clock[NVML_CLOCK_SM] = parse_u32(v);
    else if (!strcmp(k, "clock_mem")) g->clock[NVML_CLOCK_MEM] = parse_u32(v);
    else if (!strcmp(k, "clock_video")) g->clock[NVML_CLOCK_VIDEO] = parse_u32(v);
    else if (!strcmp(k, "max_clock_graphics")) g->max_clock[NVML_CLOCK_GRAPHICS] = parse_u32(v);
    else if (!strcmp(k, "max_clock_sm")) g->max_clock[NVML_CLOCK_SM] = parse_u32(v);
    else if (!strcmp(k, "max_clock_mem")) g->max_clock[NVML_CLOCK_MEM] = parse_u32(v);
    else if (!strcmp(k, "max_clock_video")) g->max_clock[NVML_CLOCK_VIDEO] = parse_u32(v);
    else if (!strcmp(k, "clocks_event_reasons")) g->event_reasons = parse_u64(v);
    else if (!strcmp(k, "ecc_mode")) g->ecc_mode = parse_u32(v) ? 1 : 0;
    else if (!strcmp(k, "ecc_volatile_corrected")) g->ecc[NVML_MEMORY_ERROR_TYPE_CORRECTED][NVML_VOLATILE_ECC] = parse_u64(v);
    else if (!strcmp(k, "ecc_volatile_uncorrected")) g->ecc[NVML_MEMORY_ERROR_TYPE_UNCORRECTED][NVML_VOLATILE_ECC] = parse_u64(v);
    else if (!strcmp(k, "ecc_aggregate_corrected")) g->ecc[NVML_MEMORY_ERROR_TYPE_CORRECTED][NVML_AGGREGATE_ECC] = parse_u64(v);
    else if (!strcmp(k, "ecc_aggregate_uncorrected")) g->ecc[NVML_MEMORY_ERROR_TYPE_UNCORRECTED][NVML_AGGREGATE_ECC] = parse_u64(v);
    else if (!strcmp(k, "retired_sbe")) g->retired[NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS] = parse_u32(v);
    else if (!strcmp(k, "retired_dbe")) g->retired[NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR] = parse_u32(v);
    else if (!strcmp(k, "retired_pending")) g->retired_pending = parse_u32(v) ? 1 : 0;
    else if (!strcmp(k, "page_retirement_supported")) g->page_retirement_supported = parse_u32(v) ? 1 : 0;
    else if (!strcmp(k, "remapped_correctable")) g->remap_corr = parse_u32(v);
    else if (!strcmp(k, "remapped_uncorrectable")) g->remap_unc = parse_u32(v);
    else if (!strcmp(k, "remap_pending")) g->remap_pending = parse_u32(v) ? 1 : 0;
    else if (!strcmp(k, "remap_failure")) g->remap_failure = parse_u32(v) ? 1 : 0;
    else if (!strcmp(k, "persistence_mode")) g->persistence = parse_u32(v) ? 1 : 0;
    else if (!strcmp(k, "pstate")) { unsigned int p = parse_u32(v); g->pstate = p <= 15 ? p : 32; }
    else if (!strcmp(k, "lost")) g->lost = parse_u32(v) ? 1 : 0;
    else if (!strcmp(k, "fail_under_load")) g->fail_under_load = parse_u32(v) ? 1 : 0;
    else if (!strcmp(k, "procs")) parse_procs(g, v);
    /* anything else: ignored */
}

/* Parse <dir>/hw/gpus into *hw.  A missing or unreadable file yields the defaults. */
static void load_hw(struct gpulab_hw *hw, struct stat *st_out, int *st_valid)
{
    char path[4096];
    FILE *f;
    char *line = NULL;
    size_t cap = 0;
    unsigned int i;

    memset(hw, 0, sizeof(*hw));
    hw->count = 1;
    for (i = 0; i < GPULAB_MAX_GPUS; i++)
        device_defaults(&hw->dev[i], i);

    state_path(path, sizeof(path), "hw/gpus");
    f = fopen(path, "re");
    *st_valid = 0;
    if (!f)
        return;
    if (fstat(fileno(f), st_out) == 0)
        *st_valid = 1;
    while (getline(&line, &cap, f) != -1) {
        char *s = trim(line), *eq, *k, *v;
        if (!*s || *s == '#')
            continue;
        eq = strchr(s, '=');
        if (!eq)
            continue;
        *eq = '\0';
        k = trim(s);
        v = trim(eq + 1);
        if (!strcmp(k, "hang")) {
            hw->hang = parse_u32(v) ? 1 : 0;
        } else if (!strcmp(k, "gpu_count")) {
            unsigned int n = parse_u32(v);
            hw->count = n > GPULAB_MAX_GPUS ? GPULAB_MAX_GPUS : n;
        } else if (!strncmp(k, "gpu.", 4) && isdigit((unsigned char)k[4])) {
            char *end = NULL;
            unsigned long idx = strtoul(k + 4, &end, 10);
            if (end && *end == '.' && idx < GPULAB_MAX_GPUS)
                set_device_key(&hw->dev[idx], end + 1, v);
        }
    }
    free(line);
    fclose(f);
    for (i = 0; i < GPULAB_MAX_GPUS; i++) {
        struct gpulab_device *g = &hw->dev[i];
        if (!g->mem_used_set) {
            unsigned int p;
            g->mem_used = 4 * MiB;
            for (p = 0; p < g->nprocs; p++)
                g->mem_used += g->procs[p].used;
        }
        if (g->mem_reserved > g->mem_total)
            g->mem_reserved = g->mem_total;
        if (g->mem_used > g->mem_total - g->mem_reserved)
            g->mem_used = g->mem_total - g->mem_reserved;
    }
}

static int same_file(const struct stat *a, const struct stat *b)
{
    return a->st_ino == b->st_ino && a->st_dev == b->st_dev && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec;
}

static void commit_hw(void)
{
    /* copy field by field into the live array so outstanding handles stay valid */
    g_hw.hang = g_scratch.hang;
    g_hw.count = g_scratch.count;
    memcpy(g_hw.dev, g_scratch.dev, sizeof(g_hw.dev));
}

/* Called under g_lock with NVML initialised: pick up hw/gpus changes (cheap: one stat). */
static void refresh_hw(void)
{
    char path[4096];
    struct stat st;
    int exists;
    state_path(path, sizeof(path), "hw/gpus");
    exists = stat(path, &st) == 0;
    if (exists == g_hw_stat_valid && (!exists || same_file(&st, &g_hw_stat)))
        return;
    load_hw(&g_scratch, &g_hw_stat, &g_hw_stat_valid);
    commit_hw();
}

/* The load hook: <dir>/load read now (see STATE FILES).  Off when missing, unreadable or expired. */
struct gpulab_load {
    int on;
    unsigned int util_gpu, util_mem;
};

static void read_load(struct gpulab_load *l)
{
    char path[4096];
    FILE *f;
    char *line = NULL;
    size_t cap = 0;
    unsigned long long until = 0;
    l->on = 0;
    l->util_gpu = 100;
    l->util_mem = 45;
    state_path(path, sizeof(path), "load");
    f = fopen(path, "re");
    if (!f)
        return;
    while (getline(&line, &cap, f) != -1) {
        char *s = trim(line), *eq = strchr(s, '='), *k, *v;
        unsigned int u;
        if (!eq)
            continue;
        *eq = '\0';
        k = trim(s);
        v = trim(eq + 1);
        u = parse_u32(v);
        if (!strcmp(k, "until"))
            until = parse_u64(v);
        else if (!strcmp(k, "util_gpu"))
            l->util_gpu = u > 100 ? 100 : u;
        else if (!strcmp(k, "util_memory"))
            l->util_mem = u > 100 ? 100 : u;
    }
    free(line);
    fclose(f);
    l->on = until > (unsigned long long)time(NULL);
}

/* A GPU with fail_under_load is lost while the load hook is on. */
static int lost_now(const struct gpulab_device *g)
{
    struct gpulab_load l;
    if (g->lost)
        return 1;
    if (!g->fail_under_load)
        return 0;
    read_load(&l);
    return l.on;
}

/* 0: module loaded and matching; otherwise an NVML error */
static nvmlReturn_t check_module(void)
{
    char path[4096], buf[128];
    FILE *f;
    char *v;
    state_path(path, sizeof(path), "module");
    f = fopen(path, "re");
    if (!f)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (!fgets(buf, sizeof(buf), f))
        buf[0] = '\0';
    fclose(f);
    v = trim(buf);
    if (!*v)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (strcmp(v, g_lib_version) != 0)
        return NVML_ERROR_LIB_RM_VERSION_MISMATCH;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_out(char *dst, unsigned int length, const char *src)
{
    size_t need;
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    need = strlen(src) + 1;
    if ((size_t)length < need)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, need);
    return NVML_SUCCESS;
}

static void fmt_bus_id(const struct gpulab_device *g, char *out, size_t len)
{
    snprintf(out, len, "%08X:%02X:%02X.%X", g->domain, g->bus, g->dev, g->function);
}

static void fmt_bus_id_legacy(const struct gpulab_device *g, char *out, size_t len)
{
    snprintf(out, len, "%04X:%02X:%02X.%X", g->domain & 0xFFFFu, g->bus, g->dev, g->function);
}

/* Lock + initialised check.  On success the lock is held; on failure it is not. */
static nvmlReturn_t enter(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) {
        pthread_mutex_unlock(&g_lock);
        return NVML_ERROR_UNINITIALIZED;
    }
    refresh_hw();
    return NVML_SUCCESS;
}

static nvmlReturn_t leave(nvmlReturn_t r)
{
    pthread_mutex_unlock(&g_lock);
    return r;
}

static int valid_handle(nvmlDevice_t d)
{
    uintptr_t p = (uintptr_t)d, base = (uintptr_t)&g_hw.dev[0];
    if (p < base || p >= (uintptr_t)&g_hw.dev[GPULAB_MAX_GPUS])
        return 0;
    if ((p - base) % sizeof(struct gpulab_device) != 0)
        return 0;
    return d->magic == GPULAB_DEVICE_MAGIC && d->index < g_hw.count;
}

/* enter() + handle check.  On success the lock is held and *g is set. */
static nvmlReturn_t dev_enter(nvmlDevice_t d, struct gpulab_device **g)
{
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return r;
    if (!valid_handle(d))
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (lost_now(d))
        return leave(NVML_ERROR_GPU_IS_LOST);
    *g = d;
    return NVML_SUCCESS;
}

#define DEV_ENTER(device, g)                           \
    struct gpulab_device *g = NULL;                    \
    do {                                               \
        nvmlReturn_t r_ = dev_enter((device), &g);     \
        if (r_ != NVML_SUCCESS)                        \
            return r_;                                 \
    } while (0)

#define OUT_ARG(p)                                     \
    do {                                               \
        if (!(p))                                      \
            return leave(NVML_ERROR_INVALID_ARGUMENT); \
    } while (0)

/* ---- initialisation ------------------------------------------------------------------------------- */
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    nvmlReturn_t r;
    (void)flags; /* NO_GPUS: a zero-GPU bus already initialises; NO_ATTACH: nothing to attach */
    pthread_mutex_lock(&g_lock);
    r = check_module();
    if (r != NVML_SUCCESS)
        return leave(r);
    load_hw(&g_scratch, &g_hw_stat, &g_hw_stat_valid);
    if (g_scratch.hang) {
        /* The lab's "NVML hangs" fault: the ioctl to the driver never comes back. */
        pthread_mutex_unlock(&g_lock);
        for (;;)
            sleep(3600);
    }
    commit_hw();
    g_refcount++;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0)
        return leave(NVML_ERROR_UNINITIALIZED);
    g_refcount--;
    return leave(NVML_SUCCESS);
}

API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request.";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED:
        return "The requested vgpu operation is not available on target device, becasue ECC is enabled";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not Ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Unknown Error";
    }
}

/* ---- system queries ------------------------------------------------------------------------------- */
API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return r;
    return leave(copy_out(version, length, g_lib_version));
}

/* A property of the library itself: answers without nvmlInit (nvidia-smi uses it to print
 * "NVML library version: 535.216" after a failed init). */
API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    char buf[96];
    snprintf(buf, sizeof(buf), "%d.%s", cuda_driver_version() / 1000, g_lib_version);
    return copy_out(version, length, buf);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return r;
    OUT_ARG(cudaDriverVersion);
    *cudaDriverVersion = cuda_driver_version();
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

API nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    unsigned int i, p;
    char path[64], buf[256];
    FILE *f;
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return r;
    OUT_ARG(name);
    for (i = 0; i < g_hw.count; i++)
        for (p = 0; p < g_hw.dev[i].nprocs; p++)
            if (g_hw.dev[i].procs[p].pid == pid)
                return leave(copy_out(name, length, g_hw.dev[i].procs[p].name));
    snprintf(path, sizeof(path), "/proc/%u/comm", pid);
    f = fopen(path, "re");
    if (!f)
        return leave(NVML_ERROR_NOT_FOUND);
    if (!fgets(buf, sizeof(buf), f))
        buf[0] = '\0';
    fclose(f);
    return leave(copy_out(name, length, trim(buf)));
}

/* ---- enumeration ---------------------------------------------------------------------------------- */
API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return r;
    OUT_ARG(deviceCount);
    *deviceCount = g_hw.count;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

static nvmlReturn_t hand_out(struct gpulab_device *g, nvmlDevice_t *device)
{
    if (lost_now(g))
        return leave(NVML_ERROR_GPU_IS_LOST);
    *device = g;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return r;
    OUT_ARG(device);
    if (index >= g_hw.count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    return hand_out(&g_hw.dev[index], device);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    unsigned int i;
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return r;
    OUT_ARG(uuid);
    OUT_ARG(device);
    for (i = 0; i < g_hw.count; i++)
        if (!strcmp(g_hw.dev[i].uuid, uuid))
            return hand_out(&g_hw.dev[i], device);
    return leave(NVML_ERROR_NOT_FOUND);
}

API nvmlReturn_t nvmlDeviceGetHandleBySerial(const char *serial, nvmlDevice_t *device)
{
    unsigned int i;
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return r;
    OUT_ARG(serial);
    OUT_ARG(device);
    for (i = 0; i < g_hw.count; i++)
        if (!strcmp(g_hw.dev[i].serial, serial))
            return hand_out(&g_hw.dev[i], device);
    return leave(NVML_ERROR_NOT_FOUND);
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    unsigned int i, d, b, dv, f;
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return r;
    OUT_ARG(pciBusId);
    OUT_ARG(device);
    if (parse_bus_id(pciBusId, &d, &b, &dv, &f) != 0)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < g_hw.count; i++) {
        struct gpulab_device *g = &g_hw.dev[i];
        if (g->domain == d && g->bus == b && g->dev == dv && g->function == f)
            return hand_out(g, device);
    }
    return leave(NVML_ERROR_NOT_FOUND);
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

/* ---- identity ------------------------------------------------------------------------------------- */
API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    DEV_ENTER(device, g);
    return leave(copy_out(name, length, g->name));
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    DEV_ENTER(device, g);
    return leave(copy_out(uuid, length, g->uuid));
}

API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    DEV_ENTER(device, g);
    return leave(copy_out(serial, length, g->serial));
}

API nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version, unsigned int length)
{
    DEV_ENTER(device, g);
    return leave(copy_out(version, length, "92.00.9E.00.03"));
}

API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    DEV_ENTER(device, g);
    OUT_ARG(minorNumber);
    *minorNumber = g->index;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    DEV_ENTER(device, g);
    OUT_ARG(index);
    *index = g->index;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, int *type)
{
    DEV_ENTER(device, g);
    (void)g;
    OUT_ARG(type);
    *type = NVML_BRAND_NVIDIA;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device, unsigned int *arch)
{
    DEV_ENTER(device, g);
    (void)g;
    OUT_ARG(arch);
    *arch = NVML_DEVICE_ARCH_AMPERE;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor)
{
    DEV_ENTER(device, g);
    (void)g;
    OUT_ARG(major);
    OUT_ARG(minor);
    *major = 8;
    *minor = 0;
    return leave(NVML_SUCCESS);
}

static void fill_pci_v3(const struct gpulab_device *g, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof(*pci));
    fmt_bus_id_legacy(g, pci->busIdLegacy, sizeof(pci->busIdLegacy));
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->dev;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    fmt_bus_id(g, pci->busId, sizeof(pci->busId));
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    DEV_ENTER(device, g);
    OUT_ARG(pci);
    fill_pci_v3(g, pci);
    return leave(NVML_SUCCESS);
}

static nvmlReturn_t pci_legacy(nvmlDevice_t device, nvmlPciInfo_v2_t *pci)
{
    DEV_ENTER(device, g);
    OUT_ARG(pci);
    memset(pci, 0, sizeof(*pci));
    fmt_bus_id_legacy(g, pci->busId, sizeof(pci->busId));
    pci->domain = g->domain;
    pci->bus = g->bus;
    pci->device = g->dev;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_v2_t *pci) { return pci_legacy(device, pci); }
API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_v2_t *pci) { return pci_legacy(device, pci); }

/* ---- memory --------------------------------------------------------------------------------------- */
API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    DEV_ENTER(device, g);
    OUT_ARG(memory);
    /* v1 semantics: "used" includes the driver's reservation */
    memory->total = g->mem_total;
    memory->used = g->mem_used + g->mem_reserved;
    memory->free = g->mem_total - memory->used;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    DEV_ENTER(device, g);
    OUT_ARG(memory);
    if (memory->version != nvmlMemory_v2)
        return leave(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    memory->total = g->mem_total;
    memory->reserved = g->mem_reserved;
    memory->used = g->mem_used;
    memory->free = g->mem_total - g->mem_reserved - g->mem_used;
    return leave(NVML_SUCCESS);
}

/* ---- thermals, power, utilisation, clocks --------------------------------------------------------- */
API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensorType, unsigned int *temp)
{
    DEV_ENTER(device, g);
    OUT_ARG(temp);
    if (sensorType != NVML_TEMPERATURE_GPU)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *temp = g->temp;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, int thresholdType, unsigned int *temp)
{
    DEV_ENTER(device, g);
    OUT_ARG(temp);
    if (thresholdType < 0 || thresholdType >= NVML_TEMPERATURE_THRESHOLD_COUNT)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (thresholdType > NVML_TEMPERATURE_THRESHOLD_GPU_MAX) /* acoustic / GPS: not on datacenter parts */
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *temp = g->temp_threshold[thresholdType];
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    DEV_ENTER(device, g);
    (void)g;
    OUT_ARG(speed);
    return leave(NVML_ERROR_NOT_SUPPORTED); /* passively cooled datacenter board */
}

API nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed)
{
    (void)fan;
    return nvmlDeviceGetFanSpeed(device, speed);
}

API nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *numFans)
{
    DEV_ENTER(device, g);
    (void)g;
    OUT_ARG(numFans);
    *numFans = 0;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    DEV_ENTER(device, g);
    OUT_ARG(power);
    *power = g->power_mw;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    DEV_ENTER(device, g);
    OUT_ARG(limit);
    *limit = g->power_limit_mw;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    DEV_ENTER(device, g);
    OUT_ARG(limit);
    *limit = g->power_limit_mw;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device, unsigned int *limit)
{
    DEV_ENTER(device, g);
    (void)g;
    OUT_ARG(limit);
    *limit = 300000;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device, unsigned int *minLimit,
                                                              unsigned int *maxLimit)
{
    DEV_ENTER(device, g);
    (void)g;
    OUT_ARG(minLimit);
    OUT_ARG(maxLimit);
    *minLimit = 150000;
    *maxLimit = 300000;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
    DEV_ENTER(device, g);
    OUT_ARG(utilization);
    {
        struct gpulab_load l;
        read_load(&l);
        utilization->gpu = l.on && l.util_gpu > g->util_gpu ? l.util_gpu : g->util_gpu;
        utilization->memory = l.on && l.util_mem > g->util_mem ? l.util_mem : g->util_mem;
    }
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock)
{
    DEV_ENTER(device, g);
    OUT_ARG(clock);
    if (type < 0 || type >= NVML_CLOCK_COUNT)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *clock = g->clock[type];
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock)
{
    DEV_ENTER(device, g);
    OUT_ARG(clock);
    if (type < 0 || type >= NVML_CLOCK_COUNT)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    *clock = g->max_clock[type];
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    DEV_ENTER(device, g);
    OUT_ARG(reasons);
    *reasons = g->event_reasons;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

API nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    DEV_ENTER(device, g);
    (void)g;
    OUT_ARG(reasons);
    *reasons = GPULAB_SUPPORTED_EVENT_REASONS;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
    return nvmlDeviceGetSupportedClocksEventReasons(device, reasons);
}

API nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, int *pState)
{
    DEV_ENTER(device, g);
    OUT_ARG(pState);
    *pState = (int)g->pstate;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, int *pState)
{
    return nvmlDeviceGetPerformanceState(device, pState);
}

/* ---- modes ---------------------------------------------------------------------------------------- */
API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, int *mode)
{
    DEV_ENTER(device, g);
    OUT_ARG(mode);
    *mode = (int)g->persistence;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, int *display)
{
    DEV_ENTER(device, g);
    (void)g;
    OUT_ARG(display);
    *display = 0;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device, int *isActive)
{
    return nvmlDeviceGetDisplayMode(device, isActive);
}

API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, int *mode)
{
    DEV_ENTER(device, g);
    (void)g;
    OUT_ARG(mode);
    *mode = 0; /* NVML_COMPUTEMODE_DEFAULT */
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
    DEV_ENTER(device, g);
    (void)g;
    OUT_ARG(currentMode);
    OUT_ARG(pendingMode);
    *currentMode = 0; /* NVML_DEVICE_MIG_DISABLE */
    *pendingMode = 0;
    return leave(NVML_SUCCESS);
}

/* ---- ECC, page retirement, row remapping ---------------------------------------------------------- */
API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, int *current, int *pending)
{
    DEV_ENTER(device, g);
    OUT_ARG(current);
    OUT_ARG(pending);
    *current = (int)g->ecc_mode;
    *pending = (int)g->ecc_mode;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
                                             unsigned long long *eccCounts)
{
    DEV_ENTER(device, g);
    OUT_ARG(eccCounts);
    if (errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->ecc_mode)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *eccCounts = g->ecc[errorType][counterType];
    return leave(NVML_SUCCESS);
}

/* Synthetic but stable framebuffer page addresses / retirement times. */
static unsigned long long retired_address(int cause, unsigned int i)
{
    return (cause ? 0x7fd000ull : 0x3a1000ull) + (unsigned long long)i * 0x11ull;
}

static nvmlReturn_t retired_pages(nvmlDevice_t device, int cause, unsigned int *pageCount,
                                  unsigned long long *addresses, unsigned long long *timestamps)
{
    unsigned int n, i;
    DEV_ENTER(device, g);
    OUT_ARG(pageCount);
    if (cause < 0 || cause > 1)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    if (!g->page_retirement_supported)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    n = g->retired[cause];
    if (*pageCount < n) {
        *pageCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (n && !addresses)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < n; i++) {
        addresses[i] = retired_address(cause, i);
        if (timestamps)
            timestamps[i] = 1717200000ull + i * 3600ull;
    }
    *pageCount = n;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, int cause, unsigned int *pageCount,
                                           unsigned long long *addresses)
{
    return retired_pages(device, cause, pageCount, addresses, NULL);
}

API nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, int cause, unsigned int *pageCount,
                                              unsigned long long *addresses, unsigned long long *timestamps)
{
    return retired_pages(device, cause, pageCount, addresses, timestamps);
}

API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, int *isPending)
{
    DEV_ENTER(device, g);
    OUT_ARG(isPending);
    if (!g->page_retirement_supported)
        return leave(NVML_ERROR_NOT_SUPPORTED);
    *isPending = (int)g->retired_pending;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
                                           unsigned int *isPending, unsigned int *failureOccurred)
{
    DEV_ENTER(device, g);
    OUT_ARG(corrRows);
    OUT_ARG(uncRows);
    OUT_ARG(isPending);
    OUT_ARG(failureOccurred);
    *corrRows = g->remap_corr;
    *uncRows = g->remap_unc;
    *isPending = g->remap_pending;
    *failureOccurred = g->remap_failure;
    return leave(NVML_SUCCESS);
}

/* ---- processes ------------------------------------------------------------------------------------ */
#define GPULAB_JOB_BYTES (2048ull * MiB)

/* Processes with a compute context on GPU <index>: holding /dev/nvidia<index> and /dev/nvidia-uvm open (CUDA
 * opens both), appended to list[*n] unless already there (at most max). The driver daemons (nvidia-persistenced,
 * nv-fabricmanager) hold the device files without a context and without nvidia-uvm: NVML does not list them. */
static void device_holders(unsigned int index, struct gpulab_proc *list, unsigned int *n, unsigned int max)
{
    char want[32], fddir[64], link[320], target[64];
    DIR *proc = opendir("/proc");
    struct dirent *e;
    snprintf(want, sizeof(want), "/dev/nvidia%u", index);
    if (!proc)
        return;
    while ((e = readdir(proc)) && *n < max) {
        unsigned int pid, k, dup = 0, held;
        DIR *fds;
        struct dirent *f;
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        pid = (unsigned int)strtoul(e->d_name, NULL, 10);
        for (k = 0; k < *n; k++)
            if (list[k].pid == pid)
                dup = 1;
        if (dup || pid == (unsigned int)getpid())
            continue;
        snprintf(fddir, sizeof(fddir), "/proc/%u/fd", pid);
        if (!(fds = opendir(fddir)))
            continue;
        held = 0;
        while ((f = readdir(fds))) {
            ssize_t len;
            if (f->d_name[0] == '.')
                continue;
            snprintf(link, sizeof(link), "%s/%s", fddir, f->d_name);
            len = readlink(link, target, sizeof(target) - 1);
            if (len <= 0)
                continue;
            target[len] = '\0';
            if (!strcmp(target, want))
                held |= 1;
            else if (!strcmp(target, "/dev/nvidia-uvm"))
                held |= 2;
        }
        closedir(fds);
        if (held == 3) {
            list[*n].pid = pid;
            list[*n].used = GPULAB_JOB_BYTES;
            list[*n].name[0] = '\0';
            (*n)++;
        }
    }
    closedir(proc);
}

static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos, int v1,
                                      int graphics)
{
    unsigned int n, i;
    struct gpulab_proc all[GPULAB_MAX_PROCS];
    DEV_ENTER(device, g);
    OUT_ARG(infoCount);
    n = 0;
    if (!graphics) {
        for (i = 0; i < g->nprocs; i++)
            all[n++] = g->procs[i];
        device_holders(g->index, all, &n, GPULAB_MAX_PROCS);
    }
    if (*infoCount < n) {
        *infoCount = n;
        return leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    if (n && !infos)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    for (i = 0; i < n; i++) {
        if (v1) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            p->pid = all[i].pid;
            p->usedGpuMemory = all[i].used;
        } else {
            nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)infos + i;
            p->pid = all[i].pid;
            p->usedGpuMemory = all[i].used;
            p->gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT; /* MIG disabled */
            p->computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
        }
    }
    *infoCount = n;
    return leave(NVML_SUCCESS);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *i)
{
    return running_processes(d, c, i, 1, 0);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v2_t *i)
{
    return running_processes(d, c, i, 0, 0);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v2_t *i)
{
    return running_processes(d, c, i, 0, 0);
}
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v1_t *i)
{
    return running_processes(d, c, i, 1, 1);
}
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v2_t *i)
{
    return running_processes(d, c, i, 0, 1);
}
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_v2_t *i)
{
    return running_processes(d, c, i, 0, 1);
}

/* ---- lab-only helper (not part of NVML) ------------------------------------------------------------ */
/* nvidia-smi names a GPU it cannot open by its PCI address, which the real tool learns from the kernel
 * driver rather than through NVML.  This is that side channel: the legacy-format bus id ("0001:00:00.0")
 * of GPU <index>, needing no handle.  Requires nvmlInit. */
API nvmlReturn_t gpulabGetPciBusIdLegacyByIndex(unsigned int index, char *busId, unsigned int length)
{
    char buf[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    nvmlReturn_t r = enter();
    if (r != NVML_SUCCESS)
        return r;
    if (index >= g_hw.count)
        return leave(NVML_ERROR_INVALID_ARGUMENT);
    fmt_bus_id_legacy(&g_hw.dev[index], buf, sizeof(buf));
    return leave(copy_out(busId, length, buf));
}

/* The load hook's version (see STATE FILES, <dir>/load): its presence tells a program that this NVML is the
 * lab's and that writing <dir>/load stands for running a load on the GPUs.  Needs no init. */
API unsigned int gpulabLoadHookVersion(void)
{
    return 1;
}
