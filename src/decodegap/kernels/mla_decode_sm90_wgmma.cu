// MLA decode for many heads (H >= 17, DeepSeek's 128 and GLM-5's 64) on Hopper: warpgroup MMA (wgmma, sm_90a)
// with 64 heads as the M dimension, over a paged FP8 (e4m3) or BF16 latent cache. Built at first use by
// mla_decode_sm90.py (nvcc -gencode arch=compute_90a,code=sm_90a, a plain shared library called through ctypes).
//
// One CTA = 3 warpgroups = one (64-head block, KV split, sequence):
//  - warpgroup 0, the producer (setmaxnreg down to 40 or 88 registers): brings 32-token KV tiles into a ring of
//    stages in the 128-byte-swizzled layout that wgmma reads, [9 chunks of 64 dims][32 tokens][128 B]. BF16
//    caches: cp.async straight into the stage, completion tracked by the stage's mbarrier
//    (cp.async.mbarrier.arrive). FP8 caches: each thread loads its 144 bytes of a tile (REGS: into registers, the
//    next tile's loads in flight while it waits for a free stage; else cp.async into a small raw ring), widens
//    them (one cvt per two elements, e4m3 -> f16 is exact) and stores them swizzled; fence.proxy.async and an
//    mbarrier arrive publish the stage. Rows are found through the block table (any page size), page ids a tile
//    ahead.
//  - warpgroups 1 and 2, the consumers (232 or 208 registers): S = Q K^T, each over half of the 576 dims (18 k-steps of
//    m64n32k16, Q and K from shared memory); the two partial score tiles are summed through shared memory (both
//    warpgroups then hold the same S, bit for bit); online softmax in registers (log2 domain, the reference max
//    moves only when a score exceeds it by 2^8); O[64, 256 dims] += P V with P from registers (the score
//    accumulator layout is the A-fragment layout) and V the same stage read N-major (m64n256k16, 2 k-steps);
//    then the stage is released through its empty mbarrier.
// Seesaw consumers (SEESAW, variants 18-20): each consumer warpgroup computes the full scores of its own tile
// (tiles alternate: warpgroup 0 the even ones, 1 the odd ones; 36 k-steps of m64n32k16, K from shared memory, Q
// too, or from registers for the first QR k-steps),
// so one's softmax can run while the other's MMA does; its P goes into its stage's rope chunk (free once the scores
// are done) for the other warpgroup, and each warpgroup updates its half of O (256 of the 512 value dims) with both
// tiles' P: its own from registers, the other's from shared memory. Each measures its tile against the pair's
// starting reference max; both then move to the larger of the two tiles' (rare: it moves only by more than 2^8).
// TMA loads (variant 23, BF16): one producer thread copies each whole tile by TMA (9 boxes of [32 rows][128 B]) in
// place of the warpgroup's cp.async; the tile that crosses the slice's end still comes by the zero-filling cp.async.
// FP8 caches run f16 MMA (q * 2^e in fp16, as the other kernels), BF16 caches bf16 MMA; fp32 accumulation.
// Output: per-split partials [B, H, S, 512] (fp16 in cache units for FP8 caches, |x| <= 448; fp32 for BF16)
// and their log2-sum-exp [B, H, S], the layout the Triton merge kernel reads; or, with one split, the bf16
// output (times kv_scale) and the natural-log lse directly.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>

#include "mla_decode_sm90_common.cuh"

// Benchmark-only probes (benchmarks/mla_wgmma_limits.py builds the file with -DDG_WGMMA_PROBE=N; the library
// mla_decode_sm90.py builds has 0): 1 = the producer publishes each stage without filling it (the stages hold zeros),
// what the consumers alone take; 2 = the consumers release each stage unread, what the producer alone takes.
#ifndef DG_WGMMA_PROBE
#define DG_WGMMA_PROBE 0
#endif

namespace {

constexpr int kProbe = DG_WGMMA_PROBE;
constexpr int kThreads = 384;
constexpr int kBN = 32;                          // tokens per KV tile
constexpr int kM = 64;                           // heads per CTA
constexpr int kQBytes = 9 * kM * 128;            // Q [9 chunks][64 rows][128 B] = 73,728
constexpr int kChunkBytes = kBN * 128;           // one 64-dim chunk of a tile: 4,096
constexpr int kStageBytes = 9 * kChunkBytes;     // 36,864
constexpr int kRawBytes = kBN * 576;             // FP8 rows of one tile: 18,432
constexpr int kExchFloats = 16 * 128;            // one warpgroup's partial scores (16 per thread)
constexpr int kExchBytes = 2 * 2 * kExchFloats * 4;  // [warpgroup][tile parity]: 32,768

struct Args {
  CUtensorMap tm_kv;  // TMA variants: the cache as bytes [pages][page_size][row], box [128 B][32][1]
  const uint16_t* q;  // bf16 [B, H, 576]
  const uint8_t* kv;  // e4m3 or bf16 [pages, page_size, 576]
  const int* table;   // [B, max_pages]
  const int* lens;    // [B]
  void* part;         // [B, H, S, 512] fp16 (FP8 cache) or fp32 (BF16 cache)
  float* part_lse;    // [B, H, S] log2 units
  uint16_t* out;      // bf16 [B, H, 512] (strides below), written when num_splits == 1
  float* lse;         // [B, H] natural log, or null
  long long stride_qb, stride_qh, stride_page, stride_slot, stride_tb, stride_ob, stride_oh;  // kv strides in bytes
  int num_heads, num_splits, page_size, page_shift;  // page_shift: log2(page_size), or -1
  float q_scale, s_scale, out_scale;
};

// 128-byte swizzle: 16-byte unit u of row r (of an 8-row, 1024-byte atom) lives at unit u ^ (r & 7).
__device__ __forceinline__ uint32_t swz(int row, int unit) { return row * 128 + ((unit ^ (row & 7)) << 4); }

// 64-byte swizzle (the seesaw's P tiles, [64 heads][32 tokens] of 2 bytes): 16-byte unit u of row r at
// u ^ ((r >> 1) & 3).
__device__ __forceinline__ uint32_t swz64(int row, int unit) { return row * 64 + ((unit ^ ((row >> 1) & 3)) << 4); }

// wgmma shared-memory matrix descriptor (addresses 18 bits, encoded >> 4); swizzle: 1 = 128 bytes, 2 = 64 bytes.
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo, uint64_t swizzle = 1) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (swizzle << 62);
}

// The mbarrier counts one arrival when all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// The probes' stand-in for one side of the ring: n stages passed on untouched, each waited for on `wait` (parity
// flipped for the empty barriers, whose first phase counts as done) and handed over on `signal`.
template <int W>
__device__ __forceinline__ void pass_stages(uint32_t wait, uint32_t signal, int n, int flip) {
  for (int j = 0; j < n; ++j) {
    mbar_wait(wait + 8 * (j % W), ((j / W) & 1) ^ flip);
    mbar_arrive(signal + 8 * (j % W));
  }
}

template <bool F16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (F16) {
    return pack_f16x2(lo, hi);
  } else {
    return pack_bf16x2(lo, hi);
  }
}
template <bool F16>
__device__ __forceinline__ float2 unpack2(uint32_t x) {
  if constexpr (F16) {
    return __half22float2(*reinterpret_cast<const __half2*>(&x));
  } else {
    return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
  }
}

