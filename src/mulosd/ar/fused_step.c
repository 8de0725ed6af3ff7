/* The AR transformer's decode step for a few tokens per row, in one C call (see fused.py).
 *
 * On a CPU a one-token step of a small model is bound by streaming its weights, yet a library matrix product
 * on a 2-row input reads them at a fraction of the machine's bandwidth and every operator adds its own call.
 * Here every weight matrix is read once per step for all the step's input vectors, and the norms, rotary
 * positions, cache writes, masked attention, SwiGLU and guidance run in the same pass, with no allocation.
 *
 * Semantics are Transformer.step's (transformer.py) for positions="rope": inputs are token ids written at
 * absolute slots; every written slot is marked filled first; a query attends to the filled slots at or before
 * its own (and always to itself). Each input vector's arithmetic is independent of the others', so a row's
 * logits do not depend on the batch it is in.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

typedef struct {
    int dim, heads, hidden, vocab, slots, layers;
    int half;               /* the weight matrices (qkv, out, gate_up, down, head) are float16, else float32 */
    float eps;
    const float *tok_emb;   /* [vocab, dim] */
    const float *rope;      /* [slots, head_dim / 2, 2]: cos, sin */
    const float *norm;      /* [dim] final RMSNorm */
    const void *head;       /* [vocab, dim] */
    /* per layer: attn_norm [dim], mlp_norm [dim]; qkv [3 dim, dim], out [dim, dim], gate_up [2 hidden, dim],
       down [dim, hidden] */
    const float *const *attn_norm, *const *mlp_norm;
    const void *const *qkv, *const *out, *const *gate_up, *const *down;
} Model;

typedef float v8 __attribute__((vector_size(32), aligned(4)));  /* GCC/Clang vectors; unaligned loads */

static inline float hsum(v8 a) {
    return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}

/* y[i][o] = W[o] . x[i] for m input vectors of length k (a multiple of 8), n_out a multiple of 4: four weight rows at a time, each read
   once for all inputs, two inputs at a time, so that eight independent sums hide the multiply-add latency.
   Every sum runs in the same order whatever m is: an input's result does not depend on the others. The weights
   are float32 or float16 (converted on load: exact, and half the bytes to stream). */
#define MATVECS(NAME, T, LOAD)                                                                                   \
static void NAME(const T *restrict W, int n_out, int k, const float *restrict x, int m, float *restrict y) {    \
    for (int o = 0; o + 4 <= n_out; o += 4) {                                                                   \
        const T *w0 = W + (int64_t)o * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;                             \
        int i = 0;                                                                                              \
        for (; i + 2 <= m; i += 2) {                                                                            \
            const float *xa = x + (int64_t)i * k, *xb = xa + k;                                                 \
            v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};                 \
            for (int j = 0; j < k; j += 8) {                                                                    \
                v8 p = *(const v8 *)(xa + j), q = *(const v8 *)(xb + j);                                        \
                v8 u0 = LOAD(w0 + j), u1 = LOAD(w1 + j), u2 = LOAD(w2 + j), u3 = LOAD(w3 + j);                  \
                a0 += u0 * p; a1 += u1 * p; a2 += u2 * p; a3 += u3 * p;                                         \
                b0 += u0 * q; b1 += u1 * q; b2 += u2 * q; b3 += u3 * q;                                         \
            }                                                                                                   \
            float *ya = y + (int64_t)i * n_out + o, *yb = ya + n_out;                                           \
            ya[0] = hsum(a0); ya[1] = hsum(a1); ya[2] = hsum(a2); ya[3] = hsum(a3);                             \
            yb[0] = hsum(b0); yb[1] = hsum(b1); yb[2] = hsum(b2); yb[3] = hsum(b3);                             \
        }                                                                                                       \
        for (; i < m; i++) {                                                                                    \
            const float *xa = x + (int64_t)i * k;                                                               \
            v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};                                                          \
            for (int j = 0; j < k; j += 8) {                                                                    \
                v8 p = *(const v8 *)(xa + j);                                                                   \
                a0 += LOAD(w0 + j) * p; a1 += LOAD(w1 + j) * p; a2 += LOAD(w2 + j) * p; a3 += LOAD(w3 + j) * p; \
            }                                                                                                   \
            float *ya = y + (int64_t)i * n_out + o;                                                             \
            ya[0] = hsum(a0); ya[1] = hsum(a1); ya[2] = hsum(a2); ya[3] = hsum(a3);                             \
        }                                                                                                       \
    }                                                                                                           \
}
#define LOAD32(p) (*(const v8 *)(p))
MATVECS(matvecs32, float, LOAD32)
#ifdef __F16C__  /* the x86 instruction that widens eight float16 to float32 */
#define LOAD16(p) ((v8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p))))
MATVECS(matvecs16, uint16_t, LOAD16)
#endif

