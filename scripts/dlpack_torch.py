"""PyTorch <-> gpubind through DLPack (run on a GPU machine with torch).

    python3 scripts/dlpack_torch.py path/to/libdlpack_torch.so

Checks, printing one line each and exiting non-zero on the first failure:
1. torch takes a gpubind buffer (legacy and versioned capsules) and sees 0, 1, 2, ...
2. dropping the torch tensor calls gpubind's deleter, which frees the device memory;
3. gpubind takes a torch tensor and sums it correctly;
4. gpubind borrows torch's current stream (a non-default one) and scales a torch tensor
   on it; torch's next work on that stream sees the result.
"""
import ctypes
import sys

import torch
import torch.utils.dlpack as tdl

lib = ctypes.CDLL(sys.argv[1])
lib.gpubind_export_arange.restype = ctypes.c_void_p
lib.gpubind_export_arange.argtypes = [ctypes.c_uint64, ctypes.c_int]
lib.gpubind_import_sum.restype = ctypes.c_double
lib.gpubind_import_sum.argtypes = [ctypes.c_void_p]
lib.gpubind_free_bytes.restype = ctypes.c_uint64
lib.gpubind_scale_on_stream.restype = ctypes.c_int
lib.gpubind_scale_on_stream.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_float]

PyCapsule_New = ctypes.pythonapi.PyCapsule_New
PyCapsule_New.restype = ctypes.py_object
PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
PyCapsule_GetPointer.restype = ctypes.c_void_p
PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
PyCapsule_SetName = ctypes.pythonapi.PyCapsule_SetName
PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

torch.zeros(1, device="cuda")  # create torch's context (the same primary context)
torch.cuda.synchronize()
failed = False
n = 16 << 20  # 64 MiB of f32
for versioned, name in [(0, b"dltensor"), (1, b"dltensor_versioned")]:
    label = "versioned" if versioned else "legacy"
    free0 = lib.gpubind_free_bytes()
    ptr = lib.gpubind_export_arange(n, versioned)
    if not ptr:
        print(f"FAIL {label}: export returned null"); failed = True; continue
    try:
        t = tdl.from_dlpack(PyCapsule_New(ptr, name, None))
    except Exception as e:  # an older torch may not take versioned capsules
        print(f"FAIL {label}: torch.from_dlpack: {e}"); failed = True; continue
    free1 = lib.gpubind_free_bytes()
    ok = t.device.type == "cuda" and t.dtype == torch.float32 and t.shape == (n,)
    ok = ok and torch.equal(t.cpu(), torch.arange(n, dtype=torch.float32))
    print(f"{'ok' if ok else 'FAIL'} {label}: torch sees a {tuple(t.shape)} {t.dtype} tensor on {t.device}, values 0..{n - 1} {'match' if ok else 'DIFFER'}")
    failed |= not ok
    del t
    torch.cuda.synchronize()
    free2 = lib.gpubind_free_bytes()
    mib = lambda b: b / (1 << 20)
    freed = free2 - free1 >= (n * 4) * 0.9
    print(f"{'ok' if freed else 'FAIL'} {label}: device memory free before export / while torch holds it / after del: {mib(free0):.0f} / {mib(free1):.0f} / {mib(free2):.0f} MiB")
    failed |= not freed

x = torch.randn(1 << 20, device="cuda", dtype=torch.float32)
want = float(x.double().sum())
torch.cuda.synchronize()  # the producer's work must be complete before handing over
cap = tdl.to_dlpack(x)
ptr = PyCapsule_GetPointer(cap, b"dltensor")
PyCapsule_SetName(cap, b"used_dltensor")  # gpubind owns it now: torch must not delete it
got = lib.gpubind_import_sum(ptr)
ok = abs(got - want) <= 1e-3 * max(1.0, abs(want))
print(f"{'ok' if ok else 'FAIL'} import: gpubind summed the torch tensor to {got:.4f}, torch says {want:.4f}")
failed |= not ok

side = torch.cuda.Stream()  # torch's default stream is the legacy one: borrow another
with torch.cuda.stream(side):
    y = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    torch.cuda.current_stream().synchronize()  # the import contract: producer work done
    cap = tdl.to_dlpack(y)
    ptr = PyCapsule_GetPointer(cap, b"dltensor")
    PyCapsule_SetName(cap, b"used_dltensor")
    rc = lib.gpubind_scale_on_stream(ptr, torch.cuda.current_stream().cuda_stream, 3.0)
    total = float((y + 1).double().sum())  # on the same stream, after gpubind's kernel
want = 3.0 * (1 << 20) * ((1 << 20) - 1) / 2 + (1 << 20)
ok = rc == 0 and total == want
print(f"{'ok' if ok else 'FAIL'} borrowed stream: gpubind scaled a torch tensor on torch's stream {side.cuda_stream:#x} (rc {rc}), sum {total:.0f}, want {want:.0f}")
failed |= not ok
sys.exit(1 if failed else 0)
