/* A stand-in libcuda.so.1 for CPU-only profiling of gpubind's host-side cost
 * (scripts/profile-overhead.sh). Every call succeeds at once and hands out fake handles;
 * nothing runs. It is NOT a test double for correctness: no test uses it, and nothing it
 * returns means anything beyond "the call was made". One device, one primary context. */
#include <stdint.h>
#include <stddef.h>
#include <string.h>

typedef int CUresult;
typedef void *H;
static __thread H current;           /* the thread's current context */
static H stack[64]; static __thread int depth;
static uintptr_t next_handle = 0x1000, next_ptr = 0x7f0000000000;
static H fresh(void) { return (H)(next_handle += 16); }

#define OK return 0
CUresult cuInit(unsigned f) { (void)f; OK; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; OK; }
CUresult cuDeviceGetCount(int *n) { *n = 1; OK; }
CUresult cuDeviceGet(int *d, int o) { *d = o; OK; }
CUresult cuDeviceGetAttribute(int *v, int attr, int d) {
  (void)d;
  switch (attr) {
  case 1: *v = 1024; break;               /* max threads per block */
  case 2: case 3: *v = 1024; break;       /* block x, y */
  case 4: *v = 64; break;                 /* block z */
  case 5: *v = 2147483647; break;         /* grid x */
  case 6: case 7: *v = 65535; break;      /* grid y, z */
  case 8: *v = 49152; break;              /* shared per block */
  case 75: *v = 9; break; case 76: *v = 0; break; /* compute capability */
  case 97: *v = 232448; break;            /* shared optin */
  default: *v = 1; break;
  }
  OK;
}
CUresult cuDeviceGetName(char *n, int len, int d) { (void)d; strncpy(n, "stub", len); OK; }
CUresult cuDeviceGetUuid(char *u, int d) { (void)d; memset(u, 7, 16); OK; }
CUresult cuDeviceGetUuid_v2(char *u, int d) { (void)d; memset(u, 7, 16); OK; }
CUresult cuDeviceTotalMem_v2(size_t *b, int d) { (void)d; *b = (size_t)1 << 34; OK; }
CUresult cuDevicePrimaryCtxRetain(H *c, int d) { *c = (H)(uintptr_t)(0x100 + d); OK; }
CUresult cuDevicePrimaryCtxRelease_v2(int d) { (void)d; OK; }
CUresult cuDevicePrimaryCtxGetState(int d, unsigned *f, int *a) { (void)d; *f = 0; *a = 1; OK; }
CUresult cuCtxGetCurrent(H *c) { *c = current; OK; }
CUresult cuCtxSetCurrent(H c) { current = c; OK; }
CUresult cuCtxPushCurrent_v2(H c) { stack[depth++ & 63] = current; current = c; OK; }
CUresult cuCtxPopCurrent_v2(H *c) { if (c) *c = current; current = stack[--depth & 63]; OK; }
CUresult cuCtxSynchronize(void) { OK; }
CUresult cuCtxGetDevice(int *d) { *d = 0; OK; }
CUresult cuStreamCreate(H *s, unsigned f) { (void)f; *s = fresh(); OK; }
CUresult cuStreamCreateWithPriority(H *s, unsigned f, int p) { (void)f; (void)p; *s = fresh(); OK; }
CUresult cuStreamDestroy_v2(H s) { (void)s; OK; }
CUresult cuStreamSynchronize(H s) { (void)s; OK; }
CUresult cuStreamQuery(H s) { (void)s; OK; }
CUresult cuStreamWaitEvent(H s, H e, unsigned f) { (void)s; (void)e; (void)f; OK; }
CUresult cuEventCreate(H *e, unsigned f) { (void)f; *e = fresh(); OK; }
CUresult cuEventDestroy_v2(H e) { (void)e; OK; }
CUresult cuEventRecord(H e, H s) { (void)e; (void)s; OK; }
CUresult cuEventSynchronize(H e) { (void)e; OK; }
CUresult cuEventQuery(H e) { (void)e; OK; }
CUresult cuMemAlloc_v2(uintptr_t *p, size_t b) { *p = next_ptr; next_ptr += (b + 4095) & ~(size_t)4095; OK; }
CUresult cuMemFree_v2(uintptr_t p) { (void)p; OK; }
CUresult cuDeviceGetDefaultMemPool(H *p, int d) { (void)d; *p = (H)(uintptr_t)0x200; OK; }
CUresult cuMemAllocFromPoolAsync(uintptr_t *p, size_t b, H pool, H s) {
  (void)pool; (void)s; *p = next_ptr; next_ptr += (b + 4095) & ~(size_t)4095; OK; }
