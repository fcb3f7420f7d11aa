// v3src/util.cc (excerpt), the shape of AOTriton 0.11.x
namespace AOTRITON_NS {

bool isArchExperimentallySupported(hipStream_t stream) {
  auto gpu = getGpuFromStream(stream);
  uint32_t vendor_arch = Gpu2VendorArch(gpu);
  return (vendor_arch == CAT32(GpuVendor::kAMD,  0x950) ||
          vendor_arch == CAT32(GpuVendor::kAMD, 0x1151) ||
          vendor_arch == CAT32(GpuVendor::kAMD, 0x1201));
}

int getMultiProcessorCount(hipStream_t stream) {
  return 40;
}

}
