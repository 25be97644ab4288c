// CPU reverse scans for GAE and V-trace over a time-major [T, M] layout.
//
// Each input row t starts at ptr + t * row_stride and its M columns are contiguous. Outputs are
// contiguous float32 [T, M]. Columns are split into tiles; each tile walks t backwards keeping the
// recurrence carry in a small stack array, so every input is read once and every output written once,
// and the inner loop over columns vectorizes. Tiles are shared among OpenMP threads.
#include <stdint.h>

#define TILE 1024

typedef uint16_t bf16_t;
typedef _Float16 f16_t;

static inline float cv_f32(float x) { return x; }
static inline float cv_bf16(bf16_t x) {
    union { uint32_t u; float f; } c;
    c.u = (uint32_t)x << 16;
    return c.f;
}
static inline float cv_f16(f16_t x) { return (float)x; }
static inline float cv_u8(uint8_t x) { return (float)x; }

// exp for the importance ratio; written out so the column loop vectorizes (libm expf would not).
// Relative error ~1e-7 on the clamped range; below -87 it returns ~1e-38 instead of a denormal.
static inline float exp_f32(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.5f ? 88.5f : x;
    float t = x * 1.44269504088896341f;
    float n = __builtin_floorf(t + 0.5f);
    float y = (t - n) * 0.693147180559945309f;
    float p = 1.0f + y * (1.0f + y * (0.5f + y * (1.0f / 6 + y * (1.0f / 24 + y * (1.0f / 120
              + y * (1.0f / 720 + y * (1.0f / 5040)))))));
    union { int32_t i; float f; } s;
    s.i = ((int32_t)n + 127) << 23;
    return p * s.f;
}

static inline int64_t tile_width(int64_t M, int nthreads) {
    int64_t per_thread = (M + nthreads - 1) / nthreads;
    per_thread = (per_thread + 15) / 16 * 16;
    return per_thread < TILE ? per_thread : TILE;
}

