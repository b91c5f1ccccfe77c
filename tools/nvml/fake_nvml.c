/* A test NVML library: the NVML symbols nvidia-ml-py calls for kvcap's nvml source,
 * answered from a small text file that is read again on every call, so a test can
 * change GPUs, memory and injected errors while the exporter runs.
 *
 * Built against NVIDIA's own nvml.h (PyPI nvidia-nvml-dev) by tests/nvml/build.py.
 * The config file is named by $FAKE_NVML_CONFIG; its lines (tests/nvml/fake.py writes them):
 *
 *   driver 550.54.15
 *   init_error 9                      nvmlInitWithFlags returns this code
 *   fail nvmlDeviceGetMemoryInfo_v2 13  this symbol returns this code (13: not found)
 *   gpu 0 uuid=GPU-... name=NVIDIA_H200 pci=00000000:18:00.0 total=N used=N free=N
 *         reserved=N error=0 mig=0     mig: 0, 1, or na (GetMigMode not supported);
 *                                      error: every call on the GPU returns it (15: lost)
 *   mig 3 1 uuid=MIG-... name=... total=N used=N free=N reserved=N
 *                                      a MIG device of GPU 3 with GPU instance id 1
 *   process 0 1234 1073741824          a process on GPU 0 ("3/1": on MIG instance 1 of GPU 3;
 *                                      "na" as the size: NVML_VALUE_NOT_AVAILABLE)
 *
 * Underscores in names stand for spaces. A missing config file is a driver that is not
 * loaded. Handles point into static arrays, so they stay valid when the file changes.
 */

#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <nvml.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GPUS 16
#define MAX_MIG 7
#define MAX_PROCS 256
#define MAX_FAILS 32
#define NO_MIG (-1)

struct nvmlDevice_st {
    int gpu;
    int mig; /* NO_MIG for the GPU itself */
};

