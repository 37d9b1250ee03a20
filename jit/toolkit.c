/*
 * toolkit.c — <tk/device.cuh>, the device toolkit every compile gets as an in-memory header. Its
 * source is jit/device/tk_device.cuh; make embeds the file's bytes as a C array
 * ($(B)/gen/tk_device_cuh.h), so nothing is read from disk at run time and the bytes a binary hands
 * to NVRTC are the bytes its cache keys cover.
 */
#include "jit/jit.h"

#include "tk_device_cuh.h" /* generated: static const unsigned char tk_device_cuh[], NUL-terminated */

tk_jit_file tk_jit__device_toolkit(void)
{
    tk_jit_file f = {TK_JIT_DEVICE_TOOLKIT_PATH, (const char *)tk_device_cuh, sizeof tk_device_cuh - 1};
    return f;
}
