/* link.c: connection setup shared by all commands, and choosing the API version. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

int link_up(rank_t* r, net_t* n, link_t* l, int dev, double timeout_s, char* why, size_t whylen) {
  memset(l, 0, sizeof *l);
  l->dev = dev;
  char mine[NCCL_NET_HANDLE_MAXSIZE] = {0}, peer[NCCL_NET_HANDLE_MAXSIZE];
  set_where(r, "listen(dev %d)", dev);
  ncclResult_t res = net_listen(n, dev, mine, &l->lc);
  if (res != ncclSuccess || l->lc == NULL) {
    snprintf(why, whylen, "listen(dev %d) returned %s with listenComm %p", dev, result_str(res), l->lc);
    return -1;
  }
  set_where(r, "exchanging listen handles");
  if (ctl_send(r, mine, sizeof mine) != 0 || ctl_recv(r, peer, sizeof peer, timeout_s) != 0) {
    snprintf(why, whylen, "could not exchange the listen handle with the other rank");
    return -1;
  }
  /* NCCL's probe and bootstrap paths drive connect and accept alternately from
   * one thread, so neither may wait for the other. */
  ncclNetDeviceHandle_v8_t* sdh = NULL;
  ncclNetDeviceHandle_v8_t* rdh = NULL;
  ncclNetCommConfig_v10_t cfg = {NCCL_NET_TRAFFIC_CLASS_UNDEF};
  uint64_t until = now_ns() + (uint64_t)(timeout_s * 1e9);
  set_where(r, "connect/accept loop (dev %d)", dev);
  while (l->sc == NULL || l->rc == NULL) {
    if (l->sc == NULL) {
      res = net_connect(n, dev, &cfg, peer, &l->sc, &sdh);
      if (res != ncclSuccess) {
        snprintf(why, whylen, "connect returned %s", result_str(res));
        return -1;
      }
    }
    if (l->rc == NULL) {
      res = net_accept(n, l->lc, &l->rc, &rdh);
      if (res != ncclSuccess) {
        snprintf(why, whylen, "accept returned %s", result_str(res));
        return -1;
      }
      if (l->rc != NULL) {
        /* NCCL closes the listener as soon as accept succeeds. */
        net_close_listen(n, l->lc);
        l->lc = NULL;
      }
    }
    if (now_ns() > until) {
      snprintf(why, whylen, "connect/accept not done after %.0f s (sendComm %p, recvComm %p)", timeout_s, l->sc, l->rc);
      return -1;
    }
    if (peer_failed(r)) {
      snprintf(why, whylen, "the other rank failed during connection setup");
      return -1;
    }
    if (l->sc == NULL || l->rc == NULL) sched_yield();
  }
  return 0;
}

void link_down(net_t* n, link_t* l) {
  if (l->sc) net_close_send(n, l->sc);
  if (l->rc) net_close_recv(n, l->rc);
  if (l->lc) net_close_listen(n, l->lc);
  memset(l, 0, sizeof *l);
}

int cmd_start(const opts_t* o, const char* cmd, shm_t** shm, int* version) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  shm_t* s = shm_create();
  if (s == NULL) return 2;
  char err[WHY_LEN];
  int v = pick_version(o, s, err, sizeof err);
  if (v < 0) {
    fprintf(stderr, "%s: %s\n", cmd, err);
    return 1;
  }
  memset(s->text, 0, sizeof s->text);
  *shm = s;
  *version = v;
  return 0;
}

/* The parent must not dlopen a Go library (it forks afterwards), so a
 * throw-away child looks at the exported symbols. */