struct fake_device {
    int present;
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    char pci[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
    unsigned long long total, used, free, reserved;
    int error;
    int mig_mode; /* -1: not supported */
    unsigned int instance_id;
};

struct fake_process {
    char device[16];
    unsigned int pid;
    unsigned long long used;
};

struct fake_config {
    char driver[NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE];
    int init_error;
    unsigned int gpu_count;
    struct fake_device gpus[MAX_GPUS];
    struct fake_device migs[MAX_GPUS][MAX_MIG];
    int process_count;
    struct fake_process processes[MAX_PROCS];
    int fail_count;
    struct {
        char symbol[64];
        int code;
    } fails[MAX_FAILS];
};

static struct nvmlDevice_st gpu_handles[MAX_GPUS];
static struct nvmlDevice_st mig_handles[MAX_GPUS][MAX_MIG];
static int init_refcount;
static unsigned long long call_count;

/* Test hooks, not NVML: how many NVML calls were made, and the init reference count. */
unsigned long long fake_nvml_call_count(void) { return __atomic_load_n(&call_count, __ATOMIC_SEQ_CST); }
int fake_nvml_init_refcount(void) { return __atomic_load_n(&init_refcount, __ATOMIC_SEQ_CST); }

static void copy_field(char *target, size_t size, const char *value) {
    size_t i;
    for (i = 0; i + 1 < size && value[i]; i++) {
        target[i] = value[i] == '_' ? ' ' : value[i];
    }
    target[i] = '\0';
}

static unsigned long long number(const char *value) {
    if (strcmp(value, "na") == 0) {
        return (unsigned long long)NVML_VALUE_NOT_AVAILABLE;
    }
    return strtoull(value, NULL, 10);
}

static void device_field(struct fake_device *device, const char *key, const char *value) {
    if (strcmp(key, "uuid") == 0) {
        snprintf(device->uuid, sizeof device->uuid, "%s", value);
    } else if (strcmp(key, "name") == 0) {
        copy_field(device->name, sizeof device->name, value);
    } else if (strcmp(key, "pci") == 0) {
        snprintf(device->pci, sizeof device->pci, "%s", value);
    } else if (strcmp(key, "total") == 0) {
        device->total = number(value);
    } else if (strcmp(key, "used") == 0) {
        device->used = number(value);
    } else if (strcmp(key, "free") == 0) {
        device->free = number(value);
    } else if (strcmp(key, "reserved") == 0) {
        device->reserved = number(value);
    } else if (strcmp(key, "error") == 0) {
        device->error = atoi(value);
    } else if (strcmp(key, "lost") == 0) {
        device->error = atoi(value) ? NVML_ERROR_GPU_IS_LOST : device->error;
    } else if (strcmp(key, "mig") == 0) {
        device->mig_mode = strcmp(value, "na") == 0 ? -1 : atoi(value);
    }
}

static void device_fields(struct fake_device *device, char *rest) {
    char *saved = NULL;
    for (char *word = strtok_r(rest, " \t", &saved); word; word = strtok_r(NULL, " \t", &saved)) {
        char *equals = strchr(word, '=');
        if (equals) {
            *equals = '\0';
            device_field(device, word, equals + 1);
        }
    }
}

/* Fills `config`; 0 when the file could not be read. */
static int load_config(struct fake_config *config) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    FILE *file = path ? fopen(path, "r") : NULL;
    if (!file) {
        return 0;
    }
    char line[1024];
    while (fgets(line, sizeof line, file)) {
        line[strcspn(line, "\r\n#")] = '\0';
        char kind[16], first[64], second[64];
        int used = 0;
        if (sscanf(line, "%15s%n", kind, &used) != 1) {
            continue;
        }
        char *rest = line + used;
        if (strcmp(kind, "driver") == 0) {
            sscanf(rest, "%79s", config->driver);
        } else if (strcmp(kind, "init_error") == 0) {
            config->init_error = atoi(rest);
        } else if (strcmp(kind, "fail") == 0 && config->fail_count < MAX_FAILS) {
            if (sscanf(rest, "%63s %63s", first, second) == 2) {
                snprintf(config->fails[config->fail_count].symbol, 64, "%s", first);
                config->fails[config->fail_count++].code = atoi(second);
            }
        } else if (strcmp(kind, "gpu") == 0) {
            unsigned int index;
            if (sscanf(rest, "%u%n", &index, &used) == 1 && index < MAX_GPUS) {
                struct fake_device *gpu = &config->gpus[index];
                gpu->present = 1;
                device_fields(gpu, rest + used);
                if (index + 1 > config->gpu_count) {
                    config->gpu_count = index + 1;
                }
            }
        } else if (strcmp(kind, "mig") == 0) {
            unsigned int index, instance;
            if (sscanf(rest, "%u %u%n", &index, &instance, &used) == 2 && index < MAX_GPUS) {
                for (int slot = 0; slot < MAX_MIG; slot++) {
                    struct fake_device *mig = &config->migs[index][slot];
                    if (!mig->present) {
                        mig->present = 1;
                        mig->instance_id = instance;
                        device_fields(mig, rest + used);
                        break;
                    }
                }
            }
        } else if (strcmp(kind, "process") == 0 && config->process_count < MAX_PROCS) {
            struct fake_process *process = &config->processes[config->process_count];
            if (sscanf(rest, "%15s %u %63s", process->device, &process->pid, second) == 3) {
                process->used = number(second);
                config->process_count++;
            }
        }
    }
    fclose(file);
    return 1;
}

/* One NVML call: the config as it is now, and the device the call is about. */
struct call {
    struct fake_config *config;
    struct fake_device *device;
    nvmlDevice_t handle;
};

static nvmlReturn_t finish(struct call *call, nvmlReturn_t result) {
    free(call->config);
    return result;
}

static nvmlReturn_t begin(struct call *call, const char *symbol, int needs_init) {
    __atomic_add_fetch(&call_count, 1, __ATOMIC_SEQ_CST);
    call->device = NULL;
    call->handle = NULL;
    call->config = calloc(1, sizeof *call->config);
    if (!call->config) {
        return NVML_ERROR_MEMORY;
    }
    if (!load_config(call->config)) {
        return needs_init ? NVML_ERROR_UNKNOWN : NVML_ERROR_DRIVER_NOT_LOADED;
    }
    if (needs_init && __atomic_load_n(&init_refcount, __ATOMIC_SEQ_CST) == 0) {
        return NVML_ERROR_UNINITIALIZED;
    }
    for (int i = 0; i < call->config->fail_count; i++) {
        if (strcmp(call->config->fails[i].symbol, symbol) == 0) {
            return (nvmlReturn_t)call->config->fails[i].code;
        }
    }
    return NVML_SUCCESS;
}