CUresult cuMemAllocAsync(uintptr_t *p, size_t b, H s) {
  (void)s; *p = next_ptr; next_ptr += (b + 4095) & ~(size_t)4095; OK; }
CUresult cuMemFreeAsync(uintptr_t p, H s) { (void)p; (void)s; OK; }
static __thread int capture_mode;    /* the thread's capture mode (0: global) */
CUresult cuThreadExchangeStreamCaptureMode(int *m) {
  int old = capture_mode; capture_mode = *m; *m = old; OK;
}
CUresult cuStreamIsCapturing(H s, int *st) { (void)s; *st = 0; OK; }
CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = *t = (size_t)1 << 34; OK; }
CUresult cuMemsetD8Async(uintptr_t p, unsigned char v, size_t n, H s) { (void)p; (void)v; (void)n; (void)s; OK; }
CUresult cuMemsetD8_v2(uintptr_t p, unsigned char v, size_t n) { (void)p; (void)v; (void)n; OK; }
CUresult cuMemcpyHtoDAsync_v2(uintptr_t d, const void *h, size_t n, H s) { (void)d; (void)h; (void)n; (void)s; OK; }
CUresult cuMemcpyHtoD_v2(uintptr_t d, const void *h, size_t n) { (void)d; (void)h; (void)n; OK; }
CUresult cuMemcpyDtoH_v2(void *h, uintptr_t d, size_t n) { (void)d; memset(h, 0, n); OK; }
CUresult cuModuleLoadData(H *m, const void *img) { (void)img; *m = fresh(); OK; }
CUresult cuModuleLoadDataEx(H *m, const void *img, unsigned n, void *o, void **v) {
  (void)img; (void)n; (void)o; (void)v; *m = fresh(); OK; }
CUresult cuModuleUnload(H m) { (void)m; OK; }
/* Functions: "empty" takes nothing; any other name takes (ptr, ptr, u32). */
CUresult cuModuleGetFunction(H *f, H m, const char *name) {
  (void)m; *f = (H)(uintptr_t)(strcmp(name, "empty") == 0 ? 1 : 2); OK; }
CUresult cuFuncGetParamInfo(H f, size_t i, size_t *off, size_t *size) {
  if ((uintptr_t)f == 1 || i >= 3) return 1; /* CUDA_ERROR_INVALID_VALUE: past the last */
  *off = i * 8; *size = i == 2 ? 4 : 8; OK; }
CUresult cuFuncGetAttribute(int *v, int attr, H f) {
  (void)f; *v = attr == 0 ? 1024 : (attr == 1 ? 0 : 49152); OK; } /* max threads, static shared */
CUresult cuFuncSetAttribute(H f, int a, int v) { (void)f; (void)a; (void)v; OK; }
CUresult cuLaunchKernel(H f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned sh, H s, void **p, void **e) {
  (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)s;
  (void)p; (void)e; OK; }
CUresult cuGetErrorName(CUresult r, const char **s) { (void)r; *s = "CUDA_ERROR_STUB"; OK; }
CUresult cuGetErrorString(CUresult r, const char **s) { (void)r; *s = "stub"; OK; }
/* Entry points gpubind looks up by version (src/compat.rs): the ones the stand-in has. */
CUresult cuEventElapsedTime(float *ms, H a, H b) { (void)a; (void)b; *ms = 1.0f; OK; }
CUresult cuEventElapsedTime_v2(float *ms, H a, H b) { (void)a; (void)b; *ms = 1.0f; OK; }
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                             int *status) {
  (void)version; (void)flags;
  *pfn = 0;
  if (strcmp(symbol, "cuFuncGetParamInfo") == 0) *pfn = (void *)cuFuncGetParamInfo;
  else if (strcmp(symbol, "cuEventElapsedTime") == 0)
    *pfn = version >= 12080 ? (void *)cuEventElapsedTime_v2 : (void *)cuEventElapsedTime;
  if (status) *status = *pfn ? 0 : 1; /* CU_GET_PROC_ADDRESS_SUCCESS / SYMBOL_NOT_FOUND */
  return *pfn ? 0 : 500;              /* CUDA_ERROR_NOT_FOUND */
}