// wgmma asm, generated (one statement per shape and type; the accumulators are "+f" operands).
template <bool F16>
__device__ __forceinline__ void wgmma_s(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  if constexpr (F16) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
  } else {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate));
  }
}

// The same with A (16 x 16 of Q) from registers: the A-fragment layout of mma.m16n8k16 per warp (warp i of the
// warpgroup: rows 16i ..), B K-major from shared memory (no transpose).
template <bool F16>
__device__ __forceinline__ void wgmma_s_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t db, int accumulate) {
  if constexpr (F16) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
  } else {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
  }
}

template <bool F16>
__device__ __forceinline__ void wgmma_pv(float (&d)[128], const uint32_t (&a)[4], uint64_t db, int accumulate) {
  if constexpr (F16) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, p, 1, 1, 1; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
  } else {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, {%128,%129,%130,%131}, %132, p, 1, 1, 1; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
  }
}

// The same with A (P, K-major) from shared memory too: the seesaw's other warpgroup's P.
template <bool F16>
__device__ __forceinline__ void wgmma_pv_ss(float (&d)[128], uint64_t da, uint64_t db, int accumulate) {
  if constexpr (F16) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 1; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(accumulate));
  } else {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %129, p, 1, 1, 0, 1; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db), "r"(accumulate));
  }
}

// Q in shared memory: only the 64-dim chunks that hold a k-step some consumer reads from there (k-step ks of the 36
// is consumer ks / 18's k-step ks % 18; the first QR of each consumer come from registers), packed in order:
// consumer 0 reads chunks QR / 4 .. 4, consumer 1 chunks max((18 + QR) / 4, 5) .. 8 (chunk 4 holds k-steps 16-19).
// Closed forms, no loops: the descriptor offsets in score_tile must fold to constants (a loop here was left to run
// time by nvcc and split the wgmma group with branches: 25% slower).
template <int QR>
struct QMap {
  static_assert(QR >= 0 && QR <= 16, "QR");
  static constexpr int kLo0 = QR / 4, kN0 = 5 - kLo0, kLo1 = (18 + QR) / 4 > 5 ? (18 + QR) / 4 : 5;
  static constexpr int kChunks = kN0 + 9 - kLo1;
  __host__ __device__ static constexpr bool needed(int c) { return (c >= kLo0 && c <= 4) || c >= kLo1; }
  __host__ __device__ static constexpr int pos(int c) { return c <= 4 ? c - kLo0 : kN0 + c - kLo1; }
};

// The seesaw's Q: both consumers read all 36 k-steps; the first QR (a multiple of 4: whole 64-dim chunks) come
// from registers in each, so shared memory holds chunks QR / 4 .. 8 only.
template <int QR>
struct QMapSeesaw {
  static_assert(QR >= 0 && QR <= 16 && QR % 4 == 0, "QR");
  static constexpr int kLo = QR / 4, kChunks = 9 - kLo;
  __host__ __device__ static constexpr bool needed(int c) { return c >= kLo; }
  __host__ __device__ static constexpr int pos(int c) { return c - kLo; }
};
template <int QR, bool SEESAW>
struct QMapOf {
  using T = QMap<QR>;
};
template <int QR>
struct QMapOf<QR, true> {
  using T = QMapSeesaw<QR>;
};