/* begin() for a call on a device handle: a lost parent GPU loses its MIG devices too. */
static nvmlReturn_t begin_device(struct call *call, const char *symbol, nvmlDevice_t handle) {
    nvmlReturn_t result = begin(call, symbol, 1);
    if (result != NVML_SUCCESS) {
        return result;
    }
    struct fake_config *config = call->config;
    const struct nvmlDevice_st *first_gpu = &gpu_handles[0], *first_mig = &mig_handles[0][0];
    if (handle >= first_gpu && handle < first_gpu + MAX_GPUS && handle->mig == NO_MIG) {
        call->device = &config->gpus[handle->gpu];
    } else if (handle >= first_mig && handle < first_mig + MAX_GPUS * MAX_MIG) {
        call->device = &config->migs[handle->gpu][handle->mig];
    } else {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    struct fake_device *parent = &config->gpus[handle->gpu];
    if (!parent->present || !call->device->present) {
        return NVML_ERROR_GPU_IS_LOST; /* the GPU is gone from the config: fell off the bus */
    }
    if (parent->error) {
        return (nvmlReturn_t)parent->error;
    }
    if (call->device->error) {
        return (nvmlReturn_t)call->device->error;
    }
    call->handle = handle;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_out(char *target, unsigned int length, const char *value) {
    if (!target || strlen(value) + 1 > length) {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(target, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    struct call call;
    nvmlReturn_t result = begin(&call, __func__, 0);
    if (result == NVML_SUCCESS && call.config->init_error) {
        result = (nvmlReturn_t)call.config->init_error;
    }
    if (result == NVML_SUCCESS) {
        __atomic_add_fetch(&init_refcount, 1, __ATOMIC_SEQ_CST);
    }
    return finish(&call, result);
}

nvmlReturn_t DECLDIR nvmlShutdown(void) {
    int count = __atomic_load_n(&init_refcount, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&call_count, 1, __ATOMIC_SEQ_CST);
    while (count > 0) {
        if (__atomic_compare_exchange_n(&init_refcount, &count, count - 1, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST)) {
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_UNINITIALIZED;
}

const DECLDIR char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    case NVML_ERROR_UNKNOWN: return "Unknown Error";
    default: return "Fake NVML error";
    }
}

nvmlReturn_t DECLDIR nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    struct call call;
    nvmlReturn_t result = begin(&call, __func__, 1);
    if (result == NVML_SUCCESS) {
        result = copy_out(version, length, call.config->driver);
    }
    return finish(&call, result);
}

nvmlReturn_t DECLDIR nvmlDeviceGetCount_v2(unsigned int *count) {
    struct call call;
    nvmlReturn_t result = begin(&call, __func__, 1);
    if (result == NVML_SUCCESS) {
        *count = call.config->gpu_count;
    }
    return finish(&call, result);
}

nvmlReturn_t DECLDIR nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    struct call call;
    nvmlReturn_t result = begin(&call, __func__, 1);
    if (result == NVML_SUCCESS && index >= call.config->gpu_count) {
        result = NVML_ERROR_INVALID_ARGUMENT;
    } else if (result == NVML_SUCCESS && call.config->gpus[index].error) {
        result = (nvmlReturn_t)call.config->gpus[index].error;
    } else if (result == NVML_SUCCESS) {
        gpu_handles[index].gpu = (int)index;
        gpu_handles[index].mig = NO_MIG;
        *device = &gpu_handles[index];
    }
    return finish(&call, result);
}

nvmlReturn_t DECLDIR nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    struct call call;
    nvmlReturn_t result = begin_device(&call, __func__, device);
    if (result == NVML_SUCCESS) {
        result = copy_out(uuid, length, call.device->uuid);
    }
    return finish(&call, result);
}

nvmlReturn_t DECLDIR nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    struct call call;
    nvmlReturn_t result = begin_device(&call, __func__, device);
    if (result == NVML_SUCCESS) {
        result = copy_out(name, length, call.device->name);
    }
    return finish(&call, result);
}

nvmlReturn_t DECLDIR nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    struct call call;
    nvmlReturn_t result = begin_device(&call, __func__, device);
    if (result == NVML_SUCCESS) {
        /* A MIG device reports its parent's PCI address. */
        const struct fake_device *gpu = &call.config->gpus[device->gpu];
        memset(pci, 0, sizeof *pci);
        snprintf(pci->busId, sizeof pci->busId, "%s", gpu->pci);
        sscanf(gpu->pci, "%x:%x:%x", &pci->domain, &pci->bus, &pci->device);
        snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT,
                 pci->domain & 0xFFFF, pci->bus, pci->device);
    }
    return finish(&call, result);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    struct call call;
    nvmlReturn_t result = begin_device(&call, __func__, device);
    if (result == NVML_SUCCESS) {
        /* v1 counts the reserved memory as used. */
        memory->total = call.device->total;
        memory->used = call.device->used + call.device->reserved;
        memory->free = call.device->free;
    }
    return finish(&call, result);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    struct call call;
    nvmlReturn_t result = begin_device(&call, __func__, device);
    if (result == NVML_SUCCESS && memory->version != nvmlMemory_v2) {
        result = NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    } else if (result == NVML_SUCCESS) {
        memory->total = call.device->total;
        memory->reserved = call.device->reserved;
        memory->used = call.device->used;
        memory->free = call.device->free;
    }
    return finish(&call, result);
}

