/* MPI_Bcast baseline: rank 0 (the trainer) broadcasts S bytes to every
 * other rank. The time of one broadcast is taken from the barrier that
 * starts it to the moment the slowest rank holds all bytes (max over ranks
 * via MPI_Reduce). Each broadcast is verified afterwards, outside the
 * timing: every receiver checksums what it got and compares with the
 * root's checksum. Prints one machine-readable line per run:
 *
 *   mpi_bcast bytes=S ranks=N algorithm=A iters=K seconds=T seconds_max=M
 *     seconds_all=t1,t2,.. gbit_per_s=G verified=1
 *
 * seconds is the best (smallest) of the K timed broadcasts, seconds_max the
 * worst. Usage: mpi_bcast BYTES [ITERS] [ALGORITHM_LABEL] [SEED]
 * The label is only echoed; the algorithm is chosen by mpirun's MCA flags.
 * Exit status: 0 on success, 1 on a checksum mismatch or bad arguments. */
#include <inttypes.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kMaxIters = 64 };

/* splitmix64: a seeded, position-independent pattern, so a receiver that
 * got a shifted or stale buffer fails the check. */
static uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static void Fill(unsigned char* buf, size_t bytes, uint64_t seed) {
  size_t words = bytes / 8;
  uint64_t* w = (uint64_t*)buf;
  for (size_t i = 0; i < words; ++i) w[i] = Mix(seed ^ (uint64_t)i);
  for (size_t i = words * 8; i < bytes; ++i) buf[i] = (unsigned char)Mix(seed + i);
}

/* Order-sensitive 64-bit checksum over 8-byte words plus the tail. */
static uint64_t Checksum(const unsigned char* buf, size_t bytes) {
  uint64_t h = 0x84222325cbf29ce4ULL;
  size_t words = bytes / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t v;
    memcpy(&v, buf + i * 8, 8);
    h = (h ^ v) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  for (size_t i = words * 8; i < bytes; ++i) h = (h ^ buf[i]) * 0x100000001b3ULL;
  return h;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  if (argc < 2) {
    if (rank == 0) fprintf(stderr, "usage: %s BYTES [ITERS] [LABEL] [SEED]\n", argv[0]);
    MPI_Finalize();
    return 1;
  }
  long long bytes_arg = atoll(argv[1]);
  int iters = argc > 2 ? atoi(argv[2]) : 1;
  const char* label = argc > 3 ? argv[3] : "default";
  uint64_t seed = argc > 4 ? strtoull(argv[4], NULL, 10) : 42;
  /* MPI_Bcast takes an int count; one call per broadcast keeps the
   * algorithm's own segmentation in charge, so stay below 2 GiB. */
  if (bytes_arg <= 0 || bytes_arg > 2147483647LL || iters < 1 || iters > kMaxIters) {
    if (rank == 0)
      fprintf(stderr, "mpi_bcast: need 0 < BYTES < 2^31 and 1 <= ITERS <= %d\n", kMaxIters);
    MPI_Finalize();
    return 1;
  }
  size_t bytes = (size_t)bytes_arg;
  unsigned char* buf = malloc(bytes);
  if (buf == NULL) {
    fprintf(stderr, "mpi_bcast: rank %d: cannot allocate %zu bytes\n", rank, bytes);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  double seconds[kMaxIters];
  int mismatches_total = 0;
  for (int it = 0; it < iters; ++it) {
    uint64_t iter_seed = seed + (uint64_t)it;
    uint64_t root_sum = 0;
    if (rank == 0) {
      Fill(buf, bytes, iter_seed);
      root_sum = Checksum(buf, bytes);
    } else {
      /* Touch every page and make stale bytes detectable. */
      memset(buf, 0xA5, bytes);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    MPI_Bcast(buf, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    double mine = MPI_Wtime() - start;
    double slowest = 0;
    MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    seconds[it] = slowest;

    MPI_Bcast(&root_sum, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    int bad = 0;
    if (rank != 0) {
      uint64_t got = Checksum(buf, bytes);
      if (got != root_sum) {
        bad = 1;
        fprintf(stderr, "mpi_bcast: rank %d iter %d: checksum %016" PRIx64 " != root %016" PRIx64 "\n",
                rank, it, got, root_sum);
      }
    }
    int bad_ranks = 0;
    MPI_Reduce(&bad, &bad_ranks, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    mismatches_total += bad_ranks;
  }

  int rc = 0;
  if (rank == 0) {
    double best = seconds[0], worst = seconds[0];
    for (int it = 1; it < iters; ++it) {
      if (seconds[it] < best) best = seconds[it];
      if (seconds[it] > worst) worst = seconds[it];
    }
    printf("mpi_bcast bytes=%zu ranks=%d algorithm=%s iters=%d seconds=%.4f seconds_max=%.4f seconds_all=",
           bytes, ranks, label, iters, best, worst);
    for (int it = 0; it < iters; ++it) printf("%s%.4f", it ? "," : "", seconds[it]);
    printf(" gbit_per_s=%.4f verified=%d\n", (double)bytes * 8 / best / 1e9, mismatches_total == 0);
    fflush(stdout);
    rc = mismatches_total == 0 ? 0 : 1;
  }
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  free(buf);
  MPI_Finalize();
  return rc;
}
