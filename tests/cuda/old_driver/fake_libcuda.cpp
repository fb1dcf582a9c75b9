// A stand-in for the CUDA driver library (libcuda.so.1) of a machine whose driver is older than the
// runtime: it reports CUDA 11.4 and offers nothing else, so the runtime answers
// cudaErrorInsufficientDriver, as it does on a GPU machine with an old driver. Loaded by the
// old-driver test through LD_LIBRARY_PATH.
extern "C" {
int cuDriverGetVersion(int* version) {
    *version = 11040;
    return 0;
}
int cuInit(unsigned int) { return 0; }
}
