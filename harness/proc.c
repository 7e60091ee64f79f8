/*
 * proc.c: the two-rank process model. The parent forks both ranks before
 * anything loads the plugin (a Go runtime does not survive fork), then only
 * watches shared memory: each rank publishes which check and step it is in,
 * so a hang is reported as "check X hung in step Y" instead of a stuck run.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

volatile sig_atomic_t harness_stop_signal;

enum { FRAME_DATA = 1, FRAME_END = 2 };
typedef struct {
  uint32_t kind;
  uint32_t len;
} frame_t;

shm_t* shm_create(void) {
  shm_t* s = mmap(NULL, sizeof(shm_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED) return NULL;
  memset(s, 0, sizeof *s);
  for (int i = 0; i < 2; i++) {
    atomic_store(&s->cur[i], -1);
    atomic_store(&s->abort_check[i], -1);
  }
  return s;
}

const char* wait_status_str(int status, char* buf, size_t len) {
  if (WIFEXITED(status)) snprintf(buf, len, "exited with status %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status)) snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else snprintf(buf, len, "ended with wait status 0x%x", status);
  return buf;
}

static void beat(rank_t* r, uint64_t now) { atomic_store_explicit(&r->shm->beat_ns[r->rank], now, memory_order_relaxed); }

void set_where(rank_t* r, const char* fmt, ...) {
  beat(r, now_ns());
  char tmp[WHERE_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  memcpy(r->shm->where[r->rank], tmp, sizeof tmp);
}

bool peer_failed(rank_t* r) {
  beat(r, now_ns());
  return r->check >= 0 && atomic_load(&r->shm->abort_check[1 - r->rank]) == r->check;
}

double rank_budget(double secs) { return secs > 4 ? secs - 2 : (secs > 0 ? secs * 0.8 : 0); }

bool past_deadline(rank_t* r) {
  uint64_t now = now_ns();
  beat(r, now);
  return r->deadline_ns != 0 && now > r->deadline_ns;
}

/* The control channel's writes block: frames are small and the peer reads them. */
static int write_all(int fd, const void* buf, size_t len) { return sock_io_all(fd, (void*)buf, len, true, 0); }

/* Reads exactly len bytes; polls in short slices so a failed peer or a passed
 * deadline ends the wait. Returns 0, -1 on error/EOF, -2 on timeout, -3 when
 * the peer failed the check. */
static int read_all(rank_t* r, void* buf, size_t len, uint64_t until) {
  char* p = buf;
  while (len > 0) {
    struct pollfd pfd = {r->ctl, POLLIN, 0};
    int k = poll(&pfd, 1, 50);
    if (k < 0 && errno != EINTR) return -1;
    if (k > 0) {
      ssize_t n = read(r->ctl, p, len);
      if (n == 0) return -1;
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return -1;
      }
      p += n;
      len -= (size_t)n;
      continue;
    }
    if (now_ns() > until) return -2;
    if (peer_failed(r)) return -3; /* also beats: waiting on the peer is not a hang of ours */
  }
  return 0;
}

int ctl_send(rank_t* r, const void* buf, size_t len) {
  frame_t f = {FRAME_DATA, (uint32_t)len};
  if (write_all(r->ctl, &f, sizeof f) != 0) return -1;
  return len ? write_all(r->ctl, buf, len) : 0;
}

int ctl_recv(rank_t* r, void* buf, size_t len, double timeout_s) {
  uint64_t until = now_ns() + (uint64_t)(timeout_s * 1e9);
  for (;;) {
    frame_t f;
    int rc = read_all(r, &f, sizeof f, until);
    if (rc != 0) return rc;
    if (f.kind == FRAME_END) {
      int idx;
      if (f.len != sizeof idx || read_all(r, &idx, sizeof idx, until) != 0) return -1;
      r->peer_end = idx;
      /* The end of an earlier check, which the peer reached after this rank
       * had stopped waiting for it: stale, not news about this one. */
      if (r->check >= 0 && idx < r->check) continue;
      return -3; /* the peer left the check: it failed there */
    }
    if (f.len != len) {
      /* A stale frame from an earlier check; drain it and keep waiting. */
      char junk[256];
      size_t left = f.len;
      while (left > 0) {
        size_t k = left < sizeof junk ? left : sizeof junk;
        if (read_all(r, junk, k, until) != 0) return -1;
        left -= k;
      }
      continue;
    }
    return len ? read_all(r, buf, len, until) : 0;
  }
}

