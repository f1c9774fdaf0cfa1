#include <cstdio>
__global__ void K(int* x) { x[threadIdx.x] = threadIdx.x; }
extern "C" int SmokeLaunch() { int* p; if (cudaMalloc(&p, 128) != cudaSuccess) return -1; K<<<1, 32>>>(p); cudaFree(p); return 0; }