// Partial scores of one tile over k-steps 18 WI .. 18 WI + 17 (k-step ks: chunk ks >> 2, 16 dims = 32 bytes at
// (ks & 3) of the 128-byte row; descriptor addresses are in 16-byte units). The first QR k-steps take Q from
// registers (qa[k], loaded once per CTA), the others from shared memory.
// The whole async group (fence, 18 wgmma, commit, wait) sits in one basic block: split across a branch, ptxas
// serializes the wgmmas (a wait after each).
template <bool F16, int WI, int QR>
__device__ __forceinline__ void score_tile(float (&sc)[16], const uint32_t (&qa)[QR > 0 ? QR : 1][4], uint64_t dq,
                                           uint64_t dk) {
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < 18; ++k) {
    const int ks = 18 * WI + k;
    const uint64_t db = dk + (((ks >> 2) * kChunkBytes + (ks & 3) * 32) >> 4);
    if (k < QR) {
      wgmma_s_rs<F16>(sc, qa[k < QR ? k : 0], db, k > 0);
    } else {
      wgmma_s<F16>(sc, dq + ((QMap<QR>::pos(ks >> 2) * (kM * 128) + (ks & 3) * 32) >> 4), db, k > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(sc);
}

// The seesaw's full scores of one tile: all 36 k-steps, K from shared memory, Q from registers for the first QR
// (qa) and from shared memory for the others (one async group, as above).
template <bool F16, int QR>
__device__ __forceinline__ void score_tile_full(float (&sc)[16], const uint32_t (&qa)[QR > 0 ? QR : 1][4],
                                                uint64_t dq, uint64_t dk) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 36; ++ks) {
    const uint32_t off = (ks & 3) * 32;
    const uint64_t db = dk + (((ks >> 2) * kChunkBytes + off) >> 4);
    if (ks < QR) {
      wgmma_s_rs<F16>(sc, qa[ks < QR ? ks : 0], db, ks > 0);
    } else {
      wgmma_s<F16>(sc, dq + ((QMapSeesaw<QR>::pos(ks >> 2) * (kM * 128) + off) >> 4), db, ks > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(sc);
}

// Shared memory, from a 1024-byte aligned base: Q, the KV stages, the FP8 raw ring, the score exchange, barriers.
// The seesaw's exchange holds, per pair parity and warpgroup, the reference max of each of the 64 rows it published,
// and at the end each one's row sums: [2][2][64] + [2][64] floats.
template <bool FP8, int W, int R, bool REGS, int QR, bool SEESAW>
struct Layout {
  static constexpr int kQ = 0;
  static constexpr int kStage = QMapOf<QR, SEESAW>::T::kChunks * kM * 128;  // kQBytes with all of Q in shared memory
  static constexpr int kRaw = kStage + W * kStageBytes;
  static constexpr int kExch = kRaw + (FP8 && !REGS ? R * kRawBytes : 0);
  static constexpr int kBar = kExch + (SEESAW ? 6 * kM * 4 : kExchBytes);
  static constexpr int kAlloc = kBar + 2 * W * 8 + 1024;  // + slack to align the base
};

// Registers per thread after setmaxnreg. The CTA holds what it was launched with, 168 x 384 = 64,512 (ptxas's
// count under __launch_bounds__(384, 1)); producer + consumers must fit in that, or setmaxnreg.inc waits forever.
// FP8 with more than 14 of Q's k-steps in registers needs 240 (at 232 ptxas serializes the wgmmas, C7512), which
// leaves the producer the minimum, 24.
// The seesaw's register loads hold a pair of tiles (72 registers): 104 (at 88 ptxas spills 24 bytes), its
// consumers fit in 200.
template <bool FP8, bool REGS, int QR, bool SEESAW>
struct Regs {
  static constexpr int kProducer = REGS ? (SEESAW ? 104 : 88) : (FP8 && QR > 14 ? 24 : 40);
  static constexpr int kConsumer = REGS ? (SEESAW ? 200 : 208) : (FP8 && QR > 14 ? 240 : 232);
  static_assert(128 * kProducer + 256 * kConsumer <= 168 * kThreads, "registers");
};

// Q's k-steps k0 .. k0 + QR - 1 of rows h0 and h0 + 8 of sequence b as wgmma A fragments (dims 16 k + 2c (+ 8)),
// straight from global memory; rows past the heads are zeros; FP8 caches: q * q_scale in fp16, as the shared copy.
template <bool FP8, int QR>
__device__ __forceinline__ void load_q_fragments(const Args& a, long long b, int h0, int k0, int c,
                                                 uint32_t (&qa)[QR > 0 ? QR : 1][4]) {
  const int h1 = h0 + 8;
  const uint16_t* q0 = a.q + b * a.stride_qb + (long long)h0 * a.stride_qh;
  const uint16_t* q1 = a.q + b * a.stride_qb + (long long)h1 * a.stride_qh;
#pragma unroll
  for (int k = 0; k < QR; ++k) {
    const int d = 16 * (k0 + k) + 2 * c;
    uint32_t x[4] = {0u, 0u, 0u, 0u};
    if (h0 < a.num_heads) {
      x[0] = __ldg(reinterpret_cast<const unsigned int*>(q0 + d));
      x[2] = __ldg(reinterpret_cast<const unsigned int*>(q0 + d + 8));
    }
    if (h1 < a.num_heads) {
      x[1] = __ldg(reinterpret_cast<const unsigned int*>(q1 + d));
      x[3] = __ldg(reinterpret_cast<const unsigned int*>(q1 + d + 8));
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (FP8) {
        qa[k][e] = bf16x2_to_f16x2(x[e], a.q_scale);
      } else {
        qa[k][e] = x[e];
      }
    }
  }
}

// Epilogue: rows 16 (warp in group) + g and + 8 of this warpgroup's 256 output dims (256w ..); o[4jj + 2half + e] =
// dim 256w + 8jj + 2c + e; l: the rows' full sums, m: their reference max (log2 units).
template <bool FP8>
__device__ __forceinline__ void store_rows(const Args& a, const float (&o)[128], const float (&l_row)[2],
                                           const float (&m_row)[2], int w, int tw, int hb, long long b, int split) {
  constexpr float kInf = INFINITY;
  const int lane = tw & 31, g = lane >> 2, c = lane & 3;
  const int r0 = 16 * (tw >> 5) + g;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const float l = l_row[half];
    const int h = hb * kM + r0 + 8 * half;
    if (h >= a.num_heads) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse2 = l > 0.f ? m_row[half] + log2f(l) : -kInf;
    if (a.num_splits == 1) {
      uint16_t* dst = a.out + b * a.stride_ob + (long long)h * a.stride_oh + 256 * w + 2 * c;
      const float scale = inv * a.out_scale;
#pragma unroll
      for (int jj = 0; jj < 32; ++jj)
        *reinterpret_cast<uint32_t*>(dst + 8 * jj) =
            pack2<false>(o[4 * jj + 2 * half] * scale, o[4 * jj + 2 * half + 1] * scale);
      if (w == 0 && c == 0 && a.lse != nullptr) a.lse[b * a.num_heads + h] = lse2 * 0.6931471805599453f;
    } else {
      const long long slot = (b * a.num_heads + h) * a.num_splits + split;
      if constexpr (FP8) {
        __half* dst = static_cast<__half*>(a.part) + slot * 512 + 256 * w + 2 * c;
#pragma unroll
        for (int jj = 0; jj < 32; ++jj)
          *reinterpret_cast<uint32_t*>(dst + 8 * jj) =
              pack2<true>(o[4 * jj + 2 * half] * inv, o[4 * jj + 2 * half + 1] * inv);
      } else {
        float* dst = static_cast<float*>(a.part) + slot * 512 + 256 * w + 2 * c;
#pragma unroll
        for (int jj = 0; jj < 32; ++jj)
          *reinterpret_cast<float2*>(dst + 8 * jj) =
              make_float2(o[4 * jj + 2 * half] * inv, o[4 * jj + 2 * half + 1] * inv);
      }
      if (w == 0 && c == 0) a.part_lse[slot] = lse2;
    }
  }
}

// exp2(from - to): the factor that moves sums taken against the reference max `from` to `to` (>= from).
__device__ __forceinline__ float rebase(float from, float to) { return to == -INFINITY ? 1.f : fast_exp2(from - to); }

// Scores past the sequence's end to -inf, and the max of each of this thread's two rows over its tokens (sc[4jj + e]:
// row r, token tok0 + 8jj + 2c + e; sc[4jj + 2 + e]: row r + 8).
__device__ __forceinline__ void mask_row_max(float (&sc)[16], int tok0, int c, int end, float& mx0, float& mx1) {
  mx0 = -INFINITY;
  mx1 = -INFINITY;
#pragma unroll
  for (int jj = 0; jj < 4; ++jj)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const bool live = tok0 + 8 * jj + 2 * c + e < end;
      sc[4 * jj + e] = live ? sc[4 * jj + e] : -INFINITY;
      sc[4 * jj + 2 + e] = live ? sc[4 * jj + 2 + e] : -INFINITY;
      mx0 = fmaxf(mx0, sc[4 * jj + e]);
      mx1 = fmaxf(mx1, sc[4 * jj + 2 + e]);
    }
}

// P = 2^(score * s_scale - max) in place (nm0, nm1: each row's -max), summed per row into l_run.
__device__ __forceinline__ void exp_rows(float (&sc)[16], float s_scale, float nm0, float nm1, float (&l_run)[2]) {
#pragma unroll
  for (int jj = 0; jj < 4; ++jj)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      sc[4 * jj + e] = fast_exp2(fmaf(sc[4 * jj + e], s_scale, nm0));
      sc[4 * jj + 2 + e] = fast_exp2(fmaf(sc[4 * jj + 2 + e], s_scale, nm1));
      l_run[0] += sc[4 * jj + e];
      l_run[1] += sc[4 * jj + 2 + e];
    }
}

__device__ __forceinline__ void scale_rows(float (&o)[128], float f0, float f1) {
#pragma unroll
  for (int jj = 0; jj < 32; ++jj) {
    o[4 * jj] *= f0;
    o[4 * jj + 1] *= f0;
    o[4 * jj + 2] *= f1;
    o[4 * jj + 3] *= f1;
  }
}