int ctl_barrier(rank_t* r, double timeout_s) {
  char b = 'b';
  if (ctl_send(r, &b, 1) != 0) return -1;
  return ctl_recv(r, &b, 1, timeout_s);
}

int ctl_end_check(rank_t* r, int idx, double timeout_s) {
  frame_t f = {FRAME_END, sizeof idx};
  if (write_all(r->ctl, &f, sizeof f) != 0 || write_all(r->ctl, &idx, sizeof idx) != 0) return -1;
  uint64_t until = now_ns() + (uint64_t)(timeout_s * 1e9);
  int saved = r->check;
  r->check = -1; /* the peer's abort flag must not cut this wait short */
  int rc = 0;
  while (r->peer_end < idx) {
    frame_t g;
    if ((rc = read_all(r, &g, sizeof g, until)) != 0) break;
    if (g.kind == FRAME_END) {
      int k;
      if ((rc = read_all(r, &k, sizeof k, until)) != 0) break;
      r->peer_end = k;
      continue;
    }
    char junk[256];
    size_t left = g.len;
    while (left > 0 && rc == 0) {
      size_t k = left < sizeof junk ? left : sizeof junk;
      rc = read_all(r, junk, k, until);
      left -= k;
    }
    if (rc != 0) break;
  }
  r->check = saved;
  return rc;
}

static pid_t spawn(shm_t* shm, int rank, int fd, int other_fd, rank_fn fn, void* arg, double timeout) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  /* Child: never outlive the harness; never call into the plugin from the parent. */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  close(other_fd);
  g_rank = rank;
  /* Each rank is a distinct local rank, as in a job: the plugin's per-process
   * resources keyed on it (e.g. the metrics port) must not collide. Set before
   * the rank loads the plugin. */
  char lr[16];
  snprintf(lr, sizeof lr, "%d", rank);
  setenv("LOCAL_RANK", lr, 1);
  rank_t r = {.rank = rank, .ctl = fd, .shm = shm, .check = -1, .timeout = timeout, .peer_end = -1};
  int rc = fn(&r, arg);
  fflush(stdout);
  fflush(stderr);
  _exit(rc);
}

