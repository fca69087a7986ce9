"""Keep a real NVIDIA GPU busy through the CUDA driver API alone (no CUDA toolkit needed).

    python bench/cuda_load.py GIB SECONDS

Allocates GIB GiB on the first visible GPU and launches a spinning kernel
(PTX, compiled by the driver) back to back for SECONDS; exits 3 when there is
no CUDA driver or GPU.
"""

from __future__ import annotations

import ctypes
import sys
import time

PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry spin(.param .u64 out, .param .u64 n)
{
    .reg .u64 %rd<6>;
    .reg .pred %p;
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [n];
    mov.u64 %rd3, 0;
LOOP:
    add.u64 %rd3, %rd3, 1;
    setp.lt.u64 %p, %rd3, %rd2;
    @%p bra LOOP;
    cvta.to.global.u64 %rd4, %rd1;
    st.global.u64 [%rd4], %rd3;
    ret;
}
"""


def check(result: int, what: str) -> None:
    if result != 0:
        print(f"cuda_load: {what} failed with CUDA error {result}", file=sys.stderr)
        sys.exit(3)


def main() -> None:
    gib, seconds = float(sys.argv[1]), float(sys.argv[2])
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        print(f"cuda_load: no CUDA driver: {exc}", file=sys.stderr)
        sys.exit(3)
    check(cuda.cuInit(0), "cuInit")
    device, context, module, kernel = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    check(cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device), "cuCtxCreate")
    memory = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(memory), ctypes.c_size_t(int(gib * 1024 ** 3))), "cuMemAlloc")
    check(cuda.cuMemsetD8_v2(memory, 1, ctypes.c_size_t(int(gib * 1024 ** 3))), "cuMemset")  # make it resident
    check(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX)), "cuModuleLoadData")
    check(cuda.cuModuleGetFunction(ctypes.byref(kernel), module, b"spin"), "cuModuleGetFunction")
    out, n = ctypes.c_uint64(memory.value), ctypes.c_uint64(20_000_000)
    params = (ctypes.c_void_p * 2)(ctypes.cast(ctypes.byref(out), ctypes.c_void_p),
                                   ctypes.cast(ctypes.byref(n), ctypes.c_void_p))
    print("cuda_load: busy", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        check(cuda.cuLaunchKernel(kernel, 1024, 1, 1, 128, 1, 1, 0, None, params, None), "cuLaunchKernel")
        check(cuda.cuCtxSynchronize(), "cuCtxSynchronize")


if __name__ == "__main__":
    main()
