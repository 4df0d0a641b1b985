// Probe of the wgmma building blocks of src/decodegap/kernels/mla_decode_sm90_wgmma.cu in isolation (its helpers are
// included), for when the full kernel is wrong: which of the two products breaks. One warpgroup:
//   S[64, 32] = Q[64, 576] K[32, 576]^T  (K-major Q and K, 128-byte swizzle, 36 k-steps of m64n32k16)
//   O[64, 256] = P[64, 32] V[32, 256]   (P from registers in the accumulator layout, V N-major: m64n256k16)
// with bf16 inputs. Built and run by mla_wgmma_probe.py (nvcc, ctypes), which compares with torch.
#include "../src/decodegap/kernels/mla_decode_sm90_wgmma.cu"

namespace {

__global__ void __launch_bounds__(128, 1) probe_kernel(const uint16_t* q, const uint16_t* k, const uint16_t* p,
                                                       float* s_out, float* o_out) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
  const uint32_t sbase = smem_u32(smem);
  uint8_t* sq = smem;             // [9][64][128 B]
  uint8_t* sk = smem + kQBytes;   // [9][32][128 B]
  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, c = lane & 3, r0 = 16 * (tid >> 5) + g;
  for (int i = tid; i < 64 * 72; i += 128) {
    const int row = i / 72, u = i % 72;
    *reinterpret_cast<uint4*>(sq + (u >> 3) * (kM * 128) + swz(row, u & 7)) =
        *reinterpret_cast<const uint4*>(q + row * 576 + 8 * u);
  }
  for (int i = tid; i < 32 * 72; i += 128) {
    const int row = i / 72, u = i % 72;
    *reinterpret_cast<uint4*>(sk + (u >> 3) * kChunkBytes + swz(row, u & 7)) =
        *reinterpret_cast<const uint4*>(k + row * 576 + 8 * u);
  }
  fence_proxy_async();
  __syncthreads();
  float sc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) sc[i] = 0.f;
  const uint64_t dq = make_desc(sbase, 16, 1024), dk = make_desc(sbase + kQBytes, 16, 1024);
  const uint32_t qa[1][4] = {{0u, 0u, 0u, 0u}};  // QR = 0: Q from shared memory only
  score_tile<false, 0, 0>(sc, qa, dq, dk);
  float sc2[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) sc2[i] = 0.f;
  score_tile<false, 1, 0>(sc2, qa, dq, dk);
#pragma unroll
  for (int jj = 0; jj < 4; ++jj)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      s_out[r0 * 32 + 8 * jj + 2 * c + e] = sc[4 * jj + e] + sc2[4 * jj + e];
      s_out[(r0 + 8) * 32 + 8 * jj + 2 * c + e] = sc[4 * jj + 2 + e] + sc2[4 * jj + 2 + e];
    }
  // P [64, 32] bf16 from global into the accumulator layout, then A fragments; V = the K tile's dims 0..255.
  float pf[16];
#pragma unroll
  for (int jj = 0; jj < 4; ++jj)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      pf[4 * jj + e] = __uint_as_float(static_cast<uint32_t>(p[r0 * 32 + 8 * jj + 2 * c + e]) << 16);
      pf[4 * jj + 2 + e] = __uint_as_float(static_cast<uint32_t>(p[(r0 + 8) * 32 + 8 * jj + 2 * c + e]) << 16);
    }
  uint32_t pa[2][4];
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    pa[kk][0] = pack2<false>(pf[8 * kk + 0], pf[8 * kk + 1]);
    pa[kk][1] = pack2<false>(pf[8 * kk + 2], pf[8 * kk + 3]);
    pa[kk][2] = pack2<false>(pf[8 * kk + 4], pf[8 * kk + 5]);
    pa[kk][3] = pack2<false>(pf[8 * kk + 6], pf[8 * kk + 7]);
  }
  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.f;
  const uint64_t dv = make_desc(sbase + kQBytes, kChunkBytes, 1024);
  wgmma_fence();
  wgmma_pv<false>(o, pa[0], dv, 1);
  wgmma_pv<false>(o, pa[1], dv + (2048 >> 4), 1);
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(o);
#pragma unroll
  for (int jj = 0; jj < 32; ++jj)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      o_out[r0 * 256 + 8 * jj + 2 * c + e] = o[4 * jj + e];
      o_out[(r0 + 8) * 256 + 8 * jj + 2 * c + e] = o[4 * jj + 2 + e];
    }
}

}  // namespace

extern "C" int dg_wgmma_probe(const void* q, const void* k, const void* p, void* s_out, void* o_out) {
  const int smem = kQBytes + 9 * kChunkBytes + 1024;
  cudaError_t err = cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return err;
  probe_kernel<<<1, 128, smem>>>(static_cast<const uint16_t*>(q), static_cast<const uint16_t*>(k),
                                 static_cast<const uint16_t*>(p), static_cast<float*>(s_out),
                                 static_cast<float*>(o_out));
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  return cudaDeviceSynchronize();
}