int run_pair(shm_t* shm, rank_fn fn, void* arg, double per_check, double total, pair_outcome_t* out) {
  memset(out, 0, sizeof *out);
  out->hung_rank = -1;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    perror("socketpair");
    return -1;
  }
  fflush(stdout);
  fflush(stderr);
  for (int i = 0; i < 2; i++) {
    atomic_store(&shm->cur[i], -1);
    atomic_store(&shm->abort_check[i], -1);
    atomic_store(&shm->expect_death[i], 0);
    atomic_store(&shm->fatal[i], 0);
    shm->where[i][0] = 0;
  }
  pid_t pid[2];
  atomic_store(&shm->beat_ns[0], now_ns());
  atomic_store(&shm->beat_ns[1], now_ns());
  pid[0] = spawn(shm, 0, sv[0], sv[1], fn, arg, per_check);
  pid[1] = spawn(shm, 1, sv[1], sv[0], fn, arg, per_check);
  close(sv[0]);
  close(sv[1]);
  if (pid[0] < 0 || pid[1] < 0) {
    perror("fork");
    for (int i = 0; i < 2; i++)
      if (pid[i] > 0) {
        kill(pid[i], SIGKILL);
        waitpid_r(pid[i], NULL, 0);
      }
    return -1;
  }
  uint64_t t0 = now_ns();
  for (;;) {
    for (int i = 0; i < 2; i++) {
      if (out->exited[i] || pid[i] <= 0) continue;
      int st;
      pid_t w = waitpid_r(pid[i], &st, WNOHANG);
      if (w == pid[i]) {
        out->exited[i] = 1;
        out->status[i] = st;
      }
    }
    if (out->exited[0] && out->exited[1]) break;
    if (harness_stop_signal != 0) {
      /* The program was told to stop: no rank outlives it, none is left
       * unreaped. */
      out->stopped = harness_stop_signal;
      for (int i = 0; i < 2; i++)
        if (!out->exited[i]) kill(pid[i], SIGKILL);
      for (int i = 0; i < 2; i++) {
        int st;
        if (out->exited[i]) continue;
        if (waitpid_r(pid[i], &st, 0) == pid[i]) {
          out->exited[i] = 1;
          out->status[i] = st;
        }
      }
      break;
    }
    /* A rank that crashed leaves the other waiting on a peer that is gone. */
    for (int i = 0; i < 2; i++) {
      if (out->exited[i] && WIFSIGNALED(out->status[i]) && !atomic_load(&shm->expect_death[i]) && !out->exited[1 - i]) {
        sleep_ms(200); /* let the survivor record what it saw */
        kill(pid[1 - i], SIGKILL);
        int st;
        if (waitpid_r(pid[1 - i], &st, 0) == pid[1 - i]) {
          out->exited[1 - i] = 1;
          out->status[1 - i] = st;
        }
      }
    }
    if (out->exited[0] && out->exited[1]) break;
    /* A rank that gave up with an error (e.g. halted by the Go race detector)
     * counts as failing whatever the survivor is running, so it stops
     * waiting for it now instead of at its deadline. */
    for (int i = 0; i < 2; i++) {
      if (out->exited[i] && !out->exited[1 - i] && WIFEXITED(out->status[i]) && WEXITSTATUS(out->status[i]) != 0) {
        int cur = atomic_load(&shm->cur[1 - i]);
        if (cur >= 0) atomic_store(&shm->abort_check[i], cur);
      }
    }
    uint64_t now = now_ns();
    int hung = -1;
    double after = 0;
    for (int i = 0; i < 2 && hung < 0; i++) {
      if (out->exited[i]) continue;
      int cur = atomic_load(&shm->cur[i]);
      uint64_t st = atomic_load(&shm->cur_start_ns[i]);
      if (cur >= 0 && per_check > 0 && now > st && (double)(now - st) / 1e9 > per_check) {
        hung = i;
        after = (double)(now - st) / 1e9;
      }
    }
    if (hung < 0 && total > 0 && (double)(now - t0) / 1e9 > total) {
      hung = out->exited[0] ? 1 : 0;
      after = (double)(now - t0) / 1e9;
    }
    if (hung >= 0 && !out->exited[1 - hung] && atomic_load(&shm->cur[1 - hung]) >= 0) {
      /* Both may be over time when one waits for the other: blame the one
       * that stopped returning to harness code (stuck inside a plugin call). */
      uint64_t b0 = atomic_load(&shm->beat_ns[hung]), b1 = atomic_load(&shm->beat_ns[1 - hung]);
      if (b1 + 500000000ull < b0) hung = 1 - hung;
    }
    if (hung >= 0) {
      out->hung = 1;
      out->hung_rank = hung;
      out->hung_after = after;
      memcpy(out->hung_where, shm->where[hung], WHERE_LEN);
      out->hung_where[WHERE_LEN - 1] = 0;
      for (int i = 0; i < 2; i++)
        if (!out->exited[i]) kill(pid[i], SIGKILL);
      for (int i = 0; i < 2; i++) {
        if (out->exited[i]) continue;
        int st;
        if (waitpid_r(pid[i], &st, 0) == pid[i]) {
          out->exited[i] = 1;
          out->status[i] = st;
        }
      }
      break;
    }
    sleep_ms(20);
  }
  return 0;
}

/* Waits for cond on a mailbox, bounded by the rank's deadline and cut short
 * when the other rank failed. Many threads of one rank may wait at once, so it
 * only beats (atomic) and never touches set_where's shared text. */
static int mbox_wait(rank_t* r, atomic_uint* a, atomic_uint* b, bool want_equal) {
  for (int spins = 0;; spins++) {
    unsigned x = atomic_load_explicit(a, memory_order_acquire), y = atomic_load_explicit(b, memory_order_acquire);
    if (want_equal ? x == y : x > y) return 0;
    if (peer_failed(r)) return -3;
    if (past_deadline(r)) return -2;
    if (spins < 100) sched_yield();
    else sleep_ms(1);
  }
}

int mbox_post(rank_t* r, int ch, const void* data, size_t len) {
  if (ch < 0 || ch >= MBOX_MAX || len > MBOX_DATA) return -1;
  mbox_t* m = &r->shm->mbox[r->rank][ch];
  int rc = mbox_wait(r, &m->ack, &m->seq, true); /* the reader took the last one */
  if (rc != 0) return rc;
  memcpy(m->data, data, len);
  atomic_fetch_add_explicit(&m->seq, 1, memory_order_release);
  return 0;
}

int mbox_take(rank_t* r, int ch, void* data, size_t len) {
  if (ch < 0 || ch >= MBOX_MAX || len > MBOX_DATA) return -1;
  mbox_t* m = &r->shm->mbox[1 - r->rank][ch];
  int rc = mbox_wait(r, &m->seq, &m->ack, false); /* something new was posted */
  if (rc != 0) return rc;
  memcpy(data, m->data, len);
  atomic_fetch_add_explicit(&m->ack, 1, memory_order_release);
  return 0;
}
