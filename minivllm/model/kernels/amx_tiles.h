/* What amx_gemm.c and amx_attention.c share: the tiles' permission, their one
 * configuration (8 tiles of 16 rows x 64 bytes: an fp32 C tile of 16 x 16, a bf16 A tile
 * of 16 x 32, a B tile of 16 pairs x 16 columns) and a 16 x 16 dword transpose (rows of
 * values into a B tile's pairs). Included only where the build has AMX-BF16. */
#ifndef MINIVLLM_AMX_TILES_H
#define MINIVLLM_AMX_TILES_H

#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ROW_TILE 16 /* rows of a tile */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Whether this process may use the tiles: asked once (the answer does not change). */
static inline int amx_permitted(void) {
    static int state; /* 0: not asked yet, 1: yes, -1: no */
    int s = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (!s) {
        s = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        __atomic_store_n(&state, s, __ATOMIC_RELAXED);
    }
    return s == 1;
}

static inline void configure_tiles(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) cfg.colsb[t] = 64, cfg.rows[t] = ROW_TILE;
    _tile_loadconfig(&cfg);
}

/* r[j] := column j of the 16 x 16 dword matrix whose rows are r[0..15]. */
static inline void transpose_16x16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    /* u[4i + j], 128-bit lane L: element 4L + j of rows 4i..4i+3 */
    for (int i = 0; i < 4; i++) {
        u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    /* column 4L + j: lane L of u[j], u[4 + j], u[8 + j], u[12 + j] */
#define COLUMN(L, j)                                                                     \
    r[4 * L + j] = _mm512_shuffle_i32x4(_mm512_shuffle_i32x4(u[j], u[4 + j], 0x55 * L),  \
                                        _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x55 * L), \
                                        0x88)
#define COLUMNS(L) COLUMN(L, 0), COLUMN(L, 1), COLUMN(L, 2), COLUMN(L, 3)
    COLUMNS(0), COLUMNS(1), COLUMNS(2), COLUMNS(3);
#undef COLUMNS
#undef COLUMN
}

#endif
