/* util.c: clocks, buffers, verifiable data patterns, whole-buffer socket I/O, /proc
 * counters and small parsing and formatting helpers. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

pid_t waitpid_r(pid_t pid, int* st, int flags) {
  pid_t w;
  while ((w = waitpid(pid, st, flags)) < 0 && errno == EINTR) {
  }
  return w;
}

uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double now_s(void) { return (double)now_ns() / 1e9; }

void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

void* buf_alloc(size_t len) {
  if (len == 0) len = 1;
  void* p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return NULL;
  /* Large message buffers: 2 MiB pages cut page-fault time, which otherwise
   * dominates filling and checking 1 GiB on a small VM. Advisory only. */
  if (len >= (2u << 20)) madvise(p, len, MADV_HUGEPAGE);
  return p;
}

void buf_free(void* p, size_t len) {
  if (p == NULL) return;
  if (len == 0) len = 1;
  munmap(p, len);
}

/* splitmix64 of (seed, word index): stateless, so a check can start anywhere. */
static inline uint64_t mix(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + (i + 1) * 0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void pattern_fill(void* buf, size_t len, uint64_t seed) {
  uint8_t* b = buf;
  size_t words = len / 8;
  for (size_t i = 0; i < words; i++) {
    uint64_t v = mix(seed, i);
    memcpy(b + i * 8, &v, 8);
  }
  if (len % 8) {
    uint64_t v = mix(seed, words);
    memcpy(b + words * 8, &v, len % 8);
  }
}

#define RING_STRIDE_WORDS 512 /* one stamp per 4 KiB */

static uint64_t ring_key(size_t i) { return 0x72696e67ull * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xC2B2AE3D27D4EB4Full; }

static bool ring_stamped(size_t i, size_t words) { return i % RING_STRIDE_WORDS == 0 || i == words - 1; }

void ring_stamp(void* buf, size_t len, uint64_t msg) {
  uint8_t* b = buf;
  size_t words = len / 8;
  for (size_t i = 0; i < words; i += RING_STRIDE_WORDS) {
    uint64_t v = msg ^ ring_key(i);
    memcpy(b + i * 8, &v, 8);
  }
  if (words > 0) {
    uint64_t v = msg ^ ring_key(words - 1);
    memcpy(b + (words - 1) * 8, &v, 8);
  }
}

/* The first byte of buf that differs from the pattern of seed (with message
 * msg's ring stamps where stamped), or -1. */
static long long check_words(const void* buf, size_t len, uint64_t seed, bool stamped, uint64_t msg) {
  const uint8_t* b = buf;
  size_t words = len / 8;
  for (size_t i = 0; i < words; i++) {
    uint64_t v = stamped && ring_stamped(i, words) ? msg ^ ring_key(i) : mix(seed, i), got;
    memcpy(&got, b + i * 8, 8);
    if (got != v) {
      for (size_t k = 0; k < 8; k++)
        if (((const uint8_t*)&v)[k] != b[i * 8 + k]) return (long long)(i * 8 + k);
    }
  }
  if (len % 8) {
    uint64_t v = mix(seed, words);
    for (size_t k = 0; k < len % 8; k++)
      if (((const uint8_t*)&v)[k] != b[words * 8 + k]) return (long long)(words * 8 + k);
  }
  return -1;
}

long long pattern_check(const void* buf, size_t len, uint64_t seed) { return check_words(buf, len, seed, false, 0); }

long long ring_check(const void* buf, size_t len, uint64_t seed, uint64_t msg) { return check_words(buf, len, seed, true, msg); }

uint64_t ring_msg(const void* buf, size_t len) {
  if (len < 8) return UINT64_MAX;
  uint64_t got;
  memcpy(&got, buf, 8);
  return got ^ ring_key(0);
}

int sock_io_all(int fd, void* buf, size_t len, bool out, int flags) {
  char* p = buf;
  while (len > 0) {
    ssize_t k = out ? send(fd, p, len, MSG_NOSIGNAL | flags) : recv(fd, p, len, flags);
    if (k == 0 && !out) return -1; /* EOF before len bytes */
    if (k < 0) {
      if ((flags & MSG_DONTWAIT) && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        sched_yield();
        continue;
      }
      if (errno == EINTR) continue;
      return -1;
    }
    p += k;
    len -= (size_t)k;
  }
  return 0;
}

int count_threads(void) {
  FILE* f = fopen("/proc/self/status", "r");
  if (f == NULL) return -1;
  char line[256];
  int n = -1;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "Threads: %d", &n) == 1) break;
  fclose(f);
  return n;
}

