// Throughput of the wgmma shapes the MLA decode kernel (src/decodegap/kernels/mla_decode_sm90_wgmma.cu, whose
// helpers are included) issues, in isolation: every CTA (one per SM) runs W warpgroups that each issue the same
// async group ITERS times (fence, the products, commit, wait 0), with bf16 operands in shared memory (contents
// irrelevant; modes 4-6 hold O, 128 registers, so at most 2 warpgroups). Built and run by mla_wgmma_rate.py, which prints FLOP per clock per SM.
//   mode 0: the seesaw's scores of a 32-token tile, score_tile_full (36 x m64n32k16, Q and K from shared memory)
//   mode 1: the same 36 k-steps with Q from registers (RS)
//   mode 2: scores of a 64-token tile, 36 x m64n64k16 SS;  mode 3: the same RS
//   mode 4: the seesaw's P.V of a pair (2 x m64n256k16 RS + 2 x m64n256k16 SS)
//   mode 5: mode 0, wait, then mode 4 (one consumer's tensor work for one seesaw pair)
//   mode 6: mode 2, wait, then 4 x m64n256k16 RS + 4 x SS (the same for a 64-token tile pair)
#include "../src/decodegap/kernels/mla_decode_sm90_wgmma.cu"

namespace {

constexpr int kIters = 64;

__device__ __forceinline__ void wgmma_s64(float (&d)[32], uint64_t da, uint64_t db, int acc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(acc));
}
__device__ __forceinline__ void wgmma_s64_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int acc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0; }\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

__device__ __forceinline__ void scores64(float (&s)[32], const uint32_t (&a)[4], uint64_t dq, uint64_t dk, bool rs) {
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 36; ++ks) {
    const uint64_t db = dk + (((ks >> 2) * (64 * 128) + (ks & 3) * 32) >> 4);
    if (rs) {
      wgmma_s64_rs(s, a, db, ks > 0);
    } else {
      wgmma_s64(s, dq + (((ks >> 2) * (kM * 128) + (ks & 3) * 32) >> 4), db, ks > 0);
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(s);
}

template <int MODE>
__global__ void __launch_bounds__(MODE >= 4 ? 256 : 384, 1) rate_kernel(long long* cycles, float* sink) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t sbase = smem_u32(smem);
  for (int i = threadIdx.x; i < (kQBytes + 9 * 64 * 128) / 4; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = 0x3c003c00u ^ (i * 2654435761u & 0x00ff00ffu);  // small bf16 values
  fence_proxy_async();
  __syncthreads();
  const uint64_t dq = make_desc(sbase, 16, 1024), dk = make_desc(sbase + kQBytes, 16, 1024);
  const uint64_t dv = make_desc(sbase + kQBytes, kChunkBytes, 1024);
  const uint64_t dp = make_desc(sbase + kQBytes + 8 * kChunkBytes, 16, 512, 2);
  uint32_t qa[1][4] = {{threadIdx.x, 2u, 3u, 4u}};
  const uint32_t(&a4)[4] = qa[0];
  float acc = 0.f;
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  long long t0 = clock64();
  for (int it = 0; it < kIters; ++it) {
    if constexpr (MODE == 0 || MODE == 1 || MODE == 5) {
      float sc[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) sc[k] = 0.f;
      if constexpr (MODE == 1) {
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < 36; ++ks)
          wgmma_s_rs<false>(sc, a4, dk + (((ks >> 2) * kChunkBytes + (ks & 3) * 32) >> 4), ks > 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs(sc);
      } else {
        score_tile_full<false, 0>(sc, qa, dq, dk);
      }
#pragma unroll
      for (int k = 0; k < 16; ++k) acc += sc[k];
    }
    if constexpr (MODE == 2 || MODE == 3 || MODE == 6) {
      float sc[32];
#pragma unroll
      for (int k = 0; k < 32; ++k) sc[k] = 0.f;
      scores64(sc, a4, dq, dk, MODE == 3);
#pragma unroll
      for (int k = 0; k < 32; ++k) acc += sc[k];
    }
    if constexpr (MODE == 4 || MODE == 5 || MODE == 6) {
      constexpr int kReps = MODE == 6 ? 2 : 1;
      wgmma_fence();
#pragma unroll
      for (int r = 0; r < kReps; ++r) {
        wgmma_pv<false>(o, a4, dv, 1);
        wgmma_pv<false>(o, a4, dv + (2048 >> 4), 1);
        wgmma_pv_ss<false>(o, dp, dv, 1);
        wgmma_pv_ss<false>(o, dp + (32 >> 4), dv + (2048 >> 4), 1);
      }
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
    }
  }
  __syncthreads();
  long long t1 = clock64();
#pragma unroll
  for (int i = 0; i < 128; ++i) acc += o[i];
  if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
  if (acc == 12345.f) sink[threadIdx.x] = acc;  // keeps the products
}

template <int MODE>
int launch(int ctas, int warpgroups, long long* cycles, float* sink) {
  const int smem = kQBytes + 9 * 64 * 128 + 1024;
  if (MODE >= 4 && warpgroups > 2) return -2;
  cudaError_t err = cudaFuncSetAttribute(rate_kernel<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  rate_kernel<MODE><<<ctas, 128 * warpgroups, smem>>>(cycles, sink);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return cudaDeviceSynchronize();
}

}  // namespace

extern "C" int dg_wgmma_rate(int mode, int ctas, int warpgroups, void* cycles, void* sink) {
  long long* c = static_cast<long long*>(cycles);
  float* s = static_cast<float*>(sink);
  switch (mode) {
    case 0: return launch<0>(ctas, warpgroups, c, s);
    case 1: return launch<1>(ctas, warpgroups, c, s);
    case 2: return launch<2>(ctas, warpgroups, c, s);
    case 3: return launch<3>(ctas, warpgroups, c, s);
    case 4: return launch<4>(ctas, warpgroups, c, s);
    case 5: return launch<5>(ctas, warpgroups, c, s);
    case 6: return launch<6>(ctas, warpgroups, c, s);
    default: return -1;
  }
}

extern "C" int dg_wgmma_rate_iters() { return kIters; }
