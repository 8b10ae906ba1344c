// What the emulated device does not emulate: cuDNN's engines (and the CUDA graph, library and
// NVRTC calls that only the cuDNN frontend makes). cuDNN handles can be created and bound to a
// stream, so a CudaDevice starts; every backend descriptor creation fails with
// CUDNN_STATUS_NOT_SUPPORTED and says why, so BigMac's attention takes its fallback kernels, as it
// does on a GPU whose cuDNN cannot build the graph. The rest return "not supported" if reached.
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nvrtc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {
constexpr const char* kWhy =
    ": cuDNN is not emulated: the emulated CUDA device runs BigMac's fallback attention kernels";
struct FakeHandle {
  cudaStream_t stream = nullptr;
};
}  // namespace

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
  *handle = reinterpret_cast<cudnnHandle_t>(new FakeHandle());
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
  delete reinterpret_cast<FakeHandle*>(handle);
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  reinterpret_cast<FakeHandle*>(handle)->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream) {
  *stream = reinterpret_cast<FakeHandle*>(handle)->stream;
  return CUDNN_STATUS_SUCCESS;
}
// BIGMAC_EMULATED_CUDNN_VERSION pretends another cuDNN (tests: a machine whose cuDNN is too old
// for the fused SDPA, where the frontend throws instead of returning an error).
size_t cudnnGetVersion(void) {
  const char* version = std::getenv("BIGMAC_EMULATED_CUDNN_VERSION");
  return version ? std::strtoul(version, nullptr, 10) : CUDNN_VERSION;
}
const char* cudnnGetErrorString(cudnnStatus_t status) {
  return status == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS" : "CUDNN_STATUS_NOT_SUPPORTED";
}
void cudnnGetLastErrorString(char* message, size_t max_size) {
  if (max_size > 0) std::snprintf(message, max_size, "%s", kWhy);
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t,
                                           cudnnBackendDescriptor_t* d) {
  *d = nullptr;
  return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t) {
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnBackendExecute(cudnnHandle_t, cudnnBackendDescriptor_t,
                                  cudnnBackendDescriptor_t) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t) { return CUDNN_STATUS_NOT_SUPPORTED; }
cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, int64_t*, void*) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t,
                                       cudnnBackendAttributeType_t, int64_t, const void*) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t*) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t, cudnnDataType_t,
                                         cudnnTensorFormat_t, int, const int[]) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}
cudnnStatus_t cudnnReorderFilterAndBias(cudnnHandle_t, const cudnnFilterDescriptor_t,
                                        cudnnReorderType_t, const void*, void*, int, const void*,
                                        void*) {
  return CUDNN_STATUS_NOT_SUPPORTED;
}

// CUDA runtime calls only the cuDNN frontend makes (runtime kernels, graphs, user objects).
cudaError_t cudaGetDriverEntryPointByVersion(const char*, void** function, unsigned int,
                                             unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  *function = nullptr;
  if (status) *status = cudaDriverEntryPointSymbolNotFound;
  return cudaErrorNotSupported;
}
cudaError_t cudaGraphRetainUserObject(cudaGraph_t, cudaUserObject_t, unsigned int, unsigned int) {
  return cudaErrorNotSupported;
}
cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t, cudaFuncAttribute, int, int) {
  return cudaErrorNotSupported;
}
cudaError_t cudaLaunchKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t) {
  return cudaErrorNotSupported;
}
cudaError_t cudaLibraryGetKernel(cudaKernel_t*, cudaLibrary_t, const char*) {
  return cudaErrorNotSupported;
}
cudaError_t cudaLibraryLoadData(cudaLibrary_t*, const void*, cudaJitOption*, void**, unsigned int,
                                cudaLibraryOption*, void**, unsigned int) {
  return cudaErrorNotSupported;
}
cudaError_t cudaLibraryUnload(cudaLibrary_t) { return cudaErrorNotSupported; }
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes*, const void*) {
  return cudaErrorNotSupported;
}
cudaError_t cudaStreamGetCaptureInfo(cudaStream_t, cudaStreamCaptureStatus* status,
                                     unsigned long long*, cudaGraph_t*, const cudaGraphNode_t**,
                                     const cudaGraphEdgeData**, size_t*) {
  *status = cudaStreamCaptureStatusNone;  // never capturing
  return cudaSuccess;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode*) { return cudaSuccess; }
cudaError_t cudaUserObjectCreate(cudaUserObject_t*, void*, cudaHostFn_t, unsigned int,
                                 unsigned int) {
  return cudaErrorNotSupported;
}
cudaError_t cudaUserObjectRelease(cudaUserObject_t, unsigned int) { return cudaErrorNotSupported; }

nvrtcResult nvrtcCompileProgram(nvrtcProgram, int, const char* const*) {
  return NVRTC_ERROR_COMPILATION;
}
nvrtcResult nvrtcCreateProgram(nvrtcProgram*, const char*, const char*, int, const char* const*,
                               const char* const*) {
  return NVRTC_ERROR_COMPILATION;
}
nvrtcResult nvrtcDestroyProgram(nvrtcProgram*) { return NVRTC_SUCCESS; }
nvrtcResult nvrtcGetCUBIN(nvrtcProgram, char*) { return NVRTC_ERROR_COMPILATION; }
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram, size_t*) { return NVRTC_ERROR_COMPILATION; }
nvrtcResult nvrtcGetProgramLog(nvrtcProgram, char* log) {
  if (log) log[0] = '\0';
  return NVRTC_SUCCESS;
}
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram, size_t* size) {
  *size = 1;
  return NVRTC_SUCCESS;
}