uint64_t mem_available(void) {
  FILE* f = fopen("/proc/meminfo", "r");
  if (f == NULL) return 0;
  char line[256];
  uint64_t kb = 0;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "MemAvailable: %llu kB", (unsigned long long*)&kb) == 1) break;
  }
  fclose(f);
  return kb * 1024;
}

const char* result_str(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    case ncclTimeout: return "ncclTimeout";
    default: return "unknown ncclResult_t";
  }
}

int parse_in_range(const char* s, double lo, double hi, double* out) {
  char* end;
  double v = strtod(s, &end);
  if (*end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int parse_size(const char* s, size_t* out) {
  char* end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno != 0 || end == s) return -1;
  unsigned long long mul = 1;
  if (*end) {
    if (!strcmp(end, "K") || !strcmp(end, "KiB") || !strcmp(end, "k")) mul = 1ull << 10;
    else if (!strcmp(end, "M") || !strcmp(end, "MiB")) mul = 1ull << 20;
    else if (!strcmp(end, "G") || !strcmp(end, "GiB")) mul = 1ull << 30;
    else return -1;
  }
  if (v > (~0ull) / mul) return -1;
  *out = (size_t)(v * mul);
  return 0;
}

/* Two decimals, or as many more (up to 6) as it takes for the printed figure
 * to agree with the verdict: 0.998 against ">= 1.00" would print as a "1.00"
 * that is "NOT met". */
int verdict_precision(double v, double target, bool higher_better) {
  bool ok = higher_better ? v >= target : v <= target;
  int prec = 2;
  for (; prec < 6; prec++) {
    char s[48];
    snprintf(s, sizeof s, "%.*f", prec, v);
    double shown = strtod(s, NULL);
    if ((higher_better ? shown >= target : shown <= target) == ok) break;
  }
  return prec;
}

void fmt_size(char* out, size_t outlen, size_t b) {
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) snprintf(out, outlen, "%zu GiB", b >> 30);
  else if (b >= (1ull << 20) && b % (1ull << 20) == 0) snprintf(out, outlen, "%zu MiB", b >> 20);
  else if (b >= (1ull << 10) && b % (1ull << 10) == 0) snprintf(out, outlen, "%zu KiB", b >> 10);
  else snprintf(out, outlen, "%zu B", b);
}

/* What a framework does once NCCL is up: PyTorch's DataLoader forks its
 * workers (the default start method), a checkpoint writer forks. The child
 * inherits every descriptor of the rank, the plugin's sockets included, never
 * calls the plugin, does not die with its parent (a worker notices its
 * parent's death only seconds later), and exits after `secs`, or earlier once
 * `*until` is no longer `running` (NULL: no such word). Its stdio goes to
 * /dev/null so that nobody reading the rank's output waits for it. */
void fork_lingering_child(double secs, atomic_int* until, int running) {
  pid_t pid = fork();
  if (pid != 0) return; /* the parent, or fork failed: the scenario runs without it */
  int null = open("/dev/null", O_RDWR);
  if (null >= 0) {
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);
  }
  double end = now_s() + secs;
  while (now_s() < end && (until == NULL || atomic_load(until) == running)) sleep_ms(50);
  _exit(0);
}