// The seesaw consumers (warpgroup w = 0 or 1; see the top of the file). Pair i: tiles 2i (warpgroup 0's) and 2i + 1
// (warpgroup 1's; a zero tile, all masked, past an odd count). Both measure their tile against the pair's starting
// max, publish P and their max, and move to the larger of the two afterwards, the other's P rescaled in shared
// memory where it is the smaller (rare). (Warpgroup 1 measuring against the max warpgroup 0 had just set instead put
// its softmax after warpgroup 0's: 6% slower.) Named barriers: 1 + w (pairs of parity 1: 6 + w) = warpgroup w's P
// and max are published, 3 = the row sums at the end, 4 + w = warpgroup w's own votes and syncs. Max slots
// [parity][w][64]: a slot is rewritten two pairs later, after the barrier that follows its reader's read.
template <bool FP8, int W, int QR, typename L, bool TMA>
__device__ __forceinline__ void consume_seesaw(const Args& a, uint8_t* smem, uint32_t sbase, uint32_t bar_full,
                                               uint32_t bar_empty, int w, int tw, int ntiles, int start, int end,
                                               int hb, long long b, int split) {
  constexpr float kInf = INFINITY;
  const int lane = tw & 31, g = lane >> 2, c = lane & 3;
  const int r0 = 16 * (tw >> 5) + g;  // this thread's rows r0 and r0 + 8
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run[2] = {-kInf, -kInf}, l_run[2] = {0.f, 0.f};  // l_run: this warpgroup's own tiles' sums
  float* sm = reinterpret_cast<float*>(smem + L::kExch);    // [parity][warpgroup][64] max, then [warpgroup][64] sums
  const uint64_t dq0 = make_desc(sbase + L::kQ, 16, 1024);
  const uint64_t dk0 = make_desc(sbase + L::kStage, 16, 1024);
  const uint64_t dv0 = make_desc(sbase + L::kStage + 4 * w * kChunkBytes, kChunkBytes, 1024);
  const uint64_t dp0 = make_desc(sbase + L::kStage + 8 * kChunkBytes, 16, 512, 2);  // a stage's P, 64-byte swizzle
  // Q's first QR k-steps as wgmma A fragments (rows r0 and r0 + 8, dims 16 k + 2c (+ 8)), straight from global
  // memory (FP8 caches: q * q_scale in fp16, as the shared-memory copy).
  uint32_t qa[QR > 0 ? QR : 1][4];
  if constexpr (QR > 0) {
    load_q_fragments<FP8, QR>(a, b, hb * kM + r0, 0, c, qa);
  }
  const int npairs = (ntiles + 1) / 2;
  if constexpr (kProbe == 2) {
    pass_stages<W>(bar_full, bar_empty, 2 * npairs, 0);
    return;
  }
  for (int i = 0; i < npairs; ++i) {
    const int jm = 2 * i + w, jo = 2 * i + 1 - w;  // my tile, the other warpgroup's
    const int sm_ = jm % W, so = jo % W;
    const uint64_t off_m = static_cast<uint64_t>(sm_ * kStageBytes) >> 4;
    const uint64_t off_o = static_cast<uint64_t>(so * kStageBytes) >> 4;
    float* mine = sm + 128 * (i & 1) + 64 * w;
    const float* other = sm + 128 * (i & 1) + 64 * (1 - w);
    const int bar_mine = (i & 1 ? 6 : 1) + w, bar_other = (i & 1 ? 6 : 1) + 1 - w;
    mbar_wait(bar_full + 8 * sm_, (jm / W) & 1);
    fence_proxy_async();  // the stage's cp.async (generic proxy) writes, read by wgmma
    float sc[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) sc[k] = 0.f;
    score_tile_full<FP8, QR>(sc, qa, dq0, dk0 + off_m);

    // Row max (sc[4jj + e]: row r0, token 8jj + 2c + e; sc[4jj + 2 + e]: row r0 + 8), masked past the end.
    float mx[2];
    mask_row_max(sc, start + jm * kBN, c, end, mx[0], mx[1]);
    float m_new[2], f[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float x = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2)) * a.s_scale;
      m_new[h] = x > m_run[h] + 8.f ? x : m_run[h];  // the reference moves only by more than 2^8
      f[h] = rebase(m_run[h], m_new[h]);
      l_run[h] *= f[h];
    }
    // O to this tile's max (nothing in flight: a per-warp decision).
    if (__any_sync(0xffffffffu, f[0] != 1.f || f[1] != 1.f)) scale_rows(o, f[0], f[1]);
    const float nm0 = m_new[0] == -kInf ? 0.f : -m_new[0];
    const float nm1 = m_new[1] == -kInf ? 0.f : -m_new[1];
    exp_rows(sc, a.s_scale, nm0, nm1, l_run);
    // P as wgmma A fragments (k-step kk: tokens 16kk ..), and into this tile's rope chunk for the other warpgroup:
    // pa[kk][2q + hh] holds row r0 + 8hh, tokens 16kk + 8q + 2c (+1) = 16-byte unit 2kk + q of the row.
    uint32_t pa[2][4];
    uint8_t* pbuf = smem + L::kStage + sm_ * kStageBytes + 8 * kChunkBytes;
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
      for (int q = 0; q < 2; ++q)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          const int jj = 2 * kk + q;
          pa[kk][2 * q + hh] = pack2<FP8>(sc[4 * jj + 2 * hh], sc[4 * jj + 2 * hh + 1]);
          *reinterpret_cast<uint32_t*>(pbuf + swz64(r0 + 8 * hh, jj) + 4 * c) = pa[kk][2 * q + hh];
        }
    if (c == 0) {
      mine[r0] = m_new[0];
      mine[r0 + 8] = m_new[1];
    }
    fence_proxy_async();  // P's generic stores, read by the other warpgroup's wgmma
    named_bar_arrive(bar_mine, 256);
    mbar_wait(bar_full + 8 * so, (jo / W) & 1);  // (long complete: the other warpgroup has used it)
    fence_proxy_async();
    // Own P first (the other's may still be in the making), then the other's, both against the larger max.
    wgmma_fence();
    wgmma_pv<FP8>(o, pa[0], dv0 + off_m, 1);
    wgmma_pv<FP8>(o, pa[1], dv0 + off_m + (2048 >> 4), 1);
    wgmma_commit();
    named_bar_sync(bar_other, 256);  // the other warpgroup's P and max
    const float mo[2] = {other[r0], other[r0 + 8]};
    float fp[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float top = fmaxf(m_new[h], mo[h]);
      f[h] = rebase(m_new[h], top);
      fp[h] = rebase(mo[h], top);
      l_run[h] *= f[h];
      m_run[h] = top;
    }
    // Decided for the whole warpgroup at once, so the common case chains the two products without waiting.
    if (warpgroup_any(4 + w, f[0] != 1.f || f[1] != 1.f || fp[0] != 1.f || fp[1] != 1.f)) {
      wgmma_wait<0>();
      fence_regs(o);
      scale_rows(o, f[0], f[1]);
      // The other's P (read by this warpgroup alone) to the larger max, in place: the units its own thread wrote.
      uint8_t* pother = smem + L::kStage + so * kStageBytes + 8 * kChunkBytes;
#pragma unroll
      for (int jj = 0; jj < 4; ++jj)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
          uint32_t* x = reinterpret_cast<uint32_t*>(pother + swz64(r0 + 8 * hh, jj) + 4 * c);
          const float2 v = unpack2<FP8>(*x);
          *x = pack2<FP8>(v.x * fp[hh], v.y * fp[hh]);
        }
      fence_proxy_async();
      named_bar_sync(4 + w, 128);
    }
    wgmma_fence();
    wgmma_pv_ss<FP8>(o, dp0 + off_o, dv0 + off_o, 1);
    wgmma_pv_ss<FP8>(o, dp0 + off_o + (32 >> 4), dv0 + off_o + (2048 >> 4), 1);
    wgmma_commit();
    wgmma_wait<1>();
    mbar_arrive(bar_empty + 8 * sm_);  // this thread is done with its own tile's stage
    wgmma_wait<0>();
    fence_regs(o);
    mbar_arrive(bar_empty + 8 * so);
  }

  // Row sums: over the 4 threads of a row, then the two warpgroups' (both now against the same max).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  float* sl = sm + 4 * kM;
  if (c == 0) {
    sl[64 * w + r0] = l_run[0];
    sl[64 * w + r0 + 8] = l_run[1];
  }
  named_bar_sync(3, 256);
  const float l_all[2] = {sl[r0] + sl[64 + r0], sl[r0 + 8] + sl[64 + r0 + 8]};
  store_rows<FP8>(a, o, l_all, m_run, w, tw, hb, b, split);
}

