/* Unit checks of harness/util.c's helpers, built and run by
 * `make harness-selftest`: exit status 1 and a FAIL line per wrong answer. */
#include <stdio.h>
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

int main(void) {
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
