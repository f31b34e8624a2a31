/* The layout of GGUF weights repacked at load (gguf_repack.c writes it, gguf_repacked.c
 * reads it; both ask this header, never each other, which types and sizes it holds):
 * panels of 16 output columns, so that one instruction serves many columns (llama.cpp
 * repacks Q4_0 / Q4_K into interleaved rows for the same reason; this layout is our own,
 * int8_gemm.c's panels of 16 columns x 4 values).
 *
 * Each weight is stored as q = wq + offset (Q4_0: 8, Q5_0: 16, Q6_K: 32, Q8_0: 128 with
 * AVX-512 VNNI and 0 — signed — with AVX2, the types with a minimum: 0), unsigned but for
 * AVX2's Q8_0; the offset comes back exactly as offset * sum(x block) (the sums
 * gguf_activations.h keeps). A panel is 16 columns' units (a block of 32, or a K type's
 * super-block of 256) in order along K, each unit:
 *   fp16 d [16]; Q4_1 / Q5_1: fp16 m [16]; Q4_K / Q5_K: fp16 dmin [16], then their 6-bit
 *   scales and minima as bytes, [8 blocks][16]; Q6_K: its int8 scales, [16 halves][16];
 *   then each block's planes (bits: 4, Q4_x; 5, Q5_x; 6, Q6_K; 8, Q8_0), a quad t being
 *   the values 4t..4t+3 of the block (8 quads), "4c + j" value 4t + j of column c:
 *   - AVX-512 VNNI, the 16 columns together:
 *       8 bits: 8 quads x 64 bytes, byte 4c + j;
 *       else 4 chunks x 64 bytes of nibbles, byte 4c + j of chunk h: low nibble from quad h,
 *       high nibble from quad h + 4; then for each bit past 4 (4, then 5) 8 quads x 64
 *       bits, bit 4c + j (a byte mask as it is);
 *   - AVX2, columns 0-7 then columns 8-15, each half as above with 32 bytes where AVX-512
 *       has 64 (byte 4c + j, c < 8), except the bits past 4: Q5's 32 bytes, bit t of byte
 *       4c + j from quad t (a shift and a mask per quad); Q6_K's two planes of 32 bytes of
 *       crumbs, plane h's byte 4c + j holding quad 4h + t's bits 4-5 at bits 2t, 2t + 1.
 * That is the file's own bytes per weight (Q4_K, Q5_K: +1/64 byte, their 6-bit scales as
 * bytes), so a decode step reads what the file stores. Padding columns past n have d = 0
 * and contribute nothing. */
#ifndef MINIVLLM_GGUF_REPACKED_H
#define MINIVLLM_GGUF_REPACKED_H

#include <stdint.h>

#include "gguf_unpack.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define REPACKED_AVX512
#elif defined(__AVX2__)
#define REPACKED_AVX2
#endif

#define PANEL 16 /* output columns per panel: the int32 / fp32 lanes of a zmm */
/* bytes a reader asks for ahead in the stream (AVX-512: 1-4 KiB measured, 3 the best; AVX2:
 * 1.5-12 KiB on a 7B Q4_K / Q6_K matrix at 1 row, 2 the best) */
#if defined(REPACKED_AVX512)
#define PREFETCH 3072
#else
#define PREFETCH 2048
#endif

/* Bits of q, 0 for the types not repacked (Q2_K, Q3_K: gguf_gemm.c) */
static inline int panel_bits(int qtype) {
    switch (qtype) {
    case Q4_0: case Q4_1: case Q4_K: return 4;
    case Q5_0: case Q5_1: case Q5_K: return 5;
    case Q6_K: return 6;
    case Q8_0: return 8;
    default: return 0;
    }
}

static inline int panel_offset(int qtype) {
    switch (qtype) {
    case Q4_0: return 8;
    case Q5_0: return 16;
    case Q6_K: return 32;
#if defined(REPACKED_AVX512)
    case Q8_0: return 128;
#endif
    default: return 0;
    }
}

static inline int plane_bytes(int bits) { return bits == 8 ? 8 * 64 : 4 * 64 + (bits - 4) * 64; }

/* Bytes of a unit's header (scales) */
static inline int header_bytes(int qtype) {
    switch (qtype) {
    case Q4_1: case Q5_1: return 64;
    case Q4_K: case Q5_K: return 64 + 2 * 8 * PANEL;
    case Q6_K: return 32 + 16 * PANEL;
    default: return 32;
    }
}

static inline int64_t panel_unit_bytes(int qtype) {
    return header_bytes(qtype) + (int64_t)unit_blocks(qtype) * plane_bytes(panel_bits(qtype));
}

/* Whether this library repacks (gguf_repacked_supported) */
static inline int repacked_supported(void) {
#if defined(REPACKED_AVX512) || defined(REPACKED_AVX2)
    return 1;
#else
    return 0;
#endif
}

/* The repacked size of n rows of k values, or 0 for a type (or k) not repacked
 * (gguf_repacked_bytes) */
static inline int64_t repacked_bytes(int qtype, int k, int n) {
    const int unit_values = BLOCK * unit_blocks(qtype);
    if (!repacked_supported() || !panel_bits(qtype) || !unit_bytes(qtype) || k % unit_values)
        return 0;
    return (int64_t)((n + PANEL - 1) / PANEL) * (k / unit_values) * panel_unit_bytes(qtype);
}

#endif