#define DEFINE_GAE(VN, VT, FN, FT)                                                                  \
void gae_##VN##_##FN(int64_t T, int64_t M,                                                          \
                     const VT* reward, int64_t s_r, const VT* value, int64_t s_v,                   \
                     const VT* next_value, int64_t s_nv, const FT* done, int64_t s_d,               \
                     const FT* terminated, int64_t s_te, float gamma, float lam,                    \
                     float* adv, float* target, int nthreads) {                                     \
    const int64_t W = tile_width(M, nthreads);                                                      \
    const int64_t ntiles = (M + W - 1) / W;                                                         \
    const float gl = gamma * lam;                                                                   \
    _Pragma("omp parallel for schedule(static) num_threads(nthreads) if(nthreads > 1)")             \
    for (int64_t k = 0; k < ntiles; k++) {                                                          \
        const int64_t j0 = k * W;                                                                   \
        const int64_t w = (M - j0) < W ? (M - j0) : W;                                              \
        float carry[TILE];                                                                          \
        for (int64_t j = 0; j < w; j++) carry[j] = 0.0f;                                            \
        for (int64_t t = T - 1; t >= 0; t--) {                                                      \
            const VT* __restrict r = reward + t * s_r + j0;                                         \
            const VT* __restrict v = value + t * s_v + j0;                                          \
            const VT* __restrict nv = next_value + t * s_nv + j0;                                   \
            const FT* __restrict d = done + t * s_d + j0;                                           \
            const FT* __restrict te = terminated + t * s_te + j0;                                   \
            float* __restrict a = adv + t * M + j0;                                                 \
            float* __restrict g = target + t * M + j0;                                              \
            _Pragma("omp simd")                                                                     \
            for (int64_t j = 0; j < w; j++) {                                                       \
                const float vj = cv_##VN(v[j]);                                                     \
                const float delta = cv_##VN(r[j]) + gamma * (1.0f - cv_##FN(te[j])) * cv_##VN(nv[j]) - vj; \
                const float c = delta + gl * (1.0f - cv_##FN(d[j])) * carry[j];                     \
                carry[j] = c;                                                                       \
                a[j] = c;                                                                           \
                g[j] = c + vj;                                                                      \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
}

#define DEFINE_VTRACE(VN, VT, FN, FT)                                                               \
void vtrace_##VN##_##FN(int64_t T, int64_t M,                                                       \
                        const VT* behavior_logp, int64_t s_bl, const VT* target_logp, int64_t s_tl, \
                        const VT* reward, int64_t s_r, const VT* value, int64_t s_v,                \
                        const VT* next_value, int64_t s_nv, const FT* done, int64_t s_d,            \
                        const FT* terminated, int64_t s_te, float gamma, float rho_bar,             \
                        float c_bar, float lam, float* vs, float* pg_adv, int nthreads) {           \
    const int64_t W = tile_width(M, nthreads);                                                      \
    const int64_t ntiles = (M + W - 1) / W;                                                         \
    _Pragma("omp parallel for schedule(static) num_threads(nthreads) if(nthreads > 1)")             \
    for (int64_t k = 0; k < ntiles; k++) {                                                          \
        const int64_t j0 = k * W;                                                                   \
        const int64_t w = (M - j0) < W ? (M - j0) : W;                                              \
        float acc[TILE];     /* vs_{t+1} - value_{t+1}, 0 past the end */                           \
        float vs_next[TILE]; /* vs_{t+1}; next_value_{T-1} past the end */                          \
        for (int64_t j = 0; j < w; j++) {                                                           \
            acc[j] = 0.0f;                                                                          \
            vs_next[j] = cv_##VN(next_value[(T - 1) * s_nv + j0 + j]);                              \
        }                                                                                           \
        for (int64_t t = T - 1; t >= 0; t--) {                                                      \
            const VT* __restrict bl = behavior_logp + t * s_bl + j0;                                \
            const VT* __restrict tl = target_logp + t * s_tl + j0;                                  \
            const VT* __restrict r = reward + t * s_r + j0;                                         \
            const VT* __restrict v = value + t * s_v + j0;                                          \
            const VT* __restrict nv = next_value + t * s_nv + j0;                                   \
            const FT* __restrict d = done + t * s_d + j0;                                           \
            const FT* __restrict te = terminated + t * s_te + j0;                                   \
            float* __restrict out_vs = vs + t * M + j0;                                             \
            float* __restrict out_pg = pg_adv + t * M + j0;                                         \
            _Pragma("omp simd")                                                                     \
            for (int64_t j = 0; j < w; j++) {                                                       \
                const float ratio = exp_f32(cv_##VN(tl[j]) - cv_##VN(bl[j]));                      \
                const float rho = ratio < rho_bar ? ratio : rho_bar;                                \
                const float c = lam * (ratio < c_bar ? ratio : c_bar);                              \
                const float vj = cv_##VN(v[j]);                                                     \
                const float nvj = cv_##VN(nv[j]);                                                   \
                const float rj = cv_##VN(r[j]);                                                     \
                const float dj = cv_##FN(d[j]);                                                     \
                const float disc = gamma * (1.0f - cv_##FN(te[j]));                                 \
                const float a = rho * (rj + disc * nvj - vj) + gamma * (1.0f - dj) * c * acc[j];    \
                const float vhat = dj != 0.0f ? nvj : vs_next[j];                                   \
                out_pg[j] = rho * (rj + disc * vhat - vj);                                          \
                out_vs[j] = a + vj;                                                                 \
                acc[j] = a;                                                                         \
                vs_next[j] = a + vj;                                                                \
            }                                                                                       \
        }                                                                                           \
    }                                                                                               \
}

#define DEFINE_ALL(VN, VT)              \
    DEFINE_GAE(VN, VT, u8, uint8_t)     \
    DEFINE_GAE(VN, VT, f32, float)      \
    DEFINE_VTRACE(VN, VT, u8, uint8_t)  \
    DEFINE_VTRACE(VN, VT, f32, float)

DEFINE_ALL(f32, float)
DEFINE_ALL(bf16, bf16_t)
DEFINE_ALL(f16, f16_t)

