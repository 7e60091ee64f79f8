/*
 * ncclnet-harness: tests and measures an NCCL net plugin exactly as NCCL uses it.
 *
 *   ncclnet-harness conformance --plugin PATH [--versions 8,9,10,11,12] [--timeout SEC]
 *   ncclnet-harness transfer    --plugin PATH [--version V] [--size BYTES] [--iters N] [--linger SEC]
 *   ncclnet-harness bench       --plugin PATH [--version V] [--size BYTES] [--iters N] [--bw-bytes B] [--rounds N] [--plugin-only] [--verbose] [lat|bw|all]
 *   ncclnet-harness concurrent  --plugin PATH [--versions 10,11,12] [--threads N] [--iters N] [--size BYTES]
 *
 * Exit status is 0 only when everything that ran passed.
 * `ncclnet-harness faults SCENARIO ...` (faults.c) parses its own arguments.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static void usage(FILE* f) {
  fprintf(f,
          "usage:\n"
          "  ncclnet-harness conformance --plugin PATH [--versions 8,9,10,11,12] [--timeout SEC]\n"
          "      Runs every conformance check for each API version, printing\n"
          "      \"PASS vN <check>\" / \"FAIL vN <check>: <why>\" and a final \"N passed, N failed\".\n"
          "      --timeout is the time one check may take before it counts as hung (default 60).\n"
          "      (transfer and bench accept --timeout too: the whole run's limit, default 300 / 1800.)\n"
          "      --only CHECK[,CHECK] runs just those checks (setup is done implicitly).\n"
          "  ncclnet-harness transfer --plugin PATH [--version V] [--size BYTES] [--iters N] [--linger SEC]\n"
          "      Moves SIZE bytes (default 64M) ITERS times (default 16) from one process to\n"
          "      another with 8 requests in flight, verifies every byte and prints GB/s.\n"
          "      --linger keeps both processes (and their comms) alive SEC seconds afterwards.\n"
          "  ncclnet-harness bench --plugin PATH [--version V] [--size BYTES] [--iters N] [--bw-bytes B] [--rounds N] [--plugin-only] [--verbose] [lat|bw|all]\n"
          "      Latency (ping-pong round trip, 8 B..1 MiB) and bandwidth (8 in flight,\n"
          "      64 KiB..64 MiB) through the plugin, driven as NCCL's proxy drives it\n"
          "      (sched_yield when a pass made no progress), next to plain TCP sockets\n"
          "      (busy-polled and blocking ping-pong; 1 and 4 streams): medians of 3\n"
          "      alternating rounds, each process's CPU %% and threads, plugin/TCP ratios.\n"
          "      --size runs that one size only; --iters sets the ping-pongs per round;\n"
          "      --plugin-only skips the TCP baselines (to profile the plugin alone);\n"
          "      --bw-bytes moves B per size, method and round instead of 1 GiB (slow links);\n"
          "      --rounds takes each figure as the median of N rounds (1..9, default 3);\n"
          "      --verbose also prints every round's figure under each median and, for\n"
          "      latency, how many round trips of each tenth of a round took over 2.5x its median.\n"
          "  ncclnet-harness concurrent --plugin PATH [--versions 8,9,10,11,12] [--threads N] [--iters N] [--size BYTES]\n"
          "      NCCL's threads at once: per rank, N progress threads (default 3) each with its\n"
          "      own communicator (v11+: own init/finalize) stream ITERS messages (default 500)\n"
          "      of 0..SIZE bytes (default 64K) each way, verified, with profiler handles, while\n"
          "      a service thread keeps connecting, registering and closing (v11+: in extra\n"
          "      init/finalize contexts). Prints \"PASS concurrent vN ...\" or \"FAIL ...\".\n"
          "      Run it against a -race build of a Go plugin to find data races (make concurrent-race).\n"
          "  --version defaults to the newest ncclNetPlugin_vN the library exports.\n"
          "  The plugin's WARN lines go to stderr (NCCL_DEBUG=INFO or TRACE shows more,\n"
          "  NCCL_DEBUG=VERSION hides them); results go to stdout.\n"
          "  ncclnet-harness faults SCENARIO --plugin PATH [...]: fault injection (faults --help).\n");
}

static int parse_versions(const char* s, opts_t* o) {
  o->nversions = 0;
  char buf[128];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char* end;
    long v = strtol(tok, &end, 10);
    if (*end || v < HARNESS_MIN_VERSION || v > HARNESS_MAX_VERSION) {
      fprintf(stderr, "ncclnet-harness: --versions: \"%s\" is not a version in %d..%d\n", tok, HARNESS_MIN_VERSION,
              HARNESS_MAX_VERSION);
      return -1;
    }
    for (int i = 0; i < o->nversions; i++)
      if (o->versions[i] == v) goto dup;
    if (o->nversions == HARNESS_MAX_VERSIONS) return -1;
    o->versions[o->nversions++] = (int)v;
  dup:;
  }
  if (o->nversions == 0) {
    fprintf(stderr, "ncclnet-harness: --versions needs at least one version\n");
    return -1;
  }
  return 0;
}

static int parse_double(const char* name, const char* s, double* out) {
  if (parse_in_range(s, 0, HUGE_VAL, out) == 0) return 0;
  fprintf(stderr, "ncclnet-harness: %s: \"%s\" is not a non-negative number\n", name, s);
  return -1;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char* cmd = argv[1];
  if (!strcmp(cmd, "faults")) return cmd_faults(argc, argv);
  if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
    usage(stdout);
    return 0;
  }
  opts_t o = {.timeout = 0, .size = 64ull << 20, .iters = 16, .bench_what = "all", .threads = 3};
  parse_versions("8,9,10,11,12", &o);
  for (int i = 2; i < argc; i++) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEED_VALUE                                                        \
  if (v == NULL) {                                                        \
    fprintf(stderr, "ncclnet-harness: %s needs a value\n", a);            \
    return 2;                                                             \
  }                                                                       \
  i++;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(a, "--plugin")) {
      NEED_VALUE o.plugin = v;
    } else if (!strcmp(a, "--versions")) {
      NEED_VALUE if (parse_versions(v, &o) != 0) return 2;
    } else if (!strcmp(a, "--version")) {
      NEED_VALUE char* end;
      long ver = strtol(v, &end, 10);
      if (*end || ver < HARNESS_MIN_VERSION || ver > HARNESS_MAX_VERSION) {
        fprintf(stderr, "ncclnet-harness: --version %s: use a version in %d..%d\n", v, HARNESS_MIN_VERSION,
                HARNESS_MAX_VERSION);
        return 2;
      }
      o.version = (int)ver;
    } else if (!strcmp(a, "--timeout")) {
      NEED_VALUE if (parse_double(a, v, &o.timeout) != 0 || o.timeout == 0) return 2;
    } else if (!strcmp(a, "--only")) {
      NEED_VALUE o.only = v;
    } else if (!strcmp(a, "--size")) {
      NEED_VALUE if (parse_size(v, &o.size) != 0) {
        fprintf(stderr, "ncclnet-harness: --size %s: use a byte count (suffix K, M or G allowed)\n", v);
        return 2;
      }
      o.size_set = 1;
    } else if (!strcmp(cmd, "bench") && !strcmp(a, "--bw-bytes")) {
      NEED_VALUE if (parse_size(v, &o.bw_bytes) != 0 || o.bw_bytes == 0) {
        fprintf(stderr, "ncclnet-harness: --bw-bytes %s: use a byte count (suffix K, M or G allowed)\n", v);
        return 2;
      }
    } else if (!strcmp(cmd, "bench") && !strcmp(a, "--rounds")) {
      NEED_VALUE char* end;
      long n = strtol(v, &end, 10);
      if (*end || n < 1 || n > BENCH_MAX_ROUNDS) {
        fprintf(stderr, "ncclnet-harness: --rounds %s: use a count in 1..%d\n", v, BENCH_MAX_ROUNDS);
        return 2;
      }
      o.rounds = (int)n;
    } else if (!strcmp(a, "--iters")) {
      NEED_VALUE char* end;
      long it = strtol(v, &end, 10);
      if (*end || it < 1 || it > 1000000) {
        fprintf(stderr, "ncclnet-harness: --iters %s: use a count in 1..1000000\n", v);
        return 2;
      }
      o.iters = (int)it;
      o.iters_set = 1;
    } else if (!strcmp(a, "--threads")) {
      NEED_VALUE char* end;
      long th = strtol(v, &end, 10);
      if (*end || th < 1 || th > 8) {
        fprintf(stderr, "ncclnet-harness: --threads %s: use a count in 1..8\n", v);
        return 2;
      }
      o.threads = (int)th;
    } else if (!strcmp(a, "--linger")) {
      NEED_VALUE if (parse_double(a, v, &o.linger) != 0) return 2;
    } else if (!strcmp(cmd, "bench") && !strcmp(a, "--plugin-only")) {
      o.plugin_only = 1;
    } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
      o.verbose = 1;
    } else if (!strcmp(cmd, "bench") && (!strcmp(a, "lat") || !strcmp(a, "bw") || !strcmp(a, "all"))) {
      o.bench_what = a;
    } else {
      fprintf(stderr, "ncclnet-harness: unknown argument \"%s\" for %s (see --help)\n", a, cmd);
      return 2;
    }
  }
  if (o.plugin == NULL) {
    fprintf(stderr, "ncclnet-harness: %s needs --plugin PATH (the plugin .so to load)\n", cmd);
    return 2;
  }
  if (!strcmp(cmd, "conformance")) return cmd_conformance(&o);
  if (!strcmp(cmd, "transfer")) return cmd_transfer(&o);
  if (!strcmp(cmd, "bench")) return cmd_bench(&o);
  if (!strcmp(cmd, "concurrent")) {
    if (!o.size_set) o.size = 64u << 10;
    if (!o.iters_set) o.iters = 500;
    if (o.size == 0 || o.size > (64u << 20)) {
      fprintf(stderr, "ncclnet-harness: concurrent: --size must be 1 byte to 64 MiB\n");
      return 2;
    }
    return cmd_concurrent(&o);
  }
  fprintf(stderr, "ncclnet-harness: unknown command \"%s\" (conformance, transfer, bench or concurrent)\n", cmd);
  usage(stderr);
  return 2;
}
