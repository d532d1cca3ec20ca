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
 * worst. Usage: mpi_bcast BYTES [ITERS] [ALGORITHM_LABEL] [SEED] [STEP_MS BATCH_MS]
 * The label is only echoed; the algorithm is chosen by mpirun's MCA flags.
 *
 * With STEP_MS and BATCH_MS it runs the rollout loop of `tensorhub-lab bench
 * workload` instead (ITERS rounds): in round r the root computes a step
 * (writes version r into its buffer, then sleeps out the rest of STEP_MS)
 * while every receiver generates a batch (sleeps BATCH_MS); then all enter
 * MPI_Bcast (a receiver idles, rather than spins in MPI_Bcast, until 200 ms
 * before the root's step ends). Per round it reports the root's time inside MPI_Bcast (the
 * trainer is blocked: its buffer is in use), the receivers' summed wait
 * (from max(own entry, root's entry) to own return: a receiver that
 * finished its batch early does not count the root's compute), and the
 * update time (from the later of the root's entry and the first receiver's
 * entry to the last receiver's return). Timestamps are
 * CLOCK_MONOTONIC, one clock for every namespace of this machine. The last
 * round's bytes are verified on every receiver:
 *
 *   mpi_workload bytes=S ranks=N algorithm=A rounds=R step_ms=.. batch_ms=..
 *     blocked_s=b1,b2,.. wait_s=w1,.. update_s=u1,.. stall_gpu_s=T verified=1
 * Exit status: 0 on success, 1 on a checksum mismatch or bad arguments. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */
#include <inttypes.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static double Now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void SleepUntil(double t) {
  double left = t - Now();
  if (left <= 0) return;
  struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

/* The rollout loop; see the header comment. Returns the exit status. */
static int Workload(unsigned char* buf, size_t bytes, int rounds, const char* label,
                    uint64_t seed, long step_ms, long batch_ms, int rank, int ranks) {
  double enter[kMaxIters], leave[kMaxIters];
  MPI_Barrier(MPI_COMM_WORLD);
  double round_start = Now();
  uint64_t root_sum = 0;
  for (int r = 0; r < rounds; ++r) {
    if (rank == 0) {
      Fill(buf, bytes, seed + (uint64_t)r); /* the optimizer writes version r */
      SleepUntil(round_start + (double)step_ms / 1e3);
    } else {
      /* After its batch a receiver would spin inside MPI_Bcast (TCP BTL
       * progress busy-polls) until the root arrives, taking the 2 shared
       * cores from everyone. It idles instead until shortly before the
       * root's step ends (its round started no earlier than the root's).
       * Only time after max(own entry, root's entry) counts as a wait. */
      long idle_ms = batch_ms > step_ms - 200 ? batch_ms : step_ms - 200;
      SleepUntil(round_start + (double)idle_ms / 1e3);
    }
    enter[r] = Now();
    MPI_Bcast(buf, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    leave[r] = Now();
    round_start = leave[r];
  }
  if (rank == 0) root_sum = Checksum(buf, bytes);
  MPI_Bcast(&root_sum, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  int bad = rank != 0 && Checksum(buf, bytes) != root_sum;
  int bad_ranks = 0;
  MPI_Reduce(&bad, &bad_ranks, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  double* all_enter = rank == 0 ? malloc(sizeof(double) * kMaxIters * (size_t)ranks) : NULL;
  double* all_leave = rank == 0 ? malloc(sizeof(double) * kMaxIters * (size_t)ranks) : NULL;
  if (rank == 0 && (all_enter == NULL || all_leave == NULL)) MPI_Abort(MPI_COMM_WORLD, 1);
  MPI_Gather(enter, kMaxIters, MPI_DOUBLE, all_enter, kMaxIters, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  MPI_Gather(leave, kMaxIters, MPI_DOUBLE, all_leave, kMaxIters, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  int rc = 0;
  if (rank == 0) {
    double stall = 0;
    char blocked_s[kMaxIters * 16] = "", wait_s[kMaxIters * 16] = "", update_s[kMaxIters * 16] = "";
    for (int r = 0; r < rounds; ++r) {
      double root_in = all_enter[r], blocked = all_leave[r] - root_in, wait = 0, last = root_in;
      double first_in = -1;
      for (int i = 1; i < ranks; ++i) {
        double in = all_enter[i * kMaxIters + r], out = all_leave[i * kMaxIters + r];
        wait += out - (in > root_in ? in : root_in);
        if (out > last) last = out;
        if (first_in < 0 || in < first_in) first_in = in;
      }
      double start = first_in > root_in ? first_in : root_in;
      stall += blocked + wait;
      const char* sep = r ? "," : "";
      snprintf(blocked_s + strlen(blocked_s), 16, "%s%.3f", sep, blocked);
      snprintf(wait_s + strlen(wait_s), 16, "%s%.3f", sep, wait);
      snprintf(update_s + strlen(update_s), 16, "%s%.3f", sep, last - start);
    }
    printf("mpi_workload bytes=%zu ranks=%d algorithm=%s rounds=%d step_ms=%ld batch_ms=%ld "
           "blocked_s=%s wait_s=%s update_s=%s stall_gpu_s=%.3f verified=%d\n",
           bytes, ranks, label, rounds, step_ms, batch_ms, blocked_s, wait_s, update_s, stall,
           bad_ranks == 0);
    fflush(stdout);
    rc = bad_ranks == 0 ? 0 : 1;
  }
  free(all_enter);
  free(all_leave);
  MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return rc;
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
  if (argc > 6) {
    long step_ms = atol(argv[5]), batch_ms = atol(argv[6]);
    if (step_ms < 0 || step_ms > 600000 || batch_ms < 0 || batch_ms > 600000) {
      if (rank == 0) fprintf(stderr, "mpi_bcast: STEP_MS and BATCH_MS in [0, 600000]\n");
      MPI_Finalize();
      return 1;
    }
    memset(buf, 0xA5, bytes);
    int rc = Workload(buf, bytes, iters, label, seed, step_ms, batch_ms, rank, ranks);
    free(buf);
    MPI_Finalize();
    return rc;
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