template <bool FP8, int W, int R, bool REGS, int QR, bool SEESAW, bool TMA>
__global__ void __launch_bounds__(kThreads, 1) mla_decode_wgmma_sm90(const __grid_constant__ Args a) {
  using L = Layout<FP8, W, R, REGS, QR, SEESAW>;
  static_assert(QR >= 0 && QR <= 16 && !(REGS && QR > 0) && !(SEESAW && QR % 4), "Q k-steps in registers");
  static_assert(!TMA || (SEESAW && !FP8), "TMA loads: the BF16 seesaws only");
  using QM = typename QMapOf<QR, SEESAW>::T;
  static_assert(L::kAlloc <= 232448, "shared memory");
  constexpr float kInf = INFINITY;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t sbase = smem_u32(smem);

  pdl_launch_dependents();  // the merge (if any) may launch now: it waits for this grid's end
  const int tid = threadIdx.x, wg = tid >> 7, tw = tid & 127;
  const int hb = blockIdx.x, split = blockIdx.y;
  const long long b = blockIdx.z;
  const int seq_len = a.lens[b];
  const int split_len = ((seq_len + a.num_splits - 1) / a.num_splits + kBN - 1) / kBN * kBN;
  const int start = split * split_len;
  const int end = min(start + split_len, seq_len);
  const int ntiles = end > start ? (end - start + kBN - 1) / kBN : 0;
  const int nload = SEESAW ? (ntiles + 1) / 2 * 2 : ntiles;  // tiles the producer fills (the seesaw's: pairs)
  const uint32_t bar_full = sbase + L::kBar, bar_empty = bar_full + 8 * W;

  if (tid == 0) {
#pragma unroll
    for (int s = 0; s < W; ++s) {
      mbar_init(bar_full + 8 * s, TMA ? 1 : 128);  // the producer's 128 threads (TMA: its one issuing thread)
      mbar_init(bar_empty + 8 * s, 256);           // the consumers' 256 threads
    }
  }
  // Q [64 heads, 576] -> shared memory, swizzled; head rows past num_heads are zeros. FP8 caches: q * q_scale
  // in fp16 (exact: q_scale is a power of two); BF16: q as is.
  for (int i = tid; i < (QM::kChunks > 0 ? kM * 72 : 0); i += kThreads) {
    const int row = i / 72, u = i - row * 72;  // 16-byte unit u = dims 8u .. 8u + 7
    if (!QM::needed(u >> 3)) continue;
    const int h = hb * kM + row;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (h < a.num_heads) {
      const uint4 x = *reinterpret_cast<const uint4*>(a.q + b * a.stride_qb + (long long)h * a.stride_qh + 8 * u);
      if constexpr (FP8) {
        v = make_uint4(bf16x2_to_f16x2(x.x, a.q_scale), bf16x2_to_f16x2(x.y, a.q_scale),
                       bf16x2_to_f16x2(x.z, a.q_scale), bf16x2_to_f16x2(x.w, a.q_scale));
      } else {
        v = x;
      }
    }
    *reinterpret_cast<uint4*>(smem + L::kQ + QM::pos(u >> 3) * (kM * 128) + swz(row, u & 7)) = v;
  }
  if constexpr (kProbe == 1) {
    for (int i = tid; i < W * kStageBytes / 16; i += kThreads)
      reinterpret_cast<uint4*>(smem + L::kStage)[i] = make_uint4(0u, 0u, 0u, 0u);
  }
  fence_proxy_async();  // Q's generic stores, read by wgmma (the async proxy)
  __syncthreads();

  if (wg == 0) {
    // ---------------------------------------------------------------- producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs<FP8, REGS, QR, SEESAW>::kProducer));
    if constexpr (TMA) {
      // Thread 0 copies every tile that lies wholly before the slice's end by TMA, 9 boxes of [32 rows][128 B] (one
      // 64-dim chunk each, the swizzle the tensor map applies is the stage's; the tile lies in one page, page size a
      // multiple of 32). The tile that crosses the end, and the seesaw's tile past it, come as in variant 20: each
      // thread's cp.async of its row, zero-filled past the end, waited for, then one arrival. (TMA copies whole
      // rows: NaN past the end, zeroed by the consumers, still reached the output; mla_decode_h200_2026-12-03-tma.md.)
      // All 128 threads follow the ring's phases.
      if constexpr (kProbe == 1) {
        if (tw == 0) pass_stages<W>(bar_empty, bar_full, nload, 1);
        return;
      }
      const int* trow = a.table + b * a.stride_tb;
      const int t = tw >> 2, sub = tw & 3;
      auto page_at = [&](int n) -> int { return trow[a.page_shift >= 0 ? n >> a.page_shift : n / a.page_size]; };
      auto slot_at = [&](int n) -> int { return a.page_shift >= 0 ? n & (a.page_size - 1) : n % a.page_size; };
      int page = tw == 0 && start + kBN <= end ? page_at(start) : -1;  // thread 0: the next TMA tile's page
      for (int j = 0; j < nload; ++j) {
        const int tok0 = start + j * kBN, s = j % W;
        const bool whole = tok0 + kBN <= end;
        const int page_next = tw == 0 && tok0 + 2 * kBN <= end ? page_at(tok0 + kBN) : -1;
        const uint32_t full = bar_full + 8 * s, stage = sbase + L::kStage + s * kStageBytes;
        mbar_wait(bar_empty + 8 * s, ((j / W) & 1) ^ 1);
        if (whole) {
          if (tw == 0) {
            mbar_expect_tx(full, kStageBytes);
#pragma unroll
            for (int c = 0; c < 9; ++c) tma_load_3d(stage + c * kChunkBytes, &a.tm_kv, 128 * c, slot_at(tok0), page, full);
          }
        } else {
          const int n = tok0 + t;
          const int bytes = n < end ? 16 : 0;
          const uint8_t* src = n < end ? a.kv + (long long)page_at(n) * a.stride_page + (long long)slot_at(n) * a.stride_slot
                                       : a.kv;
#pragma unroll
          for (int i = 0; i < 18; ++i) {
            const int u = sub + 4 * i;
            cp_async16(stage + (u >> 3) * kChunkBytes + swz(t, u & 7), src + 16 * u, bytes);
          }
          cp_async_commit();  // (wait_group waits for committed groups only)
          cp_async_wait<0>();  // (at most twice a slice: the copies waited for here, then the barrier's one arrival)
          fence_proxy_async();  // these generic-proxy writes, read by wgmma
          named_bar_sync(8, 128);
          if (tw == 0) mbar_arrive(full);
        }
        page = page_next;
      }
      cp_async_wait<0>();
      return;
    }
    if constexpr (kProbe == 1) {
      pass_stages<W>(bar_empty, bar_full, nload, 1);
      return;
    }
    const int t = tw >> 2, sub = tw & 3;  // this thread's token row of every tile, and its quarter of the row
    const int* trow = a.table + b * a.stride_tb;
    // Page ids are loaded a tile before their row is copied: the table load is off the copy's critical path.
    auto page_of = [&](int j) -> int {  // -1: past the slice's end (zero-filled, never read from HBM)
      const int n = start + j * kBN + t;
      return n < end ? trow[a.page_shift >= 0 ? n >> a.page_shift : n / a.page_size] : -1;
    };
    auto row_of = [&](int j, int page, int& bytes) -> const uint8_t* {
      bytes = page >= 0 ? 16 : 0;
      if (page < 0) return a.kv;
      const int n = start + j * kBN + t;
      const int slot = a.page_shift >= 0 ? n & (a.page_size - 1) : n % a.page_size;
      return a.kv + (long long)page * a.stride_page + (long long)slot * a.stride_slot;
    };
    // Widen 16 e4m3 (dims 64 i + 16 sub .. + 15 of row t) into two swizzled 16-byte units of chunk i.
    auto widen = [&](uint8_t* stage, int i, const uint4& x) {
      uint4 lo, hi;
      e4m3x4_to_f16x2x2(x.x, lo.x, lo.y);
      e4m3x4_to_f16x2x2(x.y, lo.z, lo.w);
      e4m3x4_to_f16x2x2(x.z, hi.x, hi.y);
      e4m3x4_to_f16x2x2(x.w, hi.z, hi.w);
      *reinterpret_cast<uint4*>(stage + i * kChunkBytes + swz(t, 2 * sub)) = lo;
      *reinterpret_cast<uint4*>(stage + i * kChunkBytes + swz(t, 2 * sub + 1)) = hi;
    };
    if constexpr (FP8 && REGS) {
      // The 9 16-byte units sub + 4i of row t, in registers; tile j + 1's loads are issued before tile j waits for
      // its stage, so they are in flight while the consumers work.
      auto load = [&](int j, int page, uint4 (&r)[9]) {
        int bytes;
        const uint8_t* src = row_of(j, page, bytes);
#pragma unroll
        for (int i = 0; i < 9; ++i)
          r[i] = bytes ? __ldg(reinterpret_cast<const uint4*>(src + 16 * (sub + 4 * i))) : make_uint4(0u, 0u, 0u, 0u);
      };
      if constexpr (SEESAW) {
        // Stages free two at a time (a pair's end): both tiles of the next pair are loaded as soon as this pair's
        // are stored, a whole pair ahead (a tile ahead left the second tile of each pair a bare load's latency).
        uint4 buf[2][9];
        int pg0 = page_of(0), pg1 = page_of(1);
        for (int j = 0; j < nload; j += 2) {
          if (j == 0) {
            load(0, pg0, buf[0]);
            load(1, pg1, buf[1]);
            pg0 = page_of(2);
            pg1 = page_of(3);
          }
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            const int s = (j + u) % W;
            mbar_wait(bar_empty + 8 * s, (((j + u) / W) & 1) ^ 1);
            uint8_t* stage = smem + L::kStage + s * kStageBytes;
#pragma unroll
            for (int i = 0; i < 9; ++i) widen(stage, i, buf[u][i]);
            fence_proxy_async();
            mbar_arrive(bar_full + 8 * s);
          }
          if (j + 2 < nload) {
            load(j + 2, pg0, buf[0]);
            load(j + 3, pg1, buf[1]);
            pg0 = page_of(j + 4);
            pg1 = page_of(j + 5);
          }
        }
        return;
      }
      uint4 cur[9];
      if (nload > 0) load(0, page_of(0), cur);
      int page_next = page_of(1);
      for (int j = 0; j < nload; ++j) {
        uint4 nxt[9];
        if (j + 1 < nload) load(j + 1, page_next, nxt);
        page_next = page_of(j + 2);
        const int s = j % W;
        mbar_wait(bar_empty + 8 * s, ((j / W) & 1) ^ 1);
        uint8_t* stage = smem + L::kStage + s * kStageBytes;
#pragma unroll
        for (int i = 0; i < 9; ++i) widen(stage, i, cur[i]);
        fence_proxy_async();
        mbar_arrive(bar_full + 8 * s);
#pragma unroll
        for (int i = 0; i < 9; ++i) cur[i] = nxt[i];
      }
    } else if constexpr (FP8) {
      // Raw rows [32][576 B] per raw slot; thread (t, sub) copies and later widens the 16-byte units
      // sub + 4i (i = 0..8: chunk i, dims 64i + 16 sub .. + 15) of row t: only bytes it copied itself.
      auto issue = [&](int j, int slot, int page) {
        int bytes;
        const uint8_t* src = row_of(j, page, bytes);
        const uint32_t dst = sbase + L::kRaw + slot * kRawBytes + t * 576;
#pragma unroll
        for (int i = 0; i < 9; ++i) cp_async16(dst + 16 * (sub + 4 * i), src + 16 * (sub + 4 * i), bytes);
      };
#pragma unroll
      for (int i = 0; i < R; ++i) {
        if (i < nload) issue(i, i, page_of(i));
        cp_async_commit();
      }
      int page_next = page_of(R);
      for (int j = 0; j < nload; ++j) {
        cp_async_wait<R - 1>();  // tile j's raw bytes (this thread's) have landed
        const int s = j % W;
        mbar_wait(bar_empty + 8 * s, ((j / W) & 1) ^ 1);
        const uint8_t* raw = smem + L::kRaw + (j % R) * kRawBytes + t * 576;
        uint8_t* stage = smem + L::kStage + s * kStageBytes;
#pragma unroll
        for (int i = 0; i < 9; ++i) {
          const uint4 x = *reinterpret_cast<const uint4*>(raw + 16 * (sub + 4 * i));  // one LDS.128 (a load
          widen(stage, i, x);  // passed straight by reference was split into four 4-byte LDS: 4-way conflicts)
        }
        fence_proxy_async();
        mbar_arrive(bar_full + 8 * s);
        if (j + R < nload) issue(j + R, j % R, page_next);
        cp_async_commit();
        page_next = page_of(j + R + 1);
      }
    } else {
      // BF16: 16-byte unit u = sub + 4i (i = 0..17) of the 1152-byte row: dims 8u .. 8u + 7 = chunk u >> 3.
      int page = page_of(0);
      for (int j = 0; j < nload; ++j) {
        const int s = j % W;
        mbar_wait(bar_empty + 8 * s, ((j / W) & 1) ^ 1);
        int bytes;
        const uint8_t* src = row_of(j, page, bytes);
        page = page_of(j + 1);
        const uint32_t stage = sbase + L::kStage + s * kStageBytes;
#pragma unroll
        for (int i = 0; i < 18; ++i) {
          const int u = sub + 4 * i;
          cp_async16(stage + (u >> 3) * kChunkBytes + swz(t, u & 7), src + 16 * u, bytes);
        }
        cp_async_mbar_arrive(bar_full + 8 * s);
      }
      cp_async_wait<0>();
    }
    return;
  }

  // ------------------------------------------------------------------ consumers
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs<FP8, REGS, QR, SEESAW>::kConsumer));
  if constexpr (SEESAW) {
    consume_seesaw<FP8, W, QR, L, TMA>(a, smem, sbase, bar_full, bar_empty, wg - 1, tw, ntiles, start, end, hb, b,
                                       split);
    return;
  }
  const int w = wg - 1;  // dims: scores over k-steps 18w .. 18w + 17, output dims 256w .. 256w + 255
  const int lane = tw & 31, g = lane >> 2, c = lane & 3;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  float m_run[2] = {-kInf, -kInf}, l_run[2] = {0.f, 0.f};
  float* exch = reinterpret_cast<float*>(smem + L::kExch);
  // Q's first QR k-steps of this warpgroup's 18 as wgmma A fragments (rows r and r + 8, dims 16 ks + 2c (+ 8)),
  // straight from global memory; FP8 caches: q * q_scale in fp16, as the shared-memory copy.
  uint32_t qa[QR > 0 ? QR : 1][4];
  if constexpr (QR > 0) {
    load_q_fragments<FP8, QR>(a, b, hb * kM + 16 * (tw >> 5) + g, 18 * w, c, qa);
  }
  // Descriptors (K-major Q and K: 8-row groups 1024 bytes apart; V N-major: 64-dim chunks kChunkBytes apart).
  const uint64_t dq0 = make_desc(sbase + L::kQ, 16, 1024);
  const uint64_t dk0 = make_desc(sbase + L::kStage, 16, 1024);
  const uint64_t dv0 = make_desc(sbase + L::kStage + 4 * w * kChunkBytes, kChunkBytes, 1024);
  if constexpr (kProbe == 2) {
    pass_stages<W>(bar_full, bar_empty, ntiles, 0);
    return;
  }

  for (int j = 0; j < ntiles; ++j) {
    const int s = j % W;
    mbar_wait(bar_full + 8 * s, (j / W) & 1);
    fence_proxy_async();  // the stage's cp.async (generic proxy) writes, read by wgmma
    const uint64_t stage_off = static_cast<uint64_t>(s * kStageBytes) >> 4;
    float sc[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) sc[i] = 0.f;
    if (w == 0) {  // warpgroup-uniform: compile-time descriptor offsets in each branch
      score_tile<FP8, 0, QR>(sc, qa, dq0, dk0 + stage_off);
    } else {
      score_tile<FP8, 1, QR>(sc, qa, dq0, dk0 + stage_off);
    }

    // The full scores: this warpgroup's partial + the other's (same thread mapping in both; a + b == b + a).
    float4* mine = reinterpret_cast<float4*>(exch + (w * 2 + (j & 1)) * kExchFloats);
    const float4* other = reinterpret_cast<const float4*>(exch + ((1 - w) * 2 + (j & 1)) * kExchFloats);
#pragma unroll
    for (int r = 0; r < 4; ++r) mine[r * 128 + tw] = make_float4(sc[4 * r], sc[4 * r + 1], sc[4 * r + 2], sc[4 * r + 3]);
    named_bar_sync(1, 256);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float4 x = other[r * 128 + tw];
      sc[4 * r] += x.x;
      sc[4 * r + 1] += x.y;
      sc[4 * r + 2] += x.z;
      sc[4 * r + 3] += x.w;
    }

    // Online softmax. Accumulator layout: sc[4jj + e] = (row g, token 8jj + 2c + e), sc[4jj + 2 + e] = row g + 8.
    float mx0, mx1;
    mask_row_max(sc, start + j * kBN, c, end, mx0, mx1);
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2)) * a.s_scale;
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2)) * a.s_scale;
    if (__any_sync(0xffffffffu, mx0 > m_run[0] + 8.f || mx1 > m_run[1] + 8.f)) {
      const float n0 = fmaxf(m_run[0], mx0), n1 = fmaxf(m_run[1], mx1);
      const float a0 = n0 == -kInf ? 1.f : fast_exp2(m_run[0] - n0);
      const float a1 = n1 == -kInf ? 1.f : fast_exp2(m_run[1] - n1);
      m_run[0] = n0;
      m_run[1] = n1;
      l_run[0] *= a0;
      l_run[1] *= a1;
#pragma unroll
      for (int jj = 0; jj < 32; ++jj) {
        o[4 * jj] *= a0;
        o[4 * jj + 1] *= a0;
        o[4 * jj + 2] *= a1;
        o[4 * jj + 3] *= a1;
      }
    }
    const float nm0 = m_run[0] == -kInf ? 0.f : -m_run[0];
    const float nm1 = m_run[1] == -kInf ? 0.f : -m_run[1];
    exp_rows(sc, a.s_scale, nm0, nm1, l_run);
    // P as wgmma A fragments: k-step kk (tokens 16kk .. 16kk + 15) = n-blocks 2kk (k 0-7) and 2kk + 1 (k 8-15).
    uint32_t pa[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      pa[kk][0] = pack2<FP8>(sc[8 * kk + 0], sc[8 * kk + 1]);
      pa[kk][1] = pack2<FP8>(sc[8 * kk + 2], sc[8 * kk + 3]);
      pa[kk][2] = pack2<FP8>(sc[8 * kk + 4], sc[8 * kk + 5]);
      pa[kk][3] = pack2<FP8>(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
    wgmma_fence();
    wgmma_pv<FP8>(o, pa[0], dv0 + stage_off, 1);
    wgmma_pv<FP8>(o, pa[1], dv0 + stage_off + (2048 >> 4), 1);  // tokens 16..31: two 8-row groups on
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    mbar_arrive(bar_empty + 8 * s);  // this thread is done with the stage
  }

  // Epilogue: each row's sum over its 4 threads (c), then the rows out.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l_run[half] += __shfl_xor_sync(0xffffffffu, l_run[half], 1);
    l_run[half] += __shfl_xor_sync(0xffffffffu, l_run[half], 2);
  }
  store_rows<FP8>(a, o, l_run, m_run, w, tw, hb, b, split);
}

