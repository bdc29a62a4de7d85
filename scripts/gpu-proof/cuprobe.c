// cuprobe: loads libcuda.so.1 the way the CUDA runtime does (dlopen by SONAME, through
// the linker cache) and asks the driver API what it sees. Needs no CUDA headers or
// toolkit, only a C compiler: the proof script runs it on hosts without nvcc, and on
// driver trees without a GPU (then cuInit fails, cuDriverGetVersion still answers).
//
// Output, one `key=value` per line:
//   libcuda=<path the dynamic linker loaded>
//   driver_api=<cuDriverGetVersion, e.g. 12020>
//   init=<cuInit's CUresult, 0 = success>
//   devices=<count>                      (after a successful cuInit)
//   dev<N>=<name>|<PCI bus id>|<total memory MiB>
// Exit status: 0 when cuInit succeeded, 3 when it failed, 2 when libcuda did not load.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdio.h>

typedef int CUresult;
typedef int CUdevice;

int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("libcuda=none\nerror=%s\n", dlerror());
        return 2;
    }
    struct link_map *lm = NULL;
    if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm) printf("libcuda=%s\n", lm->l_name);

    CUresult (*driver_get_version)(int *) = (CUresult(*)(int *))dlsym(h, "cuDriverGetVersion");
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
    CUresult (*count)(int *) = (CUresult(*)(int *))dlsym(h, "cuDeviceGetCount");
    CUresult (*get)(CUdevice *, int) = (CUresult(*)(CUdevice *, int))dlsym(h, "cuDeviceGet");
    CUresult (*name)(char *, int, CUdevice) = (CUresult(*)(char *, int, CUdevice))dlsym(h, "cuDeviceGetName");
    CUresult (*bus)(char *, int, CUdevice) = (CUresult(*)(char *, int, CUdevice))dlsym(h, "cuDeviceGetPCIBusId");
    CUresult (*mem)(size_t *, CUdevice) = (CUresult(*)(size_t *, CUdevice))dlsym(h, "cuDeviceTotalMem_v2");
    if (!driver_get_version || !init || !count || !get || !name || !bus || !mem) {
        printf("error=libcuda lacks a driver API symbol\n");
        return 2;
    }
    int v = 0;
    printf("driver_api=%d\n", driver_get_version(&v) == 0 ? v : -1);
    CUresult r = init(0);
    printf("init=%d\n", r);
    if (r != 0) return 3;
    int n = 0;
    count(&n);
    printf("devices=%d\n", n);
    for (int i = 0; i < n; i++) {
        CUdevice d;
        char nm[256] = "", id[64] = "";
        size_t bytes = 0;
        get(&d, i);
        name(nm, sizeof nm, d);
        bus(id, sizeof id, d);
        mem(&bytes, d);
        printf("dev%d=%s|%s|%zu\n", i, nm, id, bytes >> 20);
    }
    return 0;
}