int pick_version(const opts_t* o, shm_t* shm, char* err, size_t errlen) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    char e[WHY_LEN];
    int mask = net_probe_versions(o->plugin, e, sizeof e);
    if (mask < 0) snprintf(shm->text[0], sizeof shm->text[0], "%s", e);
    else snprintf(shm->text[0], sizeof shm->text[0], "mask=%d", mask);
    _exit(0);
  }
  int st;
  if (pid < 0 || waitpid_r(pid, &st, 0) != pid) {
    snprintf(err, errlen, "could not fork a probe process");
    return -1;
  }
  int mask;
  if (sscanf(shm->text[0], "mask=%d", &mask) != 1) {
    snprintf(err, errlen, "%s", shm->text[0][0] ? shm->text[0] : "probe process died while loading the plugin");
    return -1;
  }
  if (o->version) {
    if (!(mask & (1 << o->version))) {
      snprintf(err, errlen, "%s does not export ncclNetPlugin_v%d", o->plugin, o->version);
      return -1;
    }
    return o->version;
  }
  for (int v = HARNESS_MAX_VERSION; v >= HARNESS_MIN_VERSION; v--)
    if (mask & (1 << v)) return v;
  snprintf(err, errlen, "%s exports no ncclNetPlugin_v8..v12 table", o->plugin);
  return -1;
}

int rank_open(rank_t* r, net_t* n, const char* path, int version, hprops_t* p, char* why, size_t whylen) {
  /* NCCLNET_HARNESS_PLUGIN_RANK0 / _RANK1: that rank loads this library
   * instead of --plugin, so two builds meet as on a cluster mid-upgrade
   * (docs/configuration.md). */
  const char* alt = getenv(r->rank == 0 ? "NCCLNET_HARNESS_PLUGIN_RANK0" : "NCCLNET_HARNESS_PLUGIN_RANK1");
  if (alt != NULL && *alt) path = alt;
  set_where(r, "loading the plugin");
  if (net_load(n, path, version, why, whylen) != 0) return -1;
  const char* miss = net_missing_entry(n);
  if (*miss) {
    snprintf(why, whylen, "ncclNetPlugin_v%d.%s is NULL", version, miss);
    return -1;
  }
  set_where(r, "init");
  ncclResult_t res = net_init(n, &n->ctx, 0x4242 + (uint64_t)r->rank, false);
  if (res != ncclSuccess) {
    snprintf(why, whylen, "init returned %s", result_str(res));
    return -1;
  }
  int nd = 0;
  if ((res = net_devices(n, &nd)) != ncclSuccess || nd <= 0) {
    snprintf(why, whylen, "devices returned %s with %d devices", result_str(res), nd);
    return -1;
  }
  if ((res = net_props(n, 0, p)) != ncclSuccess) {
    snprintf(why, whylen, "getProperties(0) returned %s", result_str(res));
    return -1;
  }
  return 0;
}

void rank_close(net_t* n) {
  if (n->table) net_finalize(n, n->ctx);
}

ncclResult_t post_one(rank_t* r, net_t* n, bool send, void* comm, void* buf, size_t size, int tag, void* mh,
                      void** req) {
  for (;;) {
    *req = (void*)0x1;
    ncclResult_t res;
    if (send) {
      res = net_isend(n, comm, buf, size, tag, mh, NULL, req);
    } else {
      void* data[1] = {buf};
      size_t sz[1] = {size};
      int tags[1] = {tag};
      void* mhs[1] = {mh};
      res = net_irecv(n, comm, 1, data, sz, tags, mhs, NULL, req);
    }
    if (res != ncclSuccess) return res;
    if (*req == (void*)0x1) return ncclInternalError; /* the plugin ignored *request */
    if (*req != NULL) return ncclSuccess;
    if (past_deadline(r)) return ncclInProgress;
    sched_yield();
  }
}

int wait_one(rank_t* r, net_t* n, void* req, int* size, char* why, size_t whylen) {
  int done = 0;
  while (!done) {
    ncclResult_t res = net_test(n, req, &done, size);
    if (res != ncclSuccess) {
      char w[300];
      harness_last_warn(w, sizeof w);
      snprintf(why, whylen, "test returned %s%s%s", result_str(res), w[0] ? "; last WARN: " : "", w);
      return -1;
    }
    if (!done && past_deadline(r)) {
      snprintf(why, whylen, "a request did not complete before the deadline");
      return -1;
    }
  }
  return 0;
}