// The configurations (variant: cache, stages, FP8 raw-ring depth, FP8 loads through registers, how many of each
// consumer's 18 score k-steps take Q from registers, seesaw consumers, TMA loads;
// registers per producer / consumer thread):
//  0: BF16, 3 stages (cp.async); Q in shared memory (40 / 232).
//  1: FP8, 2 stages + a 2-deep cp.async raw ring; Q in shared memory (40 / 232).
//  2: FP8, 3 stages, loads through registers a tile ahead (88 / 208).
//  3: as 1 with 14 of 18 k-steps' Q in registers (56 per consumer thread; 40 / 232): those score wgmmas read only
//     K from shared memory, 2 KB less each; Q's shared copy shrinks to the 3 chunks the other k-steps read (24 KB).
//  4: as 3 with 3 stages (in the 49 KB freed).   5: as 3 with 3 stages and a 3-deep raw ring.
//  6: BF16, 3 stages, 14 of 18 k-steps' Q in registers (40 / 232).   7: as 6 with 4 stages.
//  8: as 3 with 16 of 18 k-steps' Q in registers (24 / 240; Q's shared copy 16 KB).
// (All 18 in registers, 72 per thread, does not fit: ptxas serializes the wgmmas even at 240.)
// Seesaw (the last column; Q all in shared memory; 4 stages let the producer fill a whole pair ahead): 18: FP8, 4
// stages, loads through registers a pair ahead (104 / 200).   19: BF16, 4 stages (cp.async; 40 / 232).   20: as 19
// with the first 8 of the 36 score k-steps' Q in registers (32 per consumer thread; Q's shared copy the other 7
// chunks, 56 KB). (Tried: 12 k-steps, BF16, no faster than 8; FP8 with 8 k-steps in registers, a 1-deep cp.async
// raw ring and 40 / 232 registers, 10% slower than 18: the raw ring keeps one tile in flight.)
// TMA loads (the last column; page sizes of a multiple of 32 slots, else it runs as 20): 23: as 20. (Tried,
// mla_decode_h200_2026-12-03-tma.md: 25, 5 stages and 16 k-steps of Q in registers, no faster; 24, TMA with the
// lead/follow consumers, and 47, those consumers with cp.async, 4-11% slower than 23.)
// (Tried, 2026-12-03, benchmarks/results/mla_decode_h200_2026-12-03.md: the producer's thread 0 asking the L2 for
// the tile 2, 4 or 8 ahead (cp.async.bulk.prefetch.L2), 0-32% slower, the producer alone slower too (645 -> 770 us
// at B=128 ctx 16384): the loads are not waiting on HBM latency; the two head blocks as a cluster of 2 kept within
// 2 or 8 tiles of each other, 8-25% slower at 128 heads: each KV byte already comes from HBM once; the seesaw's two
// consumers run half a pair apart (lead/follow, commit 38d8f0b): 14-20% faster alone, 2-9% slower as built,
// benchmarks/results/mla_decode_h200_2026-12-03-leadfollow.md; BF16 (mla_decode_h200_2026-12-03-tma.md): the two head
// blocks as a cluster whose producers multicast each tile to both by TMA (commit 712405c), 6-20% slower, the producer
// alone slower too; FP8 (mla_decode_h200_2026-12-03-tma-crossing.md, commit cc1b438): the 8-bit rows by TMA into the
// stages, widened there in place, so the producer needs 40 registers and the consumers get 232 and 8 k-steps of Q:
// consumers alone 7-13% faster, the producer 11-34% slower, 7-11% slower as built.)
#define DG_WGMMA_CONFIGS(X)                                                                                           \
  X(0, false, 3, 1, false, 0, false, false) X(1, true, 2, 2, false, 0, false, false)                                  \
  X(2, true, 3, 1, true, 0, false, false) X(3, true, 2, 2, false, 14, false, false)                                   \
  X(4, true, 3, 2, false, 14, false, false) X(5, true, 3, 3, false, 14, false, false)                                 \
  X(6, false, 3, 1, false, 14, false, false) X(7, false, 4, 1, false, 14, false, false)                               \
  X(8, true, 2, 2, false, 16, false, false) X(18, true, 4, 1, true, 0, true, false)                                   \
  X(19, false, 4, 1, false, 0, true, false) X(20, false, 4, 1, false, 8, true, false)                                 \
  X(23, false, 4, 1, false, 8, true, true)

