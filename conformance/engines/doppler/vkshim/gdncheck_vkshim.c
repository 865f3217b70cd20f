// A minimal Vulkan layer for running Dawn (npm `webgpu`) on Mesa 22.3's lavapipe, compute only.
//
// Dawn refuses any Vulkan device whose VkPhysicalDeviceFeatures lack all four
// shader{UniformBuffer,SampledImage,StorageBuffer,StorageImage}ArrayDynamicIndexing
// ("Vulkan shaderUniform*ArrayDynamicIndexing required"). lavapipe 22.3 has the two *buffer* ones
// and not the two *image* ones. This layer reports the two image bits as present to the caller and
// strips them again from vkCreateDevice, so the driver is never asked for them. Compute shaders over
// storage/uniform buffers (all that doppler's linear-attention kernel uses) never need them; a
// shader that dynamically indexed an array of images would be wrong under this layer.
#include <stdlib.h>
#include <string.h>
#include <vulkan/vulkan.h>
#include <vulkan/vk_layer.h>

#define EXPORT __attribute__((visibility("default")))

static PFN_vkGetInstanceProcAddr next_gipa;
static PFN_vkGetDeviceProcAddr next_gdpa;
static PFN_vkGetPhysicalDeviceFeatures next_features;
static PFN_vkGetPhysicalDeviceFeatures2 next_features2;
static PFN_vkGetPhysicalDeviceFeatures2 next_features2_khr;
static PFN_vkCreateDevice next_create_device;
static VkInstance the_instance;

static void spoof(VkPhysicalDeviceFeatures *f) {
  f->shaderSampledImageArrayDynamicIndexing = VK_TRUE;
  f->shaderStorageImageArrayDynamicIndexing = VK_TRUE;
}
static void unspoof(VkPhysicalDeviceFeatures *f) {
  f->shaderSampledImageArrayDynamicIndexing = VK_FALSE;
  f->shaderStorageImageArrayDynamicIndexing = VK_FALSE;
}

static VKAPI_ATTR void VKAPI_CALL shim_features(VkPhysicalDevice pd, VkPhysicalDeviceFeatures *f) {
  next_features(pd, f);
  spoof(f);
}
static VKAPI_ATTR void VKAPI_CALL shim_features2(VkPhysicalDevice pd, VkPhysicalDeviceFeatures2 *f) {
  (next_features2 ? next_features2 : next_features2_khr)(pd, f);
  spoof(&f->features);
}
static VKAPI_ATTR void VKAPI_CALL shim_features2_khr(VkPhysicalDevice pd, VkPhysicalDeviceFeatures2 *f) {
  (next_features2_khr ? next_features2_khr : next_features2)(pd, f);
  spoof(&f->features);
}

static VKAPI_ATTR VkResult VKAPI_CALL shim_create_instance(const VkInstanceCreateInfo *ci, const VkAllocationCallbacks *a, VkInstance *inst) {
  VkLayerInstanceCreateInfo *li = (VkLayerInstanceCreateInfo *)ci->pNext;
  while (li && !(li->sType == VK_STRUCTURE_TYPE_LOADER_INSTANCE_CREATE_INFO && li->function == VK_LAYER_LINK_INFO))
    li = (VkLayerInstanceCreateInfo *)li->pNext;
  if (!li) return VK_ERROR_INITIALIZATION_FAILED;
  next_gipa = li->u.pLayerInfo->pfnNextGetInstanceProcAddr;
  li->u.pLayerInfo = li->u.pLayerInfo->pNext;
  PFN_vkCreateInstance create = (PFN_vkCreateInstance)next_gipa(VK_NULL_HANDLE, "vkCreateInstance");
  VkResult r = create(ci, a, inst);
  if (r != VK_SUCCESS) return r;
  the_instance = *inst;
  next_features = (PFN_vkGetPhysicalDeviceFeatures)next_gipa(*inst, "vkGetPhysicalDeviceFeatures");
  next_features2 = (PFN_vkGetPhysicalDeviceFeatures2)next_gipa(*inst, "vkGetPhysicalDeviceFeatures2");
  next_features2_khr = (PFN_vkGetPhysicalDeviceFeatures2)next_gipa(*inst, "vkGetPhysicalDeviceFeatures2KHR");
  next_create_device = (PFN_vkCreateDevice)next_gipa(*inst, "vkCreateDevice");
  return VK_SUCCESS;
}

static VKAPI_ATTR VkResult VKAPI_CALL shim_create_device(VkPhysicalDevice pd, const VkDeviceCreateInfo *ci, const VkAllocationCallbacks *a, VkDevice *dev) {
  VkLayerDeviceCreateInfo *li = (VkLayerDeviceCreateInfo *)ci->pNext;
  while (li && !(li->sType == VK_STRUCTURE_TYPE_LOADER_DEVICE_CREATE_INFO && li->function == VK_LAYER_LINK_INFO))
    li = (VkLayerDeviceCreateInfo *)li->pNext;
  if (!li) return VK_ERROR_INITIALIZATION_FAILED;
  PFN_vkGetInstanceProcAddr gipa = li->u.pLayerInfo->pfnNextGetInstanceProcAddr;
  next_gdpa = li->u.pLayerInfo->pfnNextGetDeviceProcAddr;
  li->u.pLayerInfo = li->u.pLayerInfo->pNext;
  PFN_vkCreateDevice create = (PFN_vkCreateDevice)gipa(the_instance, "vkCreateDevice");
  // strip the two spoofed bits from whatever the caller enables
  VkDeviceCreateInfo copy = *ci;
  VkPhysicalDeviceFeatures plain;
  if (ci->pEnabledFeatures) { plain = *ci->pEnabledFeatures; unspoof(&plain); copy.pEnabledFeatures = &plain; }
  for (VkBaseOutStructure *p = (VkBaseOutStructure *)ci->pNext; p; p = p->pNext)
    if (p->sType == VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2) unspoof(&((VkPhysicalDeviceFeatures2 *)p)->features);
  return create(pd, &copy, a, dev);
}

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL gdncheck_GetDeviceProcAddr(VkDevice dev, const char *name);

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL gdncheck_GetInstanceProcAddr(VkInstance inst, const char *name) {
  if (!strcmp(name, "vkGetInstanceProcAddr")) return (PFN_vkVoidFunction)gdncheck_GetInstanceProcAddr;
  if (!strcmp(name, "vkCreateInstance")) return (PFN_vkVoidFunction)shim_create_instance;
  if (!strcmp(name, "vkCreateDevice")) return (PFN_vkVoidFunction)shim_create_device;
  if (!strcmp(name, "vkGetDeviceProcAddr")) return (PFN_vkVoidFunction)gdncheck_GetDeviceProcAddr;
  if (!strcmp(name, "vkGetPhysicalDeviceFeatures")) return (PFN_vkVoidFunction)shim_features;
  if (!strcmp(name, "vkGetPhysicalDeviceFeatures2")) return (PFN_vkVoidFunction)shim_features2;
  if (!strcmp(name, "vkGetPhysicalDeviceFeatures2KHR")) return (PFN_vkVoidFunction)shim_features2_khr;
  return next_gipa ? next_gipa(inst, name) : NULL;
}

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL gdncheck_GetDeviceProcAddr(VkDevice dev, const char *name) {
  if (!strcmp(name, "vkGetDeviceProcAddr")) return (PFN_vkVoidFunction)gdncheck_GetDeviceProcAddr;
  return next_gdpa ? next_gdpa(dev, name) : NULL;
}
