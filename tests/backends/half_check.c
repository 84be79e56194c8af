/* The float16 conversions of the kernels' half.h, exported for tests/backends/test_kv_float16.py, which builds
 * this file for the machine (F16C) and for a CPU without F16C (the conversions done one by one) and checks both
 * against NumPy's astype. */
#include <stdint.h>

#include "half.h"

/* out = x rounded to float16 (n a multiple of 8), as the fused step stores K and V. */
void round_to_half(const float *x, int64_t n, uint8_t *out) { store_f16(x, n, out); }

/* out = h widened (n a multiple of 8), as attention reads them. */
void widen_half(const uint8_t *h, int64_t n, float *out) { widen_f16(h, n, out); }
