/* Which instruction sets this library was compiled for: the compiler's own macros, one bit
 * each in the order of isa.py's FEATURES. The loader logs them (the variants that run are
 * the ones these macros select in the other files) and refuses a library built for a
 * feature the CPU lacks; the tests check each level's library against its flags. */
#include "kernels.h"

int kernels_isa_features(void) {
    int bits = 0;
#ifdef __AVX2__
    bits |= 1 << 0;
#endif
#ifdef __FMA__
    bits |= 1 << 1;
#endif
#ifdef __F16C__
    bits |= 1 << 2;
#endif
#ifdef __AVX512F__
    bits |= 1 << 3;
#endif
#ifdef __AVX512BW__
    bits |= 1 << 4;
#endif
#ifdef __AVX512CD__
    bits |= 1 << 5;
#endif
#ifdef __AVX512DQ__
    bits |= 1 << 6;
#endif
#ifdef __AVX512VL__
    bits |= 1 << 7;
#endif
#ifdef __AVX512VNNI__
    bits |= 1 << 8;
#endif
#ifdef __AVX512BF16__
    bits |= 1 << 9;
#endif
#ifdef __AVXVNNI__
    bits |= 1 << 10;
#endif
#ifdef __AMX_TILE__
    bits |= 1 << 11;
#endif
#ifdef __AMX_INT8__
    bits |= 1 << 12;
#endif
#ifdef __AMX_BF16__
    bits |= 1 << 13;
#endif
    return bits;
}