/* whether this build streams float16 weights (fused.py asks before it hands any over) */
int mulosd_has_f16(void) {
#ifdef __F16C__
    return 1;
#else
    return 0;
#endif
}

/* float16 weights where the model's are exactly float16 values and the CPU widens them (fused.py), else float32 */
static void matvecs(const Model *M, const void *W, int n_out, int k, const float *x, int m, float *y) {
#ifdef __F16C__
    if (M->half) {
        matvecs16(W, n_out, k, x, m, y);
        return;
    }
#endif
    matvecs32(W, n_out, k, x, m, y);
}

static void rmsnorm(const float *restrict x, const float *restrict w, int d, float eps, float *restrict y) {
    float ss = 0.0f;
    for (int j = 0; j < d; j++) ss += x[j] * x[j];
    float r = 1.0f / sqrtf(ss / d + eps);
    for (int j = 0; j < d; j++) y[j] = x[j] * r * w[j];
}

static void rotate(float *restrict v, const float *restrict cs, int half) {
    for (int i = 0; i < half; i++) {
        float a = v[2 * i], b = v[2 * i + 1], c = cs[2 * i], s = cs[2 * i + 1];
        v[2 * i] = a * c - b * s;
        v[2 * i + 1] = a * s + b * c;
    }
}

/* rows R, tokens per row n; slots, tokens [R, n]; caches per layer [R, heads, slots, head_dim]; filled
 * [R, slots] (bytes); scratch: at least m * (6 dim + 3 hidden + vocab) + slots floats, m = R n;
 * logits [R, n, vocab], or [R / 2, n, vocab] guided (rows: conditional, then null), each conditional token i
 * guided at its own scale cfg_scales[i] */
void mulosd_step(const Model *M, int R, int n, const int64_t *slots, const int64_t *tokens, float *const *kc,
                 float *const *vc, uint8_t *filled, const float *cfg_scales, int guided, float *scratch, float *logits) {
    const int d = M->dim, H = M->heads, Dh = d / H, hid = M->hidden, V = M->vocab, S = M->slots, m = R * n;
    float *x = scratch, *h = x + m * d, *qkv = h + m * d, *att = qkv + 3 * m * d, *gu = att + m * d,
          *act = gu + 2 * m * hid, *probs = act + m * hid, *out = probs + S;
    const float scale = 1.0f / sqrtf((float)Dh);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < n; t++) filled[r * S + slots[r * n + t]] = 1;
    for (int i = 0; i < m; i++) memcpy(x + i * d, M->tok_emb + tokens[i] * d, d * sizeof(float));
    for (int l = 0; l < M->layers; l++) {
        for (int i = 0; i < m; i++) rmsnorm(x + i * d, M->attn_norm[l], d, M->eps, h + i * d);
        matvecs(M, M->qkv[l], 3 * d, d, h, m, qkv);
        for (int r = 0; r < R; r++)
            for (int t = 0; t < n; t++) {  /* rotate q and k, write k and v at the slot */
                int i = r * n + t;
                int64_t s = slots[i];
                float *q = qkv + (int64_t)i * 3 * d, *k = q + d, *v = k + d;
                const float *cs = M->rope + s * Dh;
                for (int hh = 0; hh < H; hh++) {
                    rotate(q + hh * Dh, cs, Dh / 2);
                    rotate(k + hh * Dh, cs, Dh / 2);
                    int64_t at = (((int64_t)r * H + hh) * S + s) * Dh;
                    memcpy(kc[l] + at, k + hh * Dh, Dh * sizeof(float));
                    memcpy(vc[l] + at, v + hh * Dh, Dh * sizeof(float));
                }
            }
        for (int r = 0; r < R; r++)
            for (int t = 0; t < n; t++) {  /* masked attention of each query over the cache */
                int i = r * n + t;
                int64_t s0 = slots[i];
                const uint8_t *f = filled + (int64_t)r * S;
                for (int hh = 0; hh < H; hh++) {
                    const float *q = qkv + (int64_t)i * 3 * d + hh * Dh;
                    const float *K = kc[l] + ((int64_t)r * H + hh) * S * Dh, *Vv = vc[l] + ((int64_t)r * H + hh) * S * Dh;
                    float mx = -INFINITY;
                    for (int64_t s = 0; s <= s0; s++) {
                        if (!f[s] && s != s0) continue;
                        v8 acc = {0};
                        for (int j = 0; j < Dh; j += 8) acc += *(const v8 *)(q + j) * *(const v8 *)(K + s * Dh + j);
                        probs[s] = hsum(acc) * scale;
                        if (probs[s] > mx) mx = probs[s];
                    }
                    float sum = 0.0f, *y = att + (int64_t)i * d + hh * Dh;
                    memset(y, 0, Dh * sizeof(float));
                    for (int64_t s = 0; s <= s0; s++) {
                        if (!f[s] && s != s0) continue;
                        float p = expf(probs[s] - mx);
                        sum += p;
                        for (int j = 0; j < Dh; j += 8) *(v8 *)(y + j) += p * *(const v8 *)(Vv + s * Dh + j);
                    }
                    for (int j = 0; j < Dh; j++) y[j] /= sum;
                }
            }
        matvecs(M, M->out[l], d, d, att, m, h);
        for (int i = 0; i < m * d; i++) x[i] += h[i];
        for (int i = 0; i < m; i++) rmsnorm(x + i * d, M->mlp_norm[l], d, M->eps, h + i * d);
        matvecs(M, M->gate_up[l], 2 * hid, d, h, m, gu);
        for (int i = 0; i < m; i++) {  /* silu(gate) * up */
            const float *g = gu + (int64_t)i * 2 * hid, *u = g + hid;
            for (int j = 0; j < hid; j++) act[(int64_t)i * hid + j] = g[j] / (1.0f + expf(-g[j])) * u[j];
        }
        matvecs(M, M->down[l], d, hid, act, m, h);
        for (int i = 0; i < m * d; i++) x[i] += h[i];
    }
    for (int i = 0; i < m; i++) rmsnorm(x + i * d, M->norm, d, M->eps, h + i * d);
    float *raw = guided ? out : logits;
    matvecs(M, M->head, V, d, h, m, raw);
    if (guided) {  /* u + scale (c - u): conditional rows first, then their null rows */
        int half = m / 2;
        for (int i = 0; i < half; i++) {
            const float *c = raw + (int64_t)i * V, *u = raw + (int64_t)(i + half) * V;
            const float g = cfg_scales[i];
            for (int j = 0; j < V; j++) logits[(int64_t)i * V + j] = u[j] + g * (c[j] - u[j]);
        }
    }
}

