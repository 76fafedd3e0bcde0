/*
 * A burst of allocator reports through PyTorch's own libc10 on a GPU machine: the call the
 * caching allocator makes, from a library that imports c10::reportMemoryUsageToProfiler as
 * libc10_cuda does (so a preloaded shim gets it first). Built there against torch/lib:
 *
 *   gcc -O2 -shared -fPIC -o libburst.so libc10_burst.c -L$TORCH_LIB -lc10 -Wl,-rpath,$TORCH_LIB
 */
#include <stdint.h>

struct c10_device {
	int8_t type;
	int8_t index;
};

void report_memory_usage(void *ptr, int64_t size, uint64_t allocated, uint64_t reserved,
			 struct c10_device device) __asm__("_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE");

/* `count` reports: a 4 KiB block handed out and taken back, at 64 addresses, device 0. */
void burst(uint64_t count)
{
	struct c10_device cuda = { 1, 0 };

	for (uint64_t i = 0; i < count; i++)
		report_memory_usage((void *)(uintptr_t)(0x7f0000000000ull + (i / 2 % 64) * 4096),
				    i % 2 == 0 ? 4096 : -4096, i % 2 == 0 ? 4096 : 0, 2u << 20, cuda);
}