// Where TMA does not apply, the TMA variant runs as variant 20 (the BF16 seesaw).
#define DG_WGMMA_TMA_FALLBACK false, 4, 1, false, 8, true, false

template <bool FP8, int W, int R, bool REGS, int QR, bool SEESAW, bool TMA>
int prepare(int* regs, int* per_sm, int* smem_bytes) {
  if constexpr (TMA) {  // its fallback too
    int r, p, m;
    const int err = prepare<DG_WGMMA_TMA_FALLBACK>(&r, &p, &m);
    if (err != cudaSuccess) return err;
  }
  constexpr int smem = Layout<FP8, W, R, REGS, QR, SEESAW>::kAlloc;
  *smem_bytes = smem;
  return prepare_kernel(mla_decode_wgmma_sm90<FP8, W, R, REGS, QR, SEESAW, TMA>, kThreads, smem, regs, per_sm);
}

// TMA variants load by TMA where the cache allows (pages of a multiple of 32 slots, 16-byte aligned base and strides,
// a tensor map that encodes), else run as variant 20 (*used_tma says which).
template <bool FP8, int W, int R, bool REGS, int QR, bool SEESAW, bool TMA>
int launch(Args& a, int batch, cudaStream_t stream, long long num_pages, int* used_tma) {
  constexpr int smem = Layout<FP8, W, R, REGS, QR, SEESAW>::kAlloc;
  const dim3 grid((a.num_heads + kM - 1) / kM, a.num_splits, batch);
  if constexpr (TMA) {
    if (!(a.page_size % kBN == 0 && reinterpret_cast<uintptr_t>(a.kv) % 16 == 0 && a.stride_slot % 16 == 0 &&
          a.stride_page % 16 == 0 &&
          encode_map(&a.tm_kv, a.kv, num_pages, a.page_size, a.stride_slot, a.stride_page, FP8 ? 576 : 1152, 128,
                     CU_TENSOR_MAP_SWIZZLE_128B, kBN)))
      return launch<DG_WGMMA_TMA_FALLBACK>(a, batch, stream, num_pages, used_tma);
    *used_tma = 1;
  }
  mla_decode_wgmma_sm90<FP8, W, R, REGS, QR, SEESAW, TMA><<<grid, kThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

// Returns a cudaError_t (cudaErrorInvalidValue for an unknown variant). fp8 (out): whether it reads an e4m3 cache.
extern "C" int dg_mla_wgmma_prepare(int variant, int* regs, int* per_sm, int* block_n, int* smem_bytes, int* fp8) {
  *block_n = kBN;
#define DG_PREPARE(V, FP8, W, R, REGS, QR, SEESAW, TMA)                          \
  if (variant == V) {                                                             \
    *fp8 = FP8;                                                                   \
    return prepare<FP8, W, R, REGS, QR, SEESAW, TMA>(regs, per_sm, smem_bytes); \
  }
  DG_WGMMA_CONFIGS(DG_PREPARE)
  return cudaErrorInvalidValue;
}

extern "C" int dg_mla_wgmma_launch(int variant, const void* q, const void* kv, const void* table, const void* lens,
                                   void* part, void* part_lse, void* out, void* lse, long long stride_qb,
                                   long long stride_qh, long long stride_page_bytes, long long stride_slot_bytes,
                                   long long stride_tb, long long stride_ob, long long stride_oh, int num_heads,
                                   int num_splits, int batch, int page_size, float q_scale, float s_scale,
                                   float out_scale, void* stream, long long num_pages, int* used_tma) {
  *used_tma = 0;
  Args a{{},
         static_cast<const uint16_t*>(q), static_cast<const uint8_t*>(kv), static_cast<const int*>(table),
         static_cast<const int*>(lens), part, static_cast<float*>(part_lse), static_cast<uint16_t*>(out),
         static_cast<float*>(lse), stride_qb, stride_qh, stride_page_bytes, stride_slot_bytes, stride_tb,
         stride_ob, stride_oh, num_heads, num_splits, page_size,
         (page_size & (page_size - 1)) == 0 ? __builtin_ctz(page_size) : -1, q_scale, s_scale, out_scale};
  cudaStream_t st = static_cast<cudaStream_t>(stream);
#define DG_LAUNCH(V, FP8, W, R, REGS, QR, SEESAW, TMA) \
  if (variant == V) return launch<FP8, W, R, REGS, QR, SEESAW, TMA>(a, batch, st, num_pages, used_tma);
  DG_WGMMA_CONFIGS(DG_LAUNCH)
  return cudaErrorInvalidValue;
}
