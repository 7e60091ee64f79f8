/* Unit checks of harness/util.c's helpers, built and run by
 * `make harness-selftest`: exit status 1 and a FAIL line per wrong answer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness.h"

static int fails;

static void precision(double v, double target, bool higher_better, const char* want) {
  char got[32];
  snprintf(got, sizeof got, "%.*f", verdict_precision(v, target, higher_better), v);
  if (strcmp(got, want) != 0) {
    printf("FAIL - %g against %s %.2f prints as %s, want %s\n", v, higher_better ? ">=" : "<=", target, got, want);
    fails++;
  }
}

static void expect(bool ok, const char* what) {
  if (!ok) {
    printf("FAIL - %s\n", what);
    fails++;
  }
}

/* A ring buffer reused for message 8 after message 0: what arrives must be
 * told from what was left there (until 2026-11-28 transfer's ring mode could
 * not, and faults transfer only in the first 8 bytes). */
static void ring(size_t size) {
  uint8_t* slot = malloc(size);
  uint8_t* next = malloc(size);
  pattern_fill(slot, size, 3);
  ring_stamp(slot, size, 0);
  expect(ring_check(slot, size, 3, 0) == -1, "ring_check refuses the message it was stamped for");
  memcpy(next, slot, size); /* the sender's buffer for message 8: same slot, new stamps */
  ring_stamp(next, size, 8);
  expect(ring_check(slot, size, 3, 8) >= 0, "ring_check takes message 0, left in the buffer, for message 8");
  expect(ring_msg(slot, size) == 0, "ring_msg does not name message 0");
  memcpy(slot, next, 64); /* only the first 64 bytes of message 8 arrived */
  long long bad = ring_check(slot, size, 3, 8);
  expect(size <= 64 || (bad >= 64 && bad < 4096 + 8) || (size < 4096 && bad >= 64),
         "ring_check misses a message of which only 64 bytes arrived");
  memcpy(slot, next, size);
  expect(ring_check(slot, size, 3, 8) == -1, "ring_check refuses message 8 arrived whole");
  slot[size / 2] ^= 1;
  expect(ring_check(slot, size, 3, 8) == (long long)(size / 2), "ring_check misses a flipped byte or names the wrong offset");
  free(slot);
  free(next);
}

int main(void) {
  ring(1u << 20);
  ring(5000);
  ring(100);
  precision(1.21, 1.0, true, "1.21");
  precision(1.004, 1.0, true, "1.00");   /* met, and 1.00 >= 1.00 agrees */
  precision(0.998, 1.0, true, "0.998");  /* NOT met: "1.00" would contradict it */
  precision(0.9996, 1.0, true, "0.9996");
  precision(1.503, 1.5, false, "1.503"); /* NOT met against <= 1.50 */
  precision(1.4996, 1.5, false, "1.50"); /* met, and 1.50 <= 1.50 agrees */
  precision(3.37, 3.0, false, "3.37");
  int threads = count_threads();
  if (threads < 1) {
    printf("FAIL - count_threads() = %d in a running process\n", threads);
    fails++;
  }
  if (fails == 0) printf("ok   - util.c helpers\n");
  return fails ? 1 : 0;
}
