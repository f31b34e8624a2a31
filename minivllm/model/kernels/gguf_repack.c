/* GGUF blocks as the file stores them rewritten once at load into gguf_repacked.h's panels,
 * for gguf_repacked.c (AVX-512 VNNI and AVX2 libraries; the others keep the blocks and
 * gguf_gemm.c). */
#include <stdint.h>
#include <string.h>

#include "gguf_repacked.h"
#include "kernels.h"

int gguf_repacked_supported(void) { return repacked_supported(); }

int64_t gguf_repacked_bytes(int qtype, int k, int n) { return repacked_bytes(qtype, k, n); }

#if defined(REPACKED_AVX512) || defined(REPACKED_AVX2)

/* One block's planes (gguf_repacked.h) of the 16 columns' values q[c][0..32) at p */
static uint8_t *write_planes(uint8_t *p, uint8_t q[PANEL][BLOCK], int bits) {
#if defined(REPACKED_AVX512)
    const int halves = 1, width = PANEL;
#else
    const int halves = 2, width = PANEL / 2;
#endif
    for (int half = 0; half < halves; half++) {
        uint8_t(*v)[BLOCK] = q + half * width; /* this half's columns */
        if (bits == 8) {
            for (int t = 0; t < 8; t++)
                for (int c = 0; c < width; c++)
                    for (int j = 0; j < 4; j++) *p++ = v[c][4 * t + j];
            continue;
        }
        for (int h = 0; h < 4; h++)
            for (int c = 0; c < width; c++)
                for (int j = 0; j < 4; j++)
                    *p++ = (v[c][4 * h + j] & 15) | (v[c][4 * (h + 4) + j] & 15) << 4;
        for (int bit = 4; bit < bits; bit++) {
#if defined(REPACKED_AVX512) /* per quad, 64 bits: bit 4c + j */
            for (int t = 0; t < 8; t++) {
                uint64_t mask = 0;
                for (int c = 0; c < width; c++)
                    for (int j = 0; j < 4; j++)
                        mask |= (uint64_t)((v[c][4 * t + j] >> bit) & 1) << (4 * c + j);
                memcpy(p, &mask, 8), p += 8;
            }
#else
            if (bits == 6) { /* bits 4-5 as crumbs: plane h's byte 4c + j, quad 4h + t at 2t */
                for (int h = 0; h < 2; h++)
                    for (int c = 0; c < width; c++)
                        for (int j = 0; j < 4; j++) {
                            uint8_t byte = 0;
                            for (int t = 0; t < 4; t++)
                                byte |= ((v[c][4 * (4 * h + t) + j] >> 4) & 3) << (2 * t);
                            *p++ = byte;
                        }
                break;
            }
            /* per byte 4c + j, bit t from quad t */
            for (int c = 0; c < width; c++)
                for (int j = 0; j < 4; j++) {
                    uint8_t byte = 0;
                    for (int t = 0; t < 8; t++) byte |= ((v[c][4 * t + j] >> bit) & 1) << t;
                    *p++ = byte;
                }
#endif
        }
    }
    return p;
}

/* One unit of 16 columns (c0.. of n) from the file's blocks into its panel bytes `out`. */
static void repack_unit(const uint8_t *blocks, int64_t row_bytes, int n, int64_t c0, int64_t u,
                        int qtype, uint8_t *out) {
    const int nblocks = unit_blocks(qtype);
    uint8_t q[8][PANEL][BLOCK]; /* [block][column][value] */
    uint16_t d[PANEL], m[PANEL];
    uint8_t sc[PANEL][16], mn[PANEL][8];
    memset(q, 0, sizeof q), memset(d, 0, sizeof d), memset(m, 0, sizeof m);
    memset(sc, 0, sizeof sc), memset(mn, 0, sizeof mn);
    for (int c = 0; c < PANEL && c0 + c < n; c++) {
        const uint8_t *unit = blocks + (c0 + c) * row_bytes + u * unit_bytes(qtype);
        for (int s = 0; s < nblocks; s++) {
            int8_t wq[BLOCK];
            _mm256_storeu_si256((__m256i *)wq, block_bytes(unit, s, qtype));
            for (int j = 0; j < BLOCK; j++) q[s][c][j] = (uint8_t)(wq[j] + panel_offset(qtype));
        }
        memcpy(&d[c], unit + (qtype == Q6_K ? 208 : 0), 2);
        if (has_min(qtype)) memcpy(&m[c], unit + 2, 2); /* m, or the K types' dmin */
        if (qtype == Q6_K)
            for (int j = 0; j < 16; j++) sc[c][j] = unit[192 + j];
        if (qtype == Q4_K || qtype == Q5_K)
            for (int s = 0; s < 8; s++) {
                int scale, minimum;
                gguf_k_scale_min(unit, s, &scale, &minimum);
                sc[c][s] = (uint8_t)scale, mn[c][s] = (uint8_t)minimum;
            }
    }
    uint8_t *p = out;
    memcpy(p, d, sizeof d), p += sizeof d;
    if (has_min(qtype)) memcpy(p, m, sizeof m), p += sizeof m;
    const int scales = qtype == Q6_K ? 16 : (qtype == Q4_K || qtype == Q5_K) ? 8 : 0;
    for (int s = 0; s < scales; s++)
        for (int c = 0; c < PANEL; c++) *p++ = sc[c][s];
    if (qtype == Q4_K || qtype == Q5_K)
        for (int s = 0; s < 8; s++)
            for (int c = 0; c < PANEL; c++) *p++ = mn[c][s];
    for (int s = 0; s < nblocks; s++) p = write_planes(p, q[s], panel_bits(qtype));
}

#endif

int gguf_repack(const uint8_t *blocks, int qtype, int k, int n, uint8_t *repacked,
                int num_threads) {
    if (!repacked_bytes(qtype, k, n)) return -1;
#if defined(REPACKED_AVX512) || defined(REPACKED_AVX2)
    const int unit_values = BLOCK * unit_blocks(qtype);
    const int64_t units = k / unit_values, row_bytes = units * unit_bytes(qtype);
    const int64_t npanels = (n + PANEL - 1) / PANEL, bytes = panel_unit_bytes(qtype);
#pragma omp parallel for num_threads(num_threads) schedule(static)
    for (int64_t pi = 0; pi < npanels; pi++)
        for (int64_t u = 0; u < units; u++)
            repack_unit(blocks, row_bytes, n, pi * PANEL, u, qtype,
                        repacked + (pi * units + u) * bytes);
#else
    (void)blocks, (void)repacked, (void)num_threads;
#endif
    return 0;
}
