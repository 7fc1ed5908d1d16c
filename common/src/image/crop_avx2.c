/* The resampler's passes (resample_rows.h) compiled with AVX2. */
#define RESAMPLE_ROWS ferry__resample_rows_avx2
#include "resample_rows.h"
