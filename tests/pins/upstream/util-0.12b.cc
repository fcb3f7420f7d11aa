// v3src/util.cc (excerpt), gfx1151 no longer experimental
namespace AOTRITON_NS {

bool isArchExperimentallySupported(const hipDeviceProp_t* dprops) {
  auto arch = gcnArchNameSansColon(dprops->gcnArchName);
  // "gfx1151" graduated in this release
  return (arch == "gfx950");
}

}