static nvmlReturn_t running_processes(struct call *call, unsigned int *count,
                                      nvmlProcessInfo_t *infos) {
    char name[16];
    const struct nvmlDevice_st *handle = call->handle;
    if (handle->mig == NO_MIG) {
        snprintf(name, sizeof name, "%d", handle->gpu);
    } else {
        snprintf(name, sizeof name, "%d/%u", handle->gpu, call->device->instance_id);
    }
    unsigned int found = 0;
    for (int i = 0; i < call->config->process_count; i++) {
        found += strcmp(call->config->processes[i].device, name) == 0;
    }
    if (found > *count || (found > 0 && !infos)) {
        *count = found;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *count = 0;
    for (int i = 0; i < call->config->process_count; i++) {
        const struct fake_process *process = &call->config->processes[i];
        if (strcmp(process->device, name) == 0) {
            nvmlProcessInfo_t *info = &infos[(*count)++];
            info->pid = process->pid;
            info->usedGpuMemory = process->used;
            info->gpuInstanceId = handle->mig == NO_MIG ? 0xFFFFFFFF : call->device->instance_id;
            info->computeInstanceId = handle->mig == NO_MIG ? 0xFFFFFFFF : 0;
        }
    }
    return NVML_SUCCESS;
}

nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                             unsigned int *count,
                                                             nvmlProcessInfo_t *infos) {
    struct call call;
    nvmlReturn_t result = begin_device(&call, __func__, device);
    if (result == NVML_SUCCESS) {
        result = running_processes(&call, count, infos);
    }
    return finish(&call, result);
}

/* Drivers before 510 have only _v2; its struct has the same layout. */
nvmlReturn_t DECLDIR nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                             unsigned int *count,
                                                             nvmlProcessInfo_v2_t *infos) {
    struct call call;
    nvmlReturn_t result = begin_device(&call, __func__, device);
    if (result == NVML_SUCCESS) {
        result = running_processes(&call, count, infos);
    }
    return finish(&call, result);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *current,
                                          unsigned int *pending) {
    struct call call;
    nvmlReturn_t result = begin_device(&call, __func__, device);
    if (result == NVML_SUCCESS && (device->mig != NO_MIG || call.device->mig_mode < 0)) {
        result = NVML_ERROR_NOT_SUPPORTED;
    } else if (result == NVML_SUCCESS) {
        *current = *pending = (unsigned int)call.device->mig_mode;
    }
    return finish(&call, result);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    struct call call;
    nvmlReturn_t result = begin_device(&call, __func__, device);
    if (result == NVML_SUCCESS && (device->mig != NO_MIG || call.device->mig_mode < 0)) {
        result = NVML_ERROR_NOT_SUPPORTED;
    } else if (result == NVML_SUCCESS) {
        *count = MAX_MIG;
    }
    return finish(&call, result);
}

nvmlReturn_t DECLDIR nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                         nvmlDevice_t *mig_device) {
    struct call call;
    nvmlReturn_t result = begin_device(&call, __func__, device);
    if (result == NVML_SUCCESS && (device->mig != NO_MIG || call.device->mig_mode != 1)) {
        result = NVML_ERROR_INVALID_ARGUMENT;
    } else if (result == NVML_SUCCESS && index >= MAX_MIG) {
        result = NVML_ERROR_INVALID_ARGUMENT;
    } else if (result == NVML_SUCCESS && !call.config->migs[device->gpu][index].present) {
        result = NVML_ERROR_NOT_FOUND;
    } else if (result == NVML_SUCCESS) {
        mig_handles[device->gpu][index].gpu = device->gpu;
        mig_handles[device->gpu][index].mig = (int)index;
        *mig_device = &mig_handles[device->gpu][index];
    }
    return finish(&call, result);
}

nvmlReturn_t DECLDIR nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    struct call call;
    nvmlReturn_t result = begin_device(&call, __func__, device);
    if (result == NVML_SUCCESS && device->mig == NO_MIG) {
        result = NVML_ERROR_NOT_SUPPORTED;
    } else if (result == NVML_SUCCESS) {
        *id = call.device->instance_id;
    }
    return finish(&call, result);
}