/* The draw after a step, for temperature-only warping (ar.sampling.draw with top-k and top-p off): tokens [R, n]
 * = argmax_j( log_softmax(logits / temperature)_j + Gumbel noise keyed by (seed, image, position, j) ), the noise
 * being ar.noise's: lowbias32 over the key words, a float64 uniform, -log(-log(u)) rounded to float32. The
 * log-probabilities are formed as (x - max) - log(sum) like the library's log_softmax; only the sums' order
 * differs, so a token can differ from the graph's only where two candidates tie to the last bit. */
static inline uint32_t lowbias32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    return x ^ (x >> 16);
}

void mulosd_draw(const float *logits, int R, int n, int V, float temperature, int64_t seed, int64_t stream,
                 const int64_t *images, const int64_t *positions, float *scratch, int64_t *tokens) {
    uint32_t key = lowbias32(lowbias32(0x9E3779B9u ^ (uint32_t)seed) ^ (uint32_t)stream);
    for (int r = 0; r < R; r++)
        for (int t = 0; t < n; t++) {
            int i = r * n + t;
            const float *x = logits + (int64_t)i * V;
            float mx = -INFINITY, sum = 0.0f;
            for (int j = 0; j < V; j++) {
                scratch[j] = x[j] / temperature;
                if (scratch[j] > mx) mx = scratch[j];
            }
            for (int j = 0; j < V; j++) sum += expf(scratch[j] - mx);
            const float ls = logf(sum);
            const uint32_t at = lowbias32(lowbias32(key ^ (uint32_t)images[r]) ^ (uint32_t)positions[i]);
            float best = -INFINITY;
            int64_t arg = 0;
            for (int j = 0; j < V; j++) {
                double u = ((double)(lowbias32(at ^ (uint32_t)j) >> 8) + 0.5) / 16777216.0;
                float v = ((scratch[j] - mx) - ls) + (float)(-log(-log(u)));
                if (v > best) {
                    best = v;
                    arg = j;
                }
            }
            tokens[i] = arg;
        }
}
